"""The one way kvpatch writes files: atomically, through symlinks, never half-written.

``write_atomic`` writes a temporary file beside the *resolved* target and renames it
over the target, so a symlinked file is updated where it really lives (the link stays
a link) and a reader never sees a partial file; on any failure the old file is left as
it was and the temporary file is removed. A path that names a device, pipe or socket
(``/dev/stdout``, ``/dev/null``) is written in place: there is nothing to replace, and
renaming over it would clobber the device node; a FIFO nobody reads fails after
:data:`FIFO_WAIT` seconds instead of blocking forever. ``write_if_different`` skips the write
when the content is already there (build inputs keep their mtimes). Reading: :mod:`.reading`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import signal
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterable, Iterator


def resolve_target(path: Path) -> Path:
    """Where a write to ``path`` lands: symlinks (also dangling ones) followed."""
    return Path(os.path.realpath(path))


def open_descriptor(path: str | os.PathLike[str]) -> int | None:
    """The descriptor a path names when it names one of this process's open streams
    (``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``, ``/proc/self/fd/N``), else None. Such a
    path resolves to whatever the stream was redirected to, often a regular file (a log
    opened for appending): it must be written through the descriptor, never replaced."""
    text = os.path.normpath(os.fspath(path))
    named = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}.get(text)
    if named is not None:
        return named
    for prefix in ("/dev/fd/", "/proc/self/fd/", f"/proc/{os.getpid()}/fd/"):
        if text.startswith(prefix) and text[len(prefix) :].isdigit():
            return int(text[len(prefix) :])
    return None


def _in_place(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is written in place rather than replaced: one of this process's
    streams (:func:`open_descriptor`), or an existing device, pipe or socket."""
    if open_descriptor(path) is not None:
        return True
    try:
        mode = os.stat(path).st_mode  # follows symlinks
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def write_atomic(path: str | os.PathLike[str], data: str | bytes, *, mode: int | None = None) -> Path:
    """Replace the file at ``path`` with ``data`` in one rename; returns the file written.

    ``str`` is written as UTF-8 with newlines untouched. A new file gets ``mode`` or the
    umask's default permissions; an existing one keeps its permissions. Raises
    ``OSError`` (the old file intact) and ``IsADirectoryError`` for a directory.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd = open_descriptor(path)
    if fd is not None:  # /dev/stdout of `cmd -o /dev/stdout >> log`: write to the stream, do not replace the log
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view) :]
        return Path(path)
    if _in_place(path):
        _write_in_place(path, raw)
        return Path(path)
    staged = stage(path, raw, mode=mode)
    try:
        return staged.commit()
    finally:
        staged.discard()


def write_own(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """One of kvpatch's own files (a cache's records, a build's sources and logs) replaced in one
    rename by ``data``, whatever is at ``path``: a link, a FIFO or a device planted there is
    replaced, never written through (it must not aim kvpatch's writes at a file it did not write,
    or hang one). The umask's permissions."""
    staged = stage(path, data, follow=False)
    try:
        return staged.commit()
    finally:
        staged.discard()


#: How long an output that is a FIFO waits for a reader (``kvpatch diff -o pipe`` started
#: before the ``cat pipe`` that reads it) before failing, rather than blocking forever.
FIFO_WAIT = 30.0


def _write_in_place(path: str | os.PathLike[str], raw: bytes) -> None:
    """Write to a device or FIFO as it is. Opened non-blocking: a FIFO without a reader is
    retried until :data:`FIFO_WAIT` runs out, then an OSError (ENXIO) says so; writing
    then blocks as a pipe does (a reader that goes away is a BrokenPipeError)."""
    deadline = time.monotonic() + FIFO_WAIT
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    while True:
        try:
            fd = os.open(path, flags)
            break
        except OSError as e:
            fifo = e.errno == errno.ENXIO and stat.S_ISFIFO(os.stat(path).st_mode)
            if not fifo:
                raise
            if time.monotonic() >= deadline:
                raise OSError(
                    errno.ENXIO, f"no process reads the FIFO (waited {FIFO_WAIT:g} s)", os.fspath(path)
                ) from None
            time.sleep(0.05)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view) :]
    except OSError as e:
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror, os.fspath(path)) from None  # said with the path, as elsewhere
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- writing in two steps


#: The signals that stop kvpatch (Ctrl-C, ``kill``, a closed terminal): held back while files
#: that change together are renamed into place.
STOPPING = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


#: The stopping signal this process received, as its handler noted it (:func:`note_stop`): the
#: exception a handler raises is lost where it lands in a ctypes callback or a finalizer
#: (libclang's AST walk calls back into Python), and the work would go on as if none came.
_STOPPED: list[int] = []


def note_stop(signum: int) -> None:
    """Record that a stopping signal came (its handler calls this before it raises)."""
    if not _STOPPED:
        _STOPPED.append(signum)


