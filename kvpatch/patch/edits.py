"""Edits as plain data (clang tooling's Replacement without the file), applied by byte offset.

An :class:`Edit` is (offset, length, text). :func:`apply` applies a set of edits in
one pass from the end of the text backwards, after checking that none overlap.
Locating edits is :mod:`kvpatch.patch.sites`' and :mod:`kvpatch.patch.plan`'s job.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PatchError, UsageError


@dataclass(frozen=True)
class Edit:
    """Replace ``length`` bytes at byte ``offset`` with ``text``."""

    offset: int
    length: int
    text: str
    what: str = ""  # for reports: 'key prefetch', 'strip key', ...

    def __post_init__(self) -> None:
        """An edit that could not be applied is refused when it is made (a UsageError)."""
        for name in ("offset", "length"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise UsageError(f"an edit's {name} must be an int >= 0, not {value!r}")
        if not isinstance(self.text, str) or not isinstance(self.what, str):
            raise UsageError(f"an edit's text and description must be str, not {type(self.text).__name__}")


def apply(data: str | bytes, edits: list[Edit]) -> str:
    """Apply non-overlapping edits to ``data`` (offsets are UTF-8 byte offsets, each at a character's
    start or the end)."""
    if not isinstance(data, (str, bytes)) or not isinstance(edits, (list, tuple)) or \
            not all(isinstance(e, Edit) for e in edits):  # fmt: skip
        raise UsageError("apply takes text (str or UTF-8 bytes) and a list of Edit")
    try:
        raw = data.encode() if isinstance(data, str) else data
        raw.decode()
    except UnicodeError:
        raise UsageError("the text to edit is not UTF-8") from None
    ordered = sorted(edits, key=lambda e: (e.offset, e.length))
    for a, b in zip(ordered, ordered[1:]):
        if a.offset + a.length > b.offset or (a.offset == b.offset and a.length == b.length == 0):
            raise PatchError(f"overlapping edits at byte {b.offset}: {a.what!r} and {b.what!r}")
    for e in ordered:
        if e.offset + e.length > len(raw):
            raise PatchError(f"edit {e.what!r} at byte {e.offset} is outside the text")
        if any(0x80 <= raw[i] < 0xC0 for i in (e.offset, e.offset + e.length) if i < len(raw)):
            raise PatchError(f"edit {e.what!r} at byte {e.offset} splits a character")
    for e in reversed(ordered):
        raw = raw[: e.offset] + e.text.encode() + raw[e.offset + e.length :]
    return raw.decode()
