"""Reading libclang cursors and the bytes under them: the small helpers :mod:`.sites` locates with."""

from __future__ import annotations

from typing import Iterator

from ..errors import PatchError
from .libclang import CursorKind, ci
from .parse import Parsed

K = CursorKind


def text_of(p: Parsed, node: ci.Cursor) -> str:
    """The node's source as one line: comments dropped, whitespace runs made one space."""
    parts: list[str] = []
    last_end = None
    for tok in node.get_tokens():
        if tok.kind == ci.TokenKind.COMMENT:
            continue
        start = tok.extent.start.offset
        if last_end is not None and start > last_end:
            parts.append(" ")
        parts.append(tok.spelling)
        last_end = tok.extent.end.offset
    return "".join(parts)


def line_break_before(p: Parsed, offset: int) -> int:
    """The offset of the line break ending the line before the one holding ``offset``."""
    start = p.data.rfind(b"\n", 0, offset)
    if start < 0:
        if b"\r" in p.data[:offset]:
            raise PatchError("the header's lines end in CR alone: kvpatch reads LF or CRLF line endings (convert the "
                             "file, e.g. with tr '\\r' '\\n')")  # fmt: skip
        raise PatchError("the kernel starts on the first line of the file")
    return start - 1 if p.data[start - 1 : start] == b"\r" else start


def after_trailing_comment(p: Parsed, offset: int) -> int:
    """``offset``, moved past comments and blanks that follow it on the same line.

    Code inserted at ``offset`` starts with a newline; a trailing ``// note`` after
    the statement would otherwise end up after kvpatch's last line, and trailing
    blanks would end up on the line of its end marker (whose comment token runs to the
    end of the line: a revert would take them with it).
    """
    data, i = p.data, offset
    while True:
        while data[i : i + 1] in (b" ", b"\t"):
            i += 1
        if data.startswith(b"//", i):
            end = data.find(b"\n", i)
            end = len(data) if end < 0 else end
            end = end - 1 if data[end - 1 : end] == b"\r" else end
            if data[i:end].endswith(b"\\"):  # the comment runs on into the next line: so would kvpatch's code
                line = data.count(b"\n", 0, i) + 1
                raise PatchError(f"line {line}: a '//' comment ending in a backslash continues onto the next line, "
                                 "where kvpatch inserts its code: remove the backslash")  # fmt: skip
            return end
        if data.startswith(b"/*", i):
            close = data.find(b"*/", i + 2)
            if close < 0 or b"\n" in data[i:close]:
                return offset  # a block comment running onto the next lines: stay put
            i = close + 2
            offset = i
            continue
        if i == len(data) or data.startswith(b"\n", i) or data.startswith(b"\r\n", i):
            return i  # only blanks up to the line's end: they stay on the statement's line
        return offset


def in_main_file(p: Parsed, node: ci.Cursor) -> bool:
    return node.location.file is not None and node.location.file.name == p.path


def strip_wrappers(node: ci.Cursor) -> ci.Cursor:
    """Look through implicit casts, parentheses and unexposed wrappers."""
    while node.kind in (K.UNEXPOSED_EXPR, K.PAREN_EXPR, K.CXX_STATIC_CAST_EXPR,
                        K.CSTYLE_CAST_EXPR, K.CXX_FUNCTIONAL_CAST_EXPR):  # fmt: skip
        kids = [c for c in node.get_children() if c.kind != K.TYPE_REF]
        if len(kids) != 1:
            break
        node = kids[0]
    return node


def operator(p: Parsed, node: ci.Cursor) -> str | None:
    """The operator spelling of a binary operator node (the first token after its left operand).
    Only the tokens from there to the node's end are read: in ``a + b + c + ...`` a node's left
    operand is the rest of the sum, and reading every token of every node was quadratic."""
    kids = list(node.get_children())
    if len(kids) != 2:
        return None
    lhs_end = kids[0].extent.end
    if lhs_end.file is None or node.extent.end.file is None:
        return None
    after = ci.SourceRange.from_locations(lhs_end, node.extent.end)
    for tok in p.tu.get_tokens(extent=after):
        if tok.kind != ci.TokenKind.COMMENT and tok.extent.start.offset >= lhs_end.offset:
            return tok.spelling
    return None


def ref_name(node: ci.Cursor) -> str | None:
    node = strip_wrappers(node)
    if node.kind == K.DECL_REF_EXPR:
        return node.spelling
    return None


def walk(node: ci.Cursor) -> Iterator[ci.Cursor]:
    """``node`` and every cursor under it, in preorder (libclang's ``walk_preorder`` order),
    without recursion: ``walk_preorder`` nests a generator and a ctypes callback per level, and
    a deep AST (a dispatch of a thousand rules nests ``else if`` a thousand deep) ran out of
    Python's stack inside libclang's callback, which only prints the RecursionError and stops
    visiting: the walk ended early, silently."""
    stack = [node]
    while stack:
        here = stack.pop()
        yield here
        stack.extend(reversed(list(here.get_children())))


def refs(node: ci.Cursor) -> list[ci.Cursor]:
    return [c for c in walk(node) if c.kind == K.DECL_REF_EXPR]


def indent_at(p: Parsed, offset: int) -> str:
    start = p.data.rfind(b"\n", 0, offset) + 1
    prefix = p.data[start:offset]
    return prefix.decode() if prefix.strip() == b"" else ""


def is_sum(p: Parsed, node: ci.Cursor) -> bool:
    return node.kind == K.BINARY_OPERATOR and operator(p, node) == "+"


def span(node: ci.Cursor) -> tuple[int, int]:
    """The node's extent as byte offsets."""
    return node.extent.start.offset, node.extent.end.offset


def left_sums(p: Parsed, node: ci.Cursor) -> set[tuple[int, int]]:
    """The spans of the sum ``node`` and of the sums down its left side: ``a + b + c`` is
    ``(a + b) + c``, so those hold its first terms (where the whole sum is no tile address,
    none of them is either)."""
    out = set()
    while is_sum(p, node):
        out.add(span(node))
        node = strip_wrappers(next(iter(node.get_children())))
    return out


def flatten_sum(p: Parsed, node: ci.Cursor) -> list[ci.Cursor]:
    """The terms of ``a + b + ...`` left to right (wrappers looked through), without recursion:
    a sum of a thousand terms nests a thousand deep."""
    terms, stack = [], [node]
    while stack:
        here = strip_wrappers(stack.pop())
        if is_sum(p, here):
            lhs, rhs = here.get_children()
            stack += [rhs, lhs]
        else:
            terms.append(here)
    return terms


# --------------------------------------------------------------------------- locating


def own_line_break(p: Parsed, offset: int) -> int:
    """The line break before ``offset``'s line when only blanks precede it there, else -1."""
    start = p.data.rfind(b"\n", 0, offset)
    if start < 0 or p.data[start + 1 : offset].strip():
        return -1
    return start - 1 if p.data[start - 1 : start] == b"\r" else start
