"""The one exception type every user-facing failure is raised as.

The CLI turns a ``KvpatchError`` into a single line on stderr and the exit code
the error carries; anything else is a bug and shows a traceback with ``--debug``.
"""

from __future__ import annotations

import os
from typing import TypeVar

T = TypeVar("T")


class KvpatchError(Exception):
    """A failure a user can act on: bad input, missing tool, unpatchable source."""

    exit_code = 1

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(KvpatchError):
    """Invalid parameters or configuration (exit 2)."""

    exit_code = 2


class ArgumentError(UsageError, ValueError):
    """A Python function's argument that cannot work (the weight runtime's): a UsageError like
    every refusal, and a ValueError, what those functions raised before and document."""


class FetchError(KvpatchError):
    """A release could not be obtained: unknown, unsupported, or no network (exit 3)."""

    exit_code = 3


class PatchError(KvpatchError):
    """The source cannot be patched: sites not found, local edits, failed re-parse (exit 4)."""

    exit_code = 4


class BuildError(KvpatchError):
    """Compiling or checking the kernels failed, or a tool is missing (exit 5)."""

    exit_code = 5


class GpuCheckError(KvpatchError):
    """A GPU check failed: outputs differ from stock's, or vLLM's own test failed (exit 6)."""

    exit_code = 6


def text_argument(value: object, what: str) -> str:
    """``value`` if it is a ``str``; else a :class:`UsageError` naming ``what`` and the type given
    (the public functions that parse text say so instead of failing deep inside on ``None`` or bytes)."""
    if not isinstance(value, str):
        raise UsageError(f"{what} must be text (str), not {type(value).__name__}")
    return value


def typed_argument(value: T, cls: type, what: str) -> T:
    """``value`` if it is a ``cls``; else a :class:`UsageError` naming ``what``, the class asked
    for and the type given (as :func:`text_argument`, for the pipeline's own objects)."""
    if not isinstance(value, cls):
        raise UsageError(f"{what} must be a {cls.__name__}, not {type(value).__name__}")
    return value


def path_argument(value: object, what: str) -> "str | os.PathLike[str]":
    """``value`` if it names a path (``str`` or ``os.PathLike``); else a :class:`UsageError` naming
    ``what`` and the type given (as :func:`text_argument`, for a folder or a file)."""
    if not isinstance(value, (str, os.PathLike)):
        raise UsageError(f"{what} must be a path (str or os.PathLike), not {type(value).__name__}")
    return value


def printable(text: str) -> str:
    """``text`` for a terminal: each control character (ESC, BEL, a line break, DEL, C1) shown as
    its escape (``\\x1b``), never acted on: a path or a value from a file must not move the
    cursor, retitle the window or forge a line of kvpatch's own."""
    return "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in text)
