"""Edits as plain data, rendered from the templates and applied by byte offset.

An :class:`Edit` is clang tooling's Replacement without the file: (offset, length,
text). :func:`plan` turns (sites, config) into insertions, :func:`strip` turns the
marker comments of an earlier injection into deletions, and :func:`apply` applies a
set of edits in one pass from the end of the text backwards after checking that
none overlap. :func:`patch` composes them: strip whatever kvpatch injected before,
inject the configuration asked for, re-parse, and check the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import clang.cindex as ci
import jinja2

from .config import DTYPES, PatchConfig
from .errors import PatchError
from .parse import Parsed, parse_header
from .sites import Site, Sites, sites_of

BEGIN = "// kvpatch:begin"
#: The out-of-line prefetch function of ``issue=call`` (templates/prefetch_helper.cuh.j2).
HELPER = "kvpatch_prefetch_l2"
END = "// kvpatch:end"


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


# --------------------------------------------------------------------------- templates


def templates_dir() -> Path:
    """Installed wheels carry ``kvpatch/templates``; a checkout has ``templates/`` beside it."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parent / "templates"):
        if candidate.is_dir():
            return candidate
    raise PatchError("kvpatch's templates directory is missing from this installation")


@cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=False,
        autoescape=False,
    )


def render(name: str, **context) -> str:
    """Render one template; the text has no leading or trailing line breaks."""
    return environment().get_template(name).render(**context).strip("\n")


def _auto_size(sites: Sites) -> str:
    """One block's K (or V) tile of one head, a constant of each instantiation."""
    return f"{sites.block_size} * {sites.head_size} * sizeof({sites.cache_type})"


# --------------------------------------------------------------------------- planning


def _insertion(offset: int, body: str, what: str, newline: str = "\n") -> Edit:
    # Every injection starts with a newline right after the statement (or brace) it
    # follows and ends at the end of its last line, so deleting
    # [offset, offset + len(text)) restores the original bytes exactly.
    return Edit(offset, 0, newline + body.replace("\n", newline), what)


def plan(sites: Sites, cfg: PatchConfig) -> list[Edit]:
    """The insertions that inject ``cfg`` into a stock header with these sites."""
    edits: list[Edit] = []
    chosen: list[Site] = [s for s in sites if (s.kind == "key" and cfg.k) or
                          (s.kind == "value" and cfg.v)]  # fmt: skip
    if (cfg.uses_call or cfg.branches_on_types) and chosen:
        caller = next((c for _, c in cfg.variants() if c.issue == "call"), None)
        helper = render("prefetch_helper.cuh.j2", cfg=cfg, c=caller)
        edits.append(_insertion(sites.before_function, helper, "helpers", sites.newline))
    for site in chosen:
        ctx = dict(site=site, sites=sites, cfg=cfg, auto_size=_auto_size(sites), scalar_types=DTYPES)
        if cfg.preset == "paper":
            nxt = render("paper_next_block.cuh.j2", i=site.body_indent, **ctx)
            pre = render("paper_prefetch.cuh.j2", i=site.inner_indent, **ctx)
            edits.append(_insertion(site.after_block_number, nxt, f"{site.kind} next block", sites.newline))
            edits.append(_insertion(site.inner_open, pre, f"{site.kind} prefetch", sites.newline))
        else:
            offset = site.after_block_number if cfg.placement == "start" else site.body_last_end
            text = render("prefetch.cuh.j2", i=site.body_indent, **ctx)
            edits.append(_insertion(offset, text, f"{site.kind} prefetch", sites.newline))
    return edits


# --------------------------------------------------------------------------- stripping


@dataclass(frozen=True)
class Injection:
    """One region kvpatch injected earlier, found by its marker comments."""

    start: int  # the newline before the begin marker's line
    end: int  # just past the end marker
    label: str  # 'key', 'value-next', ...
    marker: str  # the configuration text after the label


