"""The one way kvpatch writes files: atomically, through symlinks, never half-written.

``write_atomic`` writes a temporary file beside the *resolved* target and renames it
over the target, so a symlinked file is updated where it really lives (the link stays
a link) and a reader never sees a partial file; on any failure the old file is left as
it was and the temporary file is removed. A path that names a device, pipe or socket
(``/dev/stdout``, ``/dev/null``) is written in place: there is nothing to replace, and
renaming over it would clobber the device node; a FIFO nobody reads fails after
:data:`FIFO_WAIT` seconds instead of blocking forever. :func:`read_regular` reads an
input only if it is a regular file (a FIFO, socket or device could block or never end). ``write_if_different`` skips the write
when the content is already there (build inputs keep their mtimes).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import UsageError


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


# --------------------------------------------------------------------------- reading


#: The most :func:`read_regular` reads by default (a header is ~40 kB, a state file less).
READ_LIMIT = 64 << 20


class NotRegularFileError(OSError):
    """A path that names a FIFO, socket or device where a regular file is read; ``kind``
    says which ("a FIFO")."""

    def __init__(self, path: str | os.PathLike[str], kind: str) -> None:
        super().__init__(errno.EINVAL, f"is {kind}, not a regular file", os.fspath(path))
        self.kind = kind


class FileTooLargeError(OSError):
    """A file larger than the reader's limit."""

    def __init__(self, path: str | os.PathLike[str], size: int, limit: int) -> None:
        super().__init__(errno.EFBIG, f"is {size} bytes, more than the {limit} bytes kvpatch reads", os.fspath(path))
        self.size, self.limit = size, limit


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words: "a regular file", "a FIFO", "a directory" ..."""
    for test, kind in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symlink")):  # fmt: skip
        if test(mode):
            return kind
    return "not a file"


def stat_regular(path: str | os.PathLike[str]) -> os.stat_result:
    """``os.stat`` of the regular file at ``path`` (symlinks followed): an OSError where there is
    none (FileNotFoundError, ...), :class:`NotRegularFileError` for a directory, FIFO, socket or
    device (a library loaded from a FIFO blocks ``dlopen`` forever)."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(path, file_kind(st.st_mode))
    return st


def check_library_file(path: str | os.PathLike[str], what: str, missing: Callable[[str], Exception]) -> None:
    """``path`` names a regular file a library can be loaded from (``what`` names it): a directory,
    FIFO, socket or device is a one-line :class:`UsageError`; a missing or unreadable file raises
    ``missing(why)``, ``why`` being "no such file" or the system's reason (each caller says it its
    way: a usage error, or a library that cannot be loaded)."""
    try:
        stat_regular(path)
    except NotRegularFileError as e:
        raise UsageError(f"{what} {os.fspath(path)!r} is {e.kind}, not a library file") from None
    except (OSError, ValueError) as e:
        raise missing(
            "no such file" if isinstance(e, FileNotFoundError) else getattr(e, "strerror", None) or str(e)
        ) from None


def read_regular(path: str | os.PathLike[str], *, limit: int | None = None) -> bytes:
    """The bytes of the regular file at ``path``; see :func:`read_regular_with_stat`."""
    return read_regular_with_stat(path, limit=limit)[0]


