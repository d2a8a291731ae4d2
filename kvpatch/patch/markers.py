"""kvpatch's own earlier injections, found by their marker comments and stripped.

Every region kvpatch injects starts with a ``// kvpatch:begin <label> <configuration>``
line and ends with ``// kvpatch:end <label>``; libclang returns both as comment tokens,
so :func:`injections` finds them from the AST's token stream, and :func:`strip`
turns them into deletions that restore the stock bytes exactly (the one reader of
markers: :mod:`.header` uses it).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PatchError, typed_argument
from .edits import Edit
from .libclang import ci
from .parse import Parsed

BEGIN = "// kvpatch:begin"
END = "// kvpatch:end"


@dataclass(frozen=True)
class Injection:
    """One region kvpatch injected earlier, found by its marker comments."""

    start: int  # the newline before the begin marker's line
    end: int  # just past the end marker
    label: str  # 'key', 'value-next', ...
    marker: str  # the configuration text after the label


def _broken(p: Parsed, what: str) -> str:
    """A marker pair broken by hand: which lines are kvpatch's is unknown, so not even
    ``--force`` can remove them; say how to get a stock header back."""
    return (
        f"{what} in {p.path}: the markers are broken, so kvpatch cannot tell its lines from yours (not even "
        "with --force); restore the header (git checkout -- FILE, or a copy) or mend the markers by hand"
    )


def injections(p: Parsed) -> list[Injection]:
    """kvpatch's marker pairs in the parsed header, from its comment tokens."""
    typed_argument(p, Parsed, "the parsed header")
    found: list[Injection] = []
    open_: tuple[int, str, str] | None = None
    for tok in p.tu.get_tokens(extent=p.tu.cursor.extent):
        if tok.kind != ci.TokenKind.COMMENT or tok.location.file.name != p.path:
            continue
        text = tok.spelling
        if text.startswith(BEGIN):
            if open_ is not None:
                raise PatchError(_broken(p, f"nested kvpatch markers at line {tok.location.line}"))
            label, _, marker = text[len(BEGIN) :].strip().partition(" ")
            start = tok.extent.start.offset
            while start > 0 and p.data[start - 1 : start] in (b" ", b"\t"):
                start -= 1
            if p.data[start - 1 : start] != b"\n":
                raise PatchError(_broken(p, f"kvpatch marker not on a line of its own at line {tok.location.line}"))
            start -= 2 if p.data[start - 2 : start] == b"\r\n" else 1
            open_ = (start, label, marker)
        elif text.startswith(END):
            if open_ is None:
                raise PatchError(_broken(p, f"unmatched '{END}' at line {tok.location.line}"))
            label = text[len(END) :].strip()
            if label != open_[1]:
                raise PatchError(_broken(p, f"kvpatch markers do not match at line {tok.location.line}"))
            end = tok.extent.end.offset  # a line comment's token runs to the line's end: not its blanks
            while end > tok.extent.start.offset and p.data[end - 1 : end] in (b" ", b"\t"):
                end -= 1
            found.append(Injection(open_[0], end, open_[1], open_[2]))
            open_ = None
    if open_ is not None:
        raise PatchError(_broken(p, f"unterminated '{BEGIN} {open_[1]}' marker"))
    return found


def strip(p: Parsed) -> list[Edit]:
    """Deletions that remove every earlier injection from the parsed header."""
    return [Edit(j.start, j.end - j.start, "", f"strip {j.label}") for j in injections(p)]
