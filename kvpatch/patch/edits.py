"""Edits as plain data (clang tooling's Replacement without the file), applied by byte offset.

An :class:`Edit` is (offset, length, text). :func:`apply` applies a set of edits in
one pass from the end of the text backwards, after checking that none overlap.
Locating edits is :mod:`kvpatch.patch.sites`' and :mod:`kvpatch.patch.plan`'s job.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PatchError


@dataclass(frozen=True)
class Edit:
    """Replace ``length`` bytes at byte ``offset`` with ``text``."""

    offset: int
    length: int
    text: str
    what: str = ""  # for reports: 'key prefetch', 'strip key', ...


def apply(data: str | bytes, edits: list[Edit]) -> str:
    """Apply non-overlapping edits to ``data`` (offsets are UTF-8 byte offsets)."""
    raw = data.encode() if isinstance(data, str) else data
    ordered = sorted(edits, key=lambda e: (e.offset, e.length))
    for a, b in zip(ordered, ordered[1:]):
        if a.offset + a.length > b.offset or (a.offset == b.offset and a.length == b.length == 0):
            raise PatchError(f"overlapping edits at byte {b.offset}: {a.what!r} and {b.what!r}")
    for e in ordered:
        if e.offset < 0 or e.offset + e.length > len(raw):
            raise PatchError(f"edit {e.what!r} at byte {e.offset} is outside the text")
    for e in reversed(ordered):
        raw = raw[: e.offset] + e.text.encode() + raw[e.offset + e.length :]
    return raw.decode()
