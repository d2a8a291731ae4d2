"""File-system errors that are about the machine, not about what kvpatch was asked to do: a full
disk, a full quota, a path too long. Wherever one strikes (writing the header, the cache, a
checkout, git's own writes), it is said as what it is, with the path, and its exit code: never
as a damaged cache, a failed patch or a failed link.

* ``ENOSPC`` / ``EDQUOT``: :class:`DiskFullError`, exit 1 (free space, run again);
* ``ENAMETOOLONG``: :class:`PathTooLongError`, exit 2 (a path given, or made from one given,
  is longer than the system takes).

:func:`machine_problem` classifies an ``OSError``; :func:`problem_in_text` a tool's message
(git prints ``No space left on device``); every other error is None (the caller's own message).
"""

from __future__ import annotations

import errno
import os

from ..errors import KvpatchError, UsageError, printable

#: The errno values that are the machine's resources, and what to do about them.
_FULL = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "this user's disk quota is used up"}
#: What tools print for them (C library strerror texts).
_TEXTS = {os.strerror(errno.ENOSPC): errno.ENOSPC, os.strerror(errno.EDQUOT): errno.EDQUOT,
          os.strerror(errno.ENAMETOOLONG): errno.ENAMETOOLONG}  # fmt: skip


_PATH_MAX, _NAME_MAX = 4096, 255


class DiskFullError(KvpatchError):
    """No space, or no quota, left where kvpatch writes (exit 1)."""

    exit_code = 1


class PathTooLongError(UsageError):
    """A path longer than the file system takes (exit 2)."""


def shown_path(path: object) -> str:
    """A path for a one-line message: whole up to 200 characters, else its ends and its length."""
    if path is None:
        return "?"
    text = printable(os.fsdecode(path) if isinstance(path, (bytes, os.PathLike)) else str(path))
    return text if len(text) <= 200 else f"{text[:80]}...{text[-80:]} ({len(text)} characters)"


def _problem(code: int | None, path: object, doing: str | None) -> KvpatchError | None:
    what = f" {doing}" if doing else ""
    where = f": {shown_path(path)}" if path is not None else " writing the output"  # no name: a stream (stdout)
    if code in _FULL:
        return DiskFullError(f"{os.strerror(code)}{what}{where} ({_FULL[code]}: free some space and run the command "
                             "again)")  # fmt: skip
    if code == errno.ENAMETOOLONG:
        return PathTooLongError(f"{os.strerror(code)}{what}{where} (longer than the file system takes: "
                                f"{_PATH_MAX} bytes a path, {_NAME_MAX} a name; use a shorter one)")  # fmt: skip
    return None


def machine_problem(e: BaseException, path: object = None, *, doing: str | None = None) -> KvpatchError | None:
    """The one-line error for an OSError that is a full disk, a full quota or a path too long
    (``path``: the file concerned, default the error's own; ``doing``: "writing the header"),
    else None."""
    if not isinstance(e, OSError):
        return None
    return _problem(e.errno, path if path is not None else (e.filename or e.filename2), doing)


def problem_in_text(text: str, path: object, *, doing: str | None = None) -> KvpatchError | None:
    """The same, read from a tool's message (git's stderr): None when it names none of them."""
    for words, code in _TEXTS.items():
        if words in text:
            return _problem(code, path, doing)
    return None
