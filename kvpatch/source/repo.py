"""kvpatch's own repositories of a release: a shallow clone of its tag, or one commit made
from its source distribution; every git command through :mod:`.git` (none of the caller's
git environment or configuration, no hooks, no template)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..errors import BuildError
from . import git as gitcmd
from .releases import release_tag

_IDENTITY = ("kvpatch", "kvpatch@localhost")


def git_executable() -> str | None:
    """The git kvpatch runs (``$GIT_PYTHON_GIT_EXECUTABLE``, as GitPython chose it, else PATH)."""
    return shutil.which(os.environ.get("GIT_PYTHON_GIT_EXECUTABLE") or "git")


def require_git(why: str) -> str:
    """The git executable; exit 5 naming git when there is none."""
    found = git_executable()
    if found is None:
        raise BuildError(f"git not found on PATH: {why} needs it (install git)")
    return found


def _clone(remote: str, tag: str, dest: Path, *, timeout: float) -> None:
    """Shallow-clone ``tag`` of ``remote`` into ``dest`` (killed after ``timeout`` s); tag HEAD.

    Run as every git command on kvpatch's repositories is (:mod:`.git`): none of the
    caller's git environment or configuration, no hooks, no template.
    """
    exe = require_git("git clone")
    gitcmd.check_remote(remote)  # ext::, fd::, other remote helpers, options
    gitcmd.run(gitcmd.own(exe, "clone", "--quiet", "--template=", "--depth=1", "--single-branch", "--branch", tag,
                          "--", remote, dest),
               env=gitcmd.own_env(network=True), timeout=timeout)  # fmt: skip
    env = gitcmd.own_env()
    gitdir = dest / ".git"
    head = gitcmd.run(gitcmd.own(exe, "rev-parse", "--verify", "HEAD^{commit}", git_dir=gitdir), env=env).strip()
    try:
        tagged = gitcmd.run(gitcmd.own(exe, "rev-parse", "-q", "--verify", f"refs/tags/{tag}^{{commit}}",
                                       git_dir=gitdir), env=env).strip()  # fmt: skip
    except gitcmd.GitFailed:
        tagged = b""
    if tagged != head:
        gitcmd.run(gitcmd.own(exe, "tag", "-f", tag, head.decode(), git_dir=gitdir), env=env)


def _git_reason(exc: BaseException, timeout: float | None = None) -> str:
    """A short, one-line reason for a failed clone."""
    if isinstance(exc, gitcmd.GitFailed):
        if exc.timed_out:
            return f"timed out after {timeout:g} s" if timeout is not None else "timed out"
        return exc.reason()
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return reason if len(reason) <= 160 else reason[:157] + "..."


def _make_repo(tree: Path, version: str, *, date: int) -> None:
    """Turn ``tree`` into a repository with one commit of every file, tagged ``v<version>``.

    Independent of the user's git environment and configuration (:mod:`.git`):
    identity and dates set here, hooks, signing and templates off, the repository named
    explicitly. ``date`` (from the sdist) makes the commit id the same on every machine.
    The tree's own ``.gitattributes`` cannot change what is committed (filters, eol,
    ident, encodings): ``.git/info/attributes`` outranks it.
    """
    name, email = _IDENTITY
    tree = tree.absolute()
    # git refuses dates before 1970 or after 2099: an absurd member mtime must not stop the commit
    stamp = f"@{min(max(int(date), 0), 4_102_444_799)} +0000"
    exe = require_git("unpacking a source distribution")
    env = gitcmd.own_env(extra={
        "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email,
        "GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp,
    })  # fmt: skip
    gitdir = tree / ".git"
    gitcmd.run(gitcmd.own(exe, "init", "--quiet", "--template=", tree), env=env)
    (gitdir / "info").mkdir(exist_ok=True)
    (gitdir / "info" / "attributes").write_text("* -text -filter -ident -working-tree-encoding -export-subst\n")
    repo = {"git_dir": gitdir, "work_tree": tree}
    # --force: the sdist's own .gitignore must not drop files
    gitcmd.run(gitcmd.own(exe, "add", "-A", "--force", "--", ".", **repo), env=env, cwd=tree)
    gitcmd.run(gitcmd.own(exe, "commit", "--quiet", "--no-verify", "-m", f"vLLM {version} (source distribution)",
                          **repo), env=env, cwd=tree)  # fmt: skip
    gitcmd.run(gitcmd.own(exe, "tag", release_tag(version), git_dir=gitdir), env=env)
