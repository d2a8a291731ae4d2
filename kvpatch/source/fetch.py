"""Obtain a vLLM release's source tree, cached on disk.

The finished tree for release ``X`` lives at ``<cache>/releases/vX/``; it is a
git work tree whose HEAD is a single commit tagged ``vX``.  It is published
atomically: built in a temporary directory beside it, renamed into place, and
only then marked complete by ``<cache>/releases/vX.complete``.  A tree without
its marker is a leftover of a crash and is rebuilt.

Two sources are tried, in order:

1. a shallow ``git clone`` of the release tag from the remote (GitHub by
   default), bounded by a timeout;
2. the source distribution ``vllm-X.tar.gz`` from the package index pip is
   configured for (``PIP_INDEX_URL``, then ``pip config``, else PyPI), verified
   against the sha256 the index publishes, unpacked and committed into a fresh
   repository.

Nothing here does I/O at import time.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from rich.console import Console
from rich.markup import escape

from ..errors import FetchError, KvpatchError
from ..fsutil import hold_lock, machine_problem, problem_in_text, read_regular, write_own
from . import git as gitcmd
from .cache import RELEASES_DIR, cache_root
from .cache import absolute as _absolute
from .releases import HEADER, LAST, SUPPORTED, carries_header, normalize_version, release_tag, release_tuple
from .repo import _clone, _git_reason, _make_repo, git_executable, require_git  # noqa: F401
from .sdist import _download, _find_sdist, _redact
from .unpack import _unpack

DEFAULT_REMOTE = "https://github.com/vllm-project/vllm.git"

DEFAULT_INDEX = "https://pypi.org/simple"


def _unsupported(version: str) -> FetchError:
    """A version outside the releases that carry the header (nothing was fetched: whether it
    exists at all is not known here, so the message does not claim it does)."""
    where = "after" if release_tuple(version)[:3] > LAST else "before"
    return FetchError(f"vLLM {version} is {where} the releases that carry {HEADER}; {SUPPORTED}")


# --------------------------------------------------------------------------- cache


def check_release(version: str) -> None:
    """Refuse, before any I/O, a release outside the range that carries the header."""
    if not carries_header(version):
        raise _unsupported(version)


def fetch_release(
    version: str,
    *,
    remote: str = DEFAULT_REMOTE,
    cache: Path | None = None,
    console: Console | None = None,
    git_timeout: float = 60,
) -> Path:
    """Return a git work tree of vLLM ``version`` whose HEAD is tagged ``release_tag(version)``.

    A complete cached tree is returned without any network I/O.  Otherwise the
    release is fetched (git first, then the sdist), published into the cache
    atomically under a file lock, and returned.  Raises :class:`FetchError` for
    unknown or unsupported releases and when nothing can be reached; a release
    outside FIRST..LAST is refused before any I/O, and a release in that range
    found without the header is remembered (``vX.noheader``) and refused from then on
    without I/O, when a canonical source said so (:func:`_remembered`): kvpatch's
    default remote, or the package index pip is configured for (then only while pip is
    configured for that index). A ``remote`` of the caller's choosing is never
    remembered. The refusal names the record's file.
    """
    version = normalize_version(version)
    check_release(version)
    console = console if console is not None else Console(stderr=True)
    tag = release_tag(version)
    releases = (_absolute(Path(cache), "the cache") if cache is not None else cache_root()) / RELEASES_DIR
    final = releases / tag
    marker = releases / f"{tag}.complete"
    noheader = releases / f"{tag}.noheader"
    earlier = _remembered(noheader)
    if earlier is not None:
        raise _no_header(version, f"found by an earlier fetch: {earlier}", noheader)
    if _cached(final, marker, tag):
        return final

    try:
        releases.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _unwritable(releases, tag, e) from None
    # One lock for the whole release cache: fetches of different releases wait for
    # each other, and no lock file is left per release (or per mistyped version).
    with _locked(releases / ".lock", tag, console):
        earlier = _remembered(noheader)
        if earlier is not None:
            raise _no_header(version, f"found by an earlier fetch: {earlier}", noheader)
        noheader.unlink(missing_ok=True)  # another source's verdict: this one is asked
        if _cached(final, marker, tag, console):  # another process finished it meanwhile
            return final
        _remove_leftovers(releases, tag)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{tag}-", dir=releases))
        try:
            tree = tmp / "tree"
            origin = _obtain(version, tree, tmp, remote=remote, console=console, git_timeout=git_timeout)
            if not (tree / HEADER).is_file():
                if origin.kind == "git" and not _default_remote(origin.source):
                    raise _no_header(version, f"in {origin}; not remembered: {_redact(origin.source)} is not "
                                              f"kvpatch's default remote {DEFAULT_REMOTE}")  # fmt: skip
                # Remembered: the next apply of this release is refused without a download.
                write_own(noheader, f"{origin}\nsource {origin.kind} {_redact(origin.source)}\n")
                raise _no_header(version, str(origin), noheader)
            os.replace(tree, final)
            write_own(marker, f"{origin}\ntag {_tag_ref(final, tag) or '-'}\n")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


class _Origin(str):
    """The line describing where a release came from, and which source that was:
    ``kind`` "git" (``source`` the remote) or "index" (``source`` the index URL)."""

    kind: str
    source: str

    def __new__(cls, line: str, kind: str, source: str) -> _Origin:
        self = super().__new__(cls, line)
        self.kind, self.source = kind, source
        return self


def _default_remote(remote: str) -> bool:
    return remote.rstrip("/").removesuffix(".git") == DEFAULT_REMOTE.rstrip("/").removesuffix(".git")


def _no_header(version: str, where: str, record: Path | None = None) -> FetchError:
    remembered = f"; remembered in {record}: delete that file to fetch v{version} again" if record else ""
    return FetchError(f"vLLM {version} has no {HEADER} ({where}); {SUPPORTED}{remembered}")


def _remembered(record: Path) -> str | None:
    """What a ``vX.noheader`` record says, if it still counts: written from kvpatch's default
    remote, or from the index pip is configured for now. A record of another index, or of
    a remote of the user's choosing (which an older kvpatch wrote), does not count; nor
    does one that cannot be read (the next fetch replaces it)."""
    try:
        lines = read_regular(record, limit=1 << 16).decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    origin = lines[0] if lines else ""
    source = next((line[len("source ") :] for line in lines if line.startswith("source ")), None)
    if source is None:  # an older kvpatch's record: its line names the source
        kind, _, rest = origin.partition(" ")
        where = rest.split(" ")[0]
        ok = (kind == "git" and _default_remote(where)) or \
             (kind == "sdist" and where.startswith("https://files.pythonhosted.org/"))  # fmt: skip
        return origin if ok else None
    kind, _, where = source.partition(" ")
    if kind == "git":
        return origin if _default_remote(where) else None
    if kind == "index":
        return origin if where == _redact(_index_url()) else None
    return None


def _tag_ref(tree: Path, tag: str) -> str | None:
    """What ``refs/tags/<tag>`` of the repository at ``tree`` points to (read without git)."""
    gitdir = tree / ".git"
    try:
        return read_regular(gitdir / "refs" / "tags" / tag, limit=4096).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        pass
    try:
        for line in read_regular(gitdir / "packed-refs").decode("utf-8").splitlines():
            sha, _, ref = line.partition(" ")
            if ref.strip() == f"refs/tags/{tag}":
                return sha
    except (OSError, UnicodeDecodeError):
        pass
    return None


def _cached(final: Path, marker: Path, tag: str, console: Console | None = None) -> bool:
    """Whether a complete, unchanged tree of ``tag`` is in the cache.

    A tree whose tag no longer points where it did when it was fetched (recorded in
    the marker) is not: under the lock (``console`` given) it is removed, saying so,
    and fetched again.
    """
    if not (marker.is_file() and final.is_dir()):
        return False
    try:
        recorded = next((line[4:].strip() for line in read_regular(marker, limit=1 << 16).decode("utf-8").splitlines()
                         if line.startswith("tag ")), None)  # fmt: skip
    except (OSError, UnicodeDecodeError):
        recorded = None
    now = _tag_ref(final, tag)
    if recorded in (None, "-") or recorded == now:
        return True
    if console is not None:
        console.print(f"the cached {tag} in {escape(str(final))} changed (tag {tag} moved from "
                      f"{recorded[:12]} to {(now or 'nowhere')[:12]}); fetching it again", soft_wrap=True)  # fmt: skip
        marker.unlink(missing_ok=True)
        shutil.rmtree(final, ignore_errors=True)
    return False


@contextlib.contextmanager
def _locked(path: Path, tag: str, console: Console) -> Iterator[None]:
    """Hold an inter-process lock on ``path``, saying so if we have to wait for it; a lock file
    that cannot be made is :func:`_unwritable`'s error (only the taking, not the body)."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(hold_lock(path, what="the release cache", on_wait=lambda: console.print(
                f"waiting for another kvpatch process fetching a release into the cache (for {tag}) ...")))  # fmt: skip
        except OSError as e:
            raise _unwritable(path.parent, tag, e) from None
        yield