def injections(p: Parsed) -> list[Injection]:
    """kvpatch's marker pairs in the parsed header, from its comment tokens."""
    found: list[Injection] = []
    open_: tuple[int, str, str] | None = None
    for tok in p.tu.get_tokens(extent=p.tu.cursor.extent):
        if tok.kind != ci.TokenKind.COMMENT or tok.location.file.name != p.path:
            continue
        text = tok.spelling
        if text.startswith(BEGIN):
            if open_ is not None:
                raise PatchError(f"nested kvpatch markers at line {tok.location.line}")
            label, _, marker = text[len(BEGIN) :].strip().partition(" ")
            start = tok.extent.start.offset
            while start > 0 and p.data[start - 1 : start] in (b" ", b"\t"):
                start -= 1
            if p.data[start - 1 : start] != b"\n":
                raise PatchError(f"kvpatch marker not on a line of its own at line {tok.location.line}")
            start -= 2 if p.data[start - 2 : start] == b"\r\n" else 1
            open_ = (start, label, marker)
        elif text.startswith(END):
            if open_ is None:
                raise PatchError(f"unmatched '{END}' at line {tok.location.line}")
            label = text[len(END) :].strip()
            if label != open_[1]:
                raise PatchError(f"kvpatch markers do not match at line {tok.location.line}")
            found.append(Injection(open_[0], tok.extent.end.offset, open_[1], open_[2]))
            open_ = None
    if open_ is not None:
        raise PatchError(f"unterminated '{BEGIN} {open_[1]}' marker")
    return found


def strip(p: Parsed) -> list[Edit]:
    """Deletions that remove every earlier injection from the parsed header."""
    return [Edit(j.start, j.end - j.start, "", f"strip {j.label}") for j in injections(p)]


# --------------------------------------------------------------------------- patching


@dataclass(frozen=True)
class Result:
    """The outcome of :func:`patch`: texts, where the sites are, what was inserted."""

    stock: str  # the header with any earlier kvpatch injection removed
    patched: str
    sites: Sites  # located in ``stock``
    edits: list[Edit]  # applied to ``stock``
    previous: tuple[str, ...]  # marker texts of the injection that was there before

    @property
    def changed(self) -> bool:
        return self.stock != self.patched


def unpatch(text: str, header_path: str) -> tuple[str, tuple[str, ...]]:
    """``text`` without kvpatch's injections, and the markers that were removed."""
    parsed = parse_header(text, header_path)
    found = injections(parsed)
    if not found:
        return text, ()
    stock = apply(parsed.data, strip(parsed))
    return stock, tuple(sorted({j.marker for j in found}))


def patch(text: str, header_path: str, cfg: PatchConfig) -> Result:
    """Inject ``cfg`` into ``text``, replacing any earlier injection, and validate.

    Validation re-parses the result: both chosen sites must again be found, each
    must now contain an ``asm`` statement, and the patched header may carry no
    error diagnostic the stock header did not.
    """
    stock, previous = unpatch(text, header_path)
    stock_parsed = parse_header(stock, header_path)
    sites = sites_of(stock_parsed)
    edits = plan(sites, cfg)
    patched = apply(stock_parsed.data, edits)
    validate(stock_parsed, patched, cfg)
    return Result(stock, patched, sites, edits, previous)


def validate(stock: Parsed, patched_text: str, cfg: PatchConfig) -> None:
    """Re-parse the patched header and check what :func:`patch` promises."""
    patched = parse_header(patched_text, stock.path)
    new_errors = _multiset_minus(patched.error_messages(), stock.error_messages())
    if new_errors:
        raise PatchError(f"the patched header has new diagnostics: {new_errors[0]}")
    sites = sites_of(patched)
    for site in sites:
        wanted = cfg.k if site.kind == "key" else cfg.v
        loop = _loop_node(patched, site)
        # inline asm, or a call of the helper (in a template an unresolved reference)
        has_asm = any(n.kind == ci.CursorKind.ASM_STMT or n.spelling == HELPER for n in loop.walk_preorder())
        if has_asm != wanted:
            state = "lacks" if wanted else "unexpectedly has"
            raise PatchError(f"after patching, the {site.kind} loop {state} the prefetch")


def _loop_node(p: Parsed, site: Site) -> ci.Cursor:
    for n in p.tu.cursor.walk_preorder():
        if n.kind == ci.CursorKind.FOR_STMT and n.extent.start.line == site.line \
                and n.location.file and n.location.file.name == p.path:  # fmt: skip
            return n
    raise PatchError(f"the {site.kind} loop vanished after patching")


def _multiset_minus(a: list[str], b: list[str]) -> list[str]:
    rest = list(b)
    out = []
    for x in a:
        if x in rest:
            rest.remove(x)
        else:
            out.append(x)
    return out
