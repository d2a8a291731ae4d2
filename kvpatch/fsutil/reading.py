"""The one way kvpatch reads what it is given: only regular files (a FIFO, socket or device could
block or never end), of bounded size, never blocking; a user's input file as a one-line error
(its text UTF-8, a byte-order mark dropped);
JSON text, never a RecursionError; a library file checked before ``dlopen``; a file's digest.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, Callable

from ..errors import UsageError, path_argument

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


def folder_spelling(text: str) -> bool:
    """Whether a file option's text ends in '/', a folder's spelling, which a Path drops
    (``Path('ok.toml/')`` is ok.toml): such a value is refused where a file is asked for."""
    return text.endswith("/") and bool(text.strip("/"))


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


def open_regular(path: str | os.PathLike[str], *, limit: int) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file at ``path`` (symlinks followed), opened non-blocking, and
    its ``fstat``; the caller closes it. Anything else is refused before it is opened:
    FileNotFoundError, IsADirectoryError, :class:`NotRegularFileError` (FIFO, socket, device),
    :class:`FileTooLargeError` beyond ``limit`` bytes; and checked again on the descriptor, so a
    file swapped for a FIFO in between cannot block a reader either. A file still growing is the
    reader's to bound."""
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
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular_with_stat(path: str | os.PathLike[str], *, limit: int | None = None) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file at ``path`` (symlinks followed), never blocking, and
    its ``fstat`` (the file those bytes came from: device, inode, mtime).

    Anything else is refused as :func:`open_regular` refuses it (reading a FIFO, socket or
    device could block forever or never end), and so is a file beyond ``limit`` bytes (default
    :data:`READ_LIMIT`), also one that grew beyond it while read.
    """
    limit = READ_LIMIT if limit is None else limit
    fd, st = open_regular(path, limit=limit)
    try:
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # grew while read
                raise FileTooLargeError(path, size, limit)
        return b"".join(chunks), st
    finally:
        os.close(fd)


def read_input(path: str | os.PathLike[str], what: str, *, limit: int | None = None) -> bytes:
    """The bytes of an input file the user named (a config, a saved JSON, a list of libraries):
    :func:`read_regular`, with every way it is not one as a one-line :class:`UsageError`
    (missing, a directory, not a regular file, unreadable, larger than ``limit``; a ``path`` that is
    no path at all, e.g. None)."""
    shown = os.fspath(path_argument(path, what))
    try:
        return read_regular(path, limit=limit)
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {shown}") from None
    except IsADirectoryError:
        raise UsageError(f"{what} {shown} is a directory") from None
    except (NotRegularFileError, FileTooLargeError) as e:  # "is a FIFO, not a regular file", without errno's words
        raise UsageError(f"{what} {shown} {e.strerror}") from None
    except OSError as e:
        raise UsageError(f"cannot read {what} {shown}: {e.strerror or e}") from None


def read_text_input(path: str | os.PathLike[str], what: str, *, limit: int | None = None) -> str:
    """The text of an input file the user wrote (a config, a list of libraries): :func:`read_input`,
    decoded as UTF-8 with a leading byte-order mark dropped (Windows editors write one); bytes
    that are not UTF-8 are a one-line :class:`UsageError` saying which and where."""
    raw = read_input(path, what, limit=limit)
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise UsageError(
            f"{what} {os.fspath(path)} is not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})"
        ) from None


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