def _unwritable(releases: Path, tag: str, e: OSError) -> Exception:
    """The error for a release cache this user cannot write (a shared, read-only or another
    user's one) that does not hold ``tag`` complete: what is wrong and what to do."""
    full = machine_problem(e, doing=f"fetching {tag} into the cache")
    if full is not None or e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
        return full or e
    try:
        owner = f", owned by uid {os.stat(releases).st_uid}" if os.stat(releases).st_uid != os.geteuid() else ""
    except OSError:
        owner = ""
    return KvpatchError(f"the release cache {releases} does not hold {tag} and this user cannot write to it "
                        f"({e.strerror or e}{owner}): fetch {tag} once as the cache's owner, or set KVPATCH_CACHE "
                        "to a cache of your own")  # fmt: skip


def _remove_leftovers(releases: Path, tag: str) -> None:
    """Delete what killed fetches left behind (we hold the cache's lock, so it is stale)."""
    for stale in releases.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    entry = releases / tag
    if entry.is_symlink() or (entry.exists() and not entry.is_dir()):  # a file or a link where the tree
        entry.unlink()  # goes (the entry damaged, not a tree): removed itself, never what a link names
    elif entry.exists():  # renamed into place but never marked complete
        shutil.rmtree(entry, ignore_errors=True)