def stop_noted() -> int | None:
    """The stopping signal recorded by :func:`note_stop`, if one came."""
    return _STOPPED[0] if _STOPPED else None


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Run the block with :data:`STOPPING` signals noted, not acted on; the first one noted is
    raised again when it ends (its handler runs then: Ctrl-C's KeyboardInterrupt, a SIGTERM's
    exit). For renames that must all happen or none: an interrupt between two of them would
    leave the files out of step. A stop that came earlier and whose exception was lost
    (:func:`stop_noted`) stops the block before it starts: nothing is renamed. Python runs
    signal handlers in the main thread only, so elsewhere the block runs as it is."""
    if stop_noted() is not None:
        raise KeyboardInterrupt(f"signal {stop_noted()} came earlier")
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: noted.append(signum)) for s in STOPPING}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if noted:
            signal.raise_signal(noted[0])


class Staged:
    """A file written beside its target, not yet renamed over it (see :func:`stage`)."""

    def __init__(self, tmp: Path, target: Path) -> None:
        self.tmp, self.target = tmp, target

    def commit(self) -> Path:
        """Rename the staged file over the target (one rename: it cannot run out of space)."""
        os.replace(self.tmp, self.target)
        return self.target

    def discard(self) -> None:
        """Remove the staged file if it was not committed."""
        Path(self.tmp).unlink(missing_ok=True)


def stage(path: str | os.PathLike[str], data: str | bytes, *, mode: int | None = None,
          follow: bool = True) -> Staged:  # fmt: skip
    """The first half of :func:`write_atomic`: ``data`` written and synced to a temporary
    file beside the resolved target, renamed over it only by :meth:`Staged.commit`.
    ``follow=False``: a symlink at ``path`` is replaced, never written through (kvpatch's
    own files: a link planted there must not aim kvpatch's writes at another file).

    Lets a caller write two files as one step: stage the second, write the first,
    commit the second; a full disk fails while staging, before anything changed.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    target = resolve_target(Path(path)) if follow else resolve_target(Path(path).parent) / Path(path).name
    try:  # what is there now, the entry itself: with follow=False a link's target is none of kvpatch's business
        old: os.stat_result | None = os.stat(target, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        old = None
    if old is not None and stat.S_ISDIR(old.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        if old is not None and stat.S_ISREG(old.st_mode):  # the file replaced keeps its permissions and owner
            os.chmod(tmp, old.st_mode & 0o7777)
            if os.geteuid() == 0 and (old.st_uid, old.st_gid) != (0, 0):  # root keeps the owner
                os.chown(tmp, old.st_uid, old.st_gid)
        else:  # a new file, or a link (follow=False) or device replaced: kvpatch's own permissions
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, (0o666 if mode is None else mode) & ~umask)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Staged(Path(tmp), target)


#: A temporary file of :func:`stage` older than this (seconds) belongs to no live writer:
#: staging takes milliseconds, so a concurrent writer's is always younger.
STALE_AFTER = 10.0
#: The names :func:`stage` gives (``tempfile.mkstemp``: 8 of ``[a-z0-9_]``).
_TEMP_NAME = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")


def is_temp_name(filename: str, name: str | None = None) -> bool:
    """Whether ``filename`` is a temporary file :func:`stage` writes (for target ``name``)."""
    match = _TEMP_NAME.fullmatch(filename)
    return match is not None and (name is None or match["name"] == name)


def remove_stale_temps(folder: str | os.PathLike[str], names: Iterable[str] | None = None, *,
                       older_than: float | None = None) -> list[Path]:  # fmt: skip
    """Remove what killed writes left in ``folder``: regular files named as :func:`stage`
    names them (for one of ``names``; None: for any name) and older than ``older_than``
    seconds (default :data:`STALE_AFTER`). Nothing else is touched, symlinks and
    directories of such names included. Idempotent and safe to run concurrently: a file
    already gone is skipped. Returns what was removed."""
    limit = time.time() - (STALE_AFTER if older_than is None else older_than)
    wanted = None if names is None else set(names)
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP_NAME.fullmatch(entry.name)
        if match is None or (wanted is not None and match["name"] not in wanted):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_mtime > limit:
                continue
            os.unlink(entry.path)
        except FileNotFoundError:
            continue
        except OSError:
            continue  # not ours to remove after all (permissions): left as it is
        removed.append(Path(entry.path))
    return sorted(removed)


def write_if_different(path: str | os.PathLike[str], data: str | bytes) -> bool:
    """:func:`write_own` unless the file already holds ``data``; True when written. What is there
    is read only where it is a regular file of ``data``'s size (a FIFO or a device is not read)."""
    from .reading import read_regular

    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        there = os.stat(path, follow_symlinks=False)
        if stat.S_ISREG(there.st_mode) and there.st_size == len(raw) and read_regular(path, limit=len(raw)) == raw:
            return False
    except OSError:
        pass
    write_own(path, raw)
    return True


def write_both(first: str | os.PathLike[str], first_data: str | bytes,
               second: str | os.PathLike[str], second_data: str | bytes) -> None:  # fmt: skip
    """Write two files as one step: both are staged (a full disk fails here, before anything
    changed), then renamed into place, the first first, with Ctrl-C and SIGTERM held back
    between (:func:`deferred_signals`). A device or pipe (``/dev/null``) is written in place,
    as :func:`write_atomic` does."""
    if _in_place(second):
        write_atomic(first, first_data)
        write_atomic(second, second_data)
        return
    staged = stage(second, second_data)
    first_staged = None
    try:
        if _in_place(first):  # a stream: written as it is, not one of two renames
            write_atomic(first, first_data)
            staged.commit()
        else:
            first_staged = stage(first, first_data)
            with deferred_signals():  # both renames, or an interrupt before either
                first_staged.commit()
                staged.commit()
    finally:
        staged.discard()
        if first_staged is not None:
            first_staged.discard()
