"""Every git command kvpatch runs: its argv and its environment, built here and nowhere else.

Two kinds of repository, two recipes:

* **kvpatch's own** (the release cache, the clone of a remote, a workspace's checkout
  under ``.kvpatch/``): :func:`own_env` and :func:`own`. None of the caller's git
  environment and none of the global or system configuration reach git
  (``GIT_CONFIG_GLOBAL=/dev/null``, ``GIT_CONFIG_NOSYSTEM=1``, needs git 2.32 or newer),
  and :data:`OWN_CONFIG` turns off on the command line (which outranks every config
  file, the repository's own included) what could run a program or change bytes:
  hooks, fsmonitor, autocrlf, signing, automatic maintenance, protocols other than
  https/http/ssh/git/file. ``git init`` and ``git clone`` get ``--template=``: no hooks
  directory is copied in.
* **a user's tree** (``--tree``): :func:`user_env` and :func:`user`. Read with the
  user's own configuration (their ``safe.directory``, ``core.autocrlf``), minus hooks
  and fsmonitor, which a read never needs.

In both, every ``GIT_*`` variable of the caller is dropped: a git hook runs with
``GIT_DIR``, ``GIT_WORK_TREE``, ``GIT_INDEX_FILE`` ... set, and each would point
kvpatch's commands at the user's repository (the sdist's files committed there, a tag
created there). kvpatch then sets only its own. Kept: for a user's tree, the three
variables that choose the user's configuration files (``GIT_CONFIG_GLOBAL``,
``GIT_CONFIG_SYSTEM``, ``GIT_CONFIG_NOSYSTEM``); for a clone over the network, the
transport's certificate and ssh settings (:data:`NETWORK_KEPT`). ``SSH_ASKPASS`` is
dropped with them: nothing may prompt (``GIT_TERMINAL_PROMPT=0``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Mapping, Sequence

from ..errors import BuildError

#: ``-c`` options of every command on kvpatch's own repositories.
OWN_CONFIG: tuple[str, ...] = (
    f"core.hooksPath={os.devnull}",
    "core.fsmonitor=false",
    "core.autocrlf=false",
    "core.safecrlf=false",
    "core.untrackedCache=false",
    "commit.gpgsign=false",
    "tag.gpgsign=false",
    "tag.forceSignAnnotated=false",
    "gc.auto=0",
    "maintenance.auto=false",
    "submodule.recurse=false",
    "advice.detachedHead=false",
    "init.defaultBranch=main",
    "protocol.allow=never",
    "protocol.https.allow=always",
    "protocol.http.allow=always",
    "protocol.ssh.allow=always",
    "protocol.git.allow=always",
    "protocol.file.allow=always",
)

#: ``-c`` options of the reads of a user's tree: nothing else of theirs is overridden.
USER_CONFIG: tuple[str, ...] = (f"core.hooksPath={os.devnull}", "core.fsmonitor=false")

#: The caller's variables a user's tree is read with: which configuration files are theirs.
USER_KEPT = frozenset({"GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM"})

#: The caller's variables a clone over the network keeps: how to reach the remote.
NETWORK_KEPT = frozenset({"GIT_SSL_CAINFO", "GIT_SSL_CAPATH", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSH_VARIANT"})

#: Dropped besides ``GIT_*``: a program git would run to ask for a password.
_ALSO_DROPPED = frozenset({"SSH_ASKPASS"})

_BASE = {"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", "LANGUAGE": "C"}


def _without_git(keep: frozenset[str] = frozenset(), base: Mapping[str, str] | None = None) -> dict[str, str]:
    source = os.environ if base is None else base
    return {k: v for k, v in source.items()
            if (not k.upper().startswith("GIT_") or k in keep) and k not in _ALSO_DROPPED}  # fmt: skip


def own_env(*, network: bool = False, extra: Mapping[str, str] | None = None,
            base: Mapping[str, str] | None = None) -> dict[str, str]:  # fmt: skip
    """The environment of a git command on one of kvpatch's own repositories (``network``:
    a clone from a remote, which keeps :data:`NETWORK_KEPT`); ``extra`` is kvpatch's own
    (identity, dates)."""
    env = _without_git(NETWORK_KEPT if network else frozenset(), base)
    env.update(_BASE, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    env.update(extra or {})
    return env


def user_env(*, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a read of a user's tree: their configuration files, no leaked
    repository (``GIT_DIR``, ``GIT_WORK_TREE``, ``GIT_INDEX_FILE``, ...)."""
    env = _without_git(USER_KEPT, base)
    env.update(_BASE)
    return env


def _options(config: Sequence[str]) -> list[str]:
    return [arg for option in config for arg in ("-c", option)]


def own(git: str, *args: str | os.PathLike[str], git_dir: Path | None = None,
        work_tree: Path | None = None) -> list[str]:  # fmt: skip
    """argv of ``git <args>`` on one of kvpatch's repositories; ``git_dir`` (and
    ``work_tree``) name it explicitly, so git never searches for one."""
    located = ([f"--git-dir={git_dir}"] if git_dir is not None else []) + \
              ([f"--work-tree={work_tree}"] if work_tree is not None else [])  # fmt: skip
    return [git, *_options(OWN_CONFIG), *located, *map(os.fspath, args)]


def user(git: str, root: Path, *args: str) -> list[str]:
    """argv of ``git -C <root> <args>`` on a user's tree."""
    return [git, *_options(USER_CONFIG), "-C", str(root), *args]


_HELPER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9+.-]*::")


def check_remote(remote: str) -> None:
    """Refuse (ValueError) a remote git would hand to a remote helper (``ext::<command>``
    runs a program, ``fd::``, any ``<helper>::``) or read as an option."""
    if _HELPER.match(remote):
        raise ValueError(f"remote helpers ({remote.split('::', 1)[0]}::) are not allowed")
    if remote.startswith("-"):
        raise ValueError("a remote cannot start with '-'")
    if "\0" in remote:
        raise ValueError("the remote holds a NUL character")


class GitFailed(BuildError):
    """A git command that exited non-zero (``status``) or ran out of time (``timed_out``): a tool
    that failed (exit 5) where no caller says more; its message is git's own reason."""

    def __init__(self, argv: Sequence[str], status: int | None, stderr: str, *, timed_out: bool = False) -> None:
        self.argv, self.status, self.stderr, self.timed_out = list(argv), status, stderr, timed_out
        super().__init__(self.reason())

    def reason(self) -> str:
        """The last line git printed, without its ``fatal:``; one line, at most 160 characters."""
        if self.timed_out:
            return "timed out"
        lines = [line.strip() for line in self.stderr.splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit status {self.status}"
        reason = re.sub(r"^(fatal|error):\s*", "", reason)
        reason = re.sub(r"^unable to access '[^']*':\s*", "", reason)
        return reason if len(reason) <= 160 else reason[:157] + "..."


def run(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | None = None,
        timeout: float | None = None) -> bytes:  # fmt: skip
    """Run git; its stdout. :class:`GitFailed` when it fails or times out (then it and the
    programs it started are killed: it runs in a process group of its own), OSError when
    it cannot start. Never reads stdin."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(env), cwd=cwd, process_group=0)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise GitFailed(argv, None, "", timed_out=True) from None
    except BaseException:  # Ctrl-C: git does not outlive kvpatch
        _kill(proc)
        raise
    if proc.returncode != 0:
        raise GitFailed(argv, proc.returncode, err.decode("utf-8", "replace"))
    return out


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