def _obtain(version: str, tree: Path, tmp: Path, *, remote: str, console: Console, git_timeout: float) -> _Origin:
    """Fill ``tree`` with the release via git, else the sdist; return a line describing the source."""
    tag = release_tag(version)
    require_git(f"fetching vLLM {version}")
    try:
        _clone(remote, tag, tree, timeout=git_timeout)
        return _Origin(f"git {_redact(remote)} {tag}", "git", remote)
    except (gitcmd.GitFailed, OSError, ValueError) as exc:
        git_reason = _git_reason(exc, git_timeout)
        shutil.rmtree(tree, ignore_errors=True)
        full = _machine(exc, tree, f"cloning {tag}")
        if full is not None:  # a full disk, a path too long: the sdist would fail the same way
            raise full from None
    index = _index_url()
    console.print(
        f"git clone of {tag} from {escape(_redact(remote))} failed ({escape(git_reason)}); "
        f"falling back to the source distribution on {escape(_redact(index))}",
        soft_wrap=True,
    )
    sdist = _find_sdist(index, version, git_reason=git_reason)
    archive = tmp / sdist.filename
    _download(sdist, archive, console)
    mtime = _unpack(archive, f"vllm-{version}", tree)
    archive.unlink()
    try:
        _make_repo(tree, version, date=mtime)
    except (gitcmd.GitFailed, OSError) as exc:
        full = _machine(exc, tree, f"committing {sdist.filename} into the cache")
        if full is not None:
            raise full from None
        why = exc.reason() if isinstance(exc, gitcmd.GitFailed) else (getattr(exc, "strerror", None) or str(exc))
        raise FetchError(f"cannot commit the unpacked {sdist.filename} into the cache: git said {why}") from None
    return _Origin(f"sdist {_redact(sdist.url)} sha256={sdist.sha256}", "index", index)


def _machine(exc: BaseException, path: Path, doing: str) -> Exception | None:
    """A full disk or a path too long behind a failed git command or file operation, else None."""
    if isinstance(exc, gitcmd.GitFailed):
        return problem_in_text(exc.stderr, path, doing=doing)
    return machine_problem(exc, doing=doing)


# --------------------------------------------------------------------------- package index


def _index_url() -> str:
    """The index pip would install from: ``PIP_INDEX_URL``, then ``pip config``, else PyPI."""
    env = os.environ.get("PIP_INDEX_URL", "").strip()
    if env:
        return env.rstrip("/")
    config = _pip_config()
    for key in (":env:.index-url", "install.index-url", "global.index-url"):
        if config.get(key):
            return config[key].split()[0].rstrip("/")
    return DEFAULT_INDEX


def _pip_config() -> dict[str, str]:
    """``pip config list`` as a dict (``{}`` when pip is missing or fails)."""
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    if result.returncode != 0:
        return {}
    config: dict[str, str] = {}
    for line in result.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            config[key.strip()] = value
    return config