def read_regular_with_stat(path: str | os.PathLike[str], *, limit: int | None = None) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file at ``path`` (symlinks followed), never blocking, and
    its ``fstat`` (the file those bytes came from: device, inode, mtime).

    Anything else is refused before it is opened for reading: FileNotFoundError,
    IsADirectoryError, :class:`NotRegularFileError` (FIFO, socket, device: reading
    could block forever or never end), :class:`FileTooLargeError` beyond ``limit``
    (default :data:`READ_LIMIT`). It is opened non-blocking and checked again on the
    descriptor, so a file swapped for a FIFO in between cannot block either.
    """
    limit = READ_LIMIT if limit is None else limit
    mode = os.stat(path).st_mode
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", os.fspath(path))
    if not stat.S_ISREG(mode):
        raise NotRegularFileError(path, file_kind(mode))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(path, file_kind(st.st_mode))
        if st.st_size > limit:
            raise FileTooLargeError(path, st.st_size, limit)
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # grew while read
                raise FileTooLargeError(path, size, limit)
        return b"".join(chunks), st
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- writing in two steps


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


def stage(path: str | os.PathLike[str], data: str | bytes, *, mode: int | None = None) -> Staged:
    """The first half of :func:`write_atomic`: ``data`` written and synced to a temporary
    file beside the resolved target, renamed over it only by :meth:`Staged.commit`.

    Lets a caller write two files as one step: stage the second, write the first,
    commit the second; a full disk fails while staging, before anything changed.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    target = resolve_target(Path(path))
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        if target.exists():
            old = target.stat()
            os.chmod(tmp, old.st_mode & 0o7777)
            if os.geteuid() == 0 and (old.st_uid, old.st_gid) != (0, 0):  # root keeps the owner
                os.chown(tmp, old.st_uid, old.st_gid)
        else:
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
    """:func:`write_atomic` unless the file already holds ``data``; True when written."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        if Path(path).read_bytes() == raw:
            return False
    except OSError:
        pass
    write_atomic(path, raw)
    return True


def write_both(first: str | os.PathLike[str], first_data: str | bytes,
               second: str | os.PathLike[str], second_data: str | bytes) -> None:  # fmt: skip
    """Write two files as one step: the second is staged (a full disk fails here, before
    anything changed), the first written, then the second renamed into place. A device
    or pipe (``/dev/null``) is written in place, as :func:`write_atomic` does."""
    if _in_place(second):
        write_atomic(first, first_data)
        write_atomic(second, second_data)
        return
    staged = stage(second, second_data)
    try:
        write_atomic(first, first_data)
        staged.commit()
    finally:
        staged.discard()


def read_input(path: str | os.PathLike[str], what: str, *, limit: int | None = None) -> bytes:
    """The bytes of an input file the user named (a config, a saved JSON, a list of libraries):
    :func:`read_regular`, with every way it is not one as a one-line :class:`UsageError`
    (missing, a directory, not a regular file, unreadable, larger than ``limit``)."""
    shown = os.fspath(path)
    try:
        return read_regular(path, limit=limit)
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {shown}") from None
    except IsADirectoryError:
        raise UsageError(f"{what} {shown} is a directory") from None
    except (NotRegularFileError, FileTooLargeError) as e:
        raise UsageError(f"{what} {shown}: {e}") from None
    except OSError as e:
        raise UsageError(f"cannot read {what} {shown}: {e.strerror or e}") from None


def expand_home(text: str, what: str) -> Path:
    """``Path(text)`` with a leading ``~`` or ``~user`` expanded; a one-line :class:`UsageError`
    naming ``what`` where it names no home directory on this machine (Python raises a bare
    RuntimeError there)."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        raise UsageError(f"{what}: its '~' names no home directory on this machine") from None


def parse_json(text: str | bytes) -> Any:
    """JSON text (or UTF-8 bytes) -> its value; ValueError for anything that is not JSON, text
    nested too deeply included (the parser recurses: a few thousand ``[`` are a RecursionError,
    which no caller's ``except ValueError`` expects) and bytes that are not UTF-8."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def file_digest(path: str | os.PathLike[str]) -> tuple[int, str]:
    """``(size in bytes, sha256 hex)`` of a regular file, read in chunks: how kvpatch names a
    library's contents (the build cache, the plugin's bundle). Anything else (a FIFO, a
    device: a read that blocks or never ends) is :class:`NotRegularFileError`, found on the
    descriptor of a non-blocking open before anything is read."""
    import hashlib

    h = hashlib.sha256()
    size = 0
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", os.fspath(path))
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(path, file_kind(mode))
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return size, h.hexdigest()
