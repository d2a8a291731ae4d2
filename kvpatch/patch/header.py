"""A header read once, and patched: the pipeline's composition.

:func:`read_header` parses the text (and, where kvpatch injected before, its stock text,
with kvpatch's regions stripped by :mod:`.markers`) once; what ``apply`` asks of it then
costs no further parse: the sites of the stock text, whether kvpatch's regions are intact
(:meth:`Header.injected`), and the patch itself (:func:`patch_header`: the edits
:func:`~.plan.plan` renders, applied by :func:`~.edits.apply` to the stock text), whose
re-parse is the check that it is what it should be (:func:`verify`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..config import PatchConfig, config_from_marker
from ..errors import PatchError, UsageError, text_argument, typed_argument
from .cursors import walk
from .edits import Edit, apply
from .interrupts import interruptible
from .libclang import ci
from .markers import BEGIN, Injection, injections, strip
from .parse import Parsed, parse_header
from .plan import HELPERS, SPLIT_LABEL, plan
from .sites import Site, Sites, sites_of


@dataclass(frozen=True, eq=False)
class Header:
    """The header's text, parsed, with kvpatch's earlier regions found and its stock text
    (parsed too: the same parse when nothing was injected)."""

    text: str
    path: str
    parsed: Parsed
    regions: tuple[Injection, ...]
    stock: str
    stock_parsed: Parsed

    @functools.cached_property
    def sites(self) -> Sites:
        """The sites of the stock text (offsets into :attr:`stock`)."""
        return sites_of(self.stock_parsed)

    @property
    def markers(self) -> tuple[str, ...]:
        return tuple(sorted({j.marker for j in self.regions}))

    @functools.cached_property
    def injected(self) -> Injected:
        """What kvpatch injected here, and whether it is still exactly that: the regions'
        text must equal what :func:`~.plan.plan` renders for their marker's configuration
        into the stock text (a region or marker edited by hand, or one a kvpatch with other
        templates wrote, is not intact)."""
        if not self.regions:
            return Injected(self.text, (), (), None, True)
        markers, cfg = self.markers, None
        if len(markers) == 1:
            try:
                cfg = config_from_marker(markers[0])
            except UsageError:  # not a marker this kvpatch writes
                cfg = None
        intact, labels = False, tuple(j.label for j in self.regions)
        changed = labels
        if cfg is not None:
            try:
                edits = sorted(plan(self.sites, cfg), key=lambda e: e.offset)
                intact = apply(self.stock_parsed.data, edits) == self.text
            except PatchError:
                edits = []
            pairs = list(zip(self.regions, edits))
            # region by region, where each is paired with its rendering (in text order, by label)
            if (
                not intact
                and len(edits) == len(self.regions)
                and all(f"{BEGIN} {j.label} " in e.text for j, e in pairs)
            ):
                # none differs where a region was moved whole: then all are named
                changed = (
                    tuple(j.label for j, e in pairs if self.parsed.data[j.start : j.end] != e.text.encode()) or labels
                )
        return Injected(self.stock, labels, markers, cfg, intact, () if intact else changed)


@interruptible
def read_header(text: str, header_path: str) -> Header:
    """Parse ``text`` (as the file at ``header_path``), find kvpatch's regions, strip them."""
    text_argument(text, "the header")
    text_argument(header_path, "the header's path")
    parsed = parse_header(text, header_path)
    regions = tuple(injections(parsed))
    if not regions:
        return Header(text, header_path, parsed, (), text, parsed)
    stock = apply(parsed.data, strip(parsed))
    return Header(text, header_path, parsed, regions, stock, parse_header(stock, header_path))


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


@interruptible
def patch_header(header: Header, cfg: PatchConfig) -> Result:
    """Inject ``cfg`` into the header's stock text, replacing any earlier injection, and
    :func:`verify` the result."""
    typed_argument(header, Header, "the header")
    edits = plan(header.sites, cfg)
    patched = apply(header.stock_parsed.data, edits)
    verify(header.stock_parsed, patched, cfg)
    return Result(header.stock, patched, header.sites, edits, header.markers)


def patch(text: str, header_path: str, cfg: PatchConfig) -> Result:
    """:func:`patch_header` of :func:`read_header`: the text patched with ``cfg``."""
    typed_argument(cfg, PatchConfig, "the configuration")  # before the parse
    return patch_header(read_header(text, header_path), cfg)


def unpatch(text: str, header_path: str) -> tuple[str, tuple[str, ...]]:
    """``text`` without kvpatch's injections, and the markers that were removed."""
    h = read_header(text, header_path)
    return h.stock, h.markers


def inspect(text: str, header_path: str) -> Injected:
    """:attr:`Header.injected` of :func:`read_header`."""
    return read_header(text, header_path).injected


@dataclass(frozen=True)
class Injected:
    """What kvpatch injected into a header, and whether it is still exactly that."""

    stock: str  # the header with the injection stripped
    labels: tuple[str, ...]  # the regions found: 'helper', 'key', 'value', 'key-next', ...
    markers: tuple[str, ...]  # their distinct configuration texts
    config: PatchConfig | None  # the configuration the markers name (None: none, or unreadable)
    intact: bool  # every region is byte for byte what kvpatch renders for ``config``
    changed: tuple[str, ...] = ()  # where not intact: the regions that differ (all, where unknown)

    @property
    def patched(self) -> bool:
        return bool(self.labels)


def verify(stock: Parsed, patched_text: str, cfg: PatchConfig) -> None:
    """Re-parse the patched header and check what :func:`patch_header` promises: both
    chosen sites are found again and hold the prefetch (an ``asm`` or a call of the helper),
    no error diagnostic is new, and with ``issue=split`` the copy before the key loop is
    stock's key loop, byte for byte."""
    patched = parse_header(patched_text, stock.path)
    new_errors = _multiset_minus(patched.error_messages(), stock.error_messages())
    if new_errors:
        raise PatchError(f"the patched header has new diagnostics: {new_errors[0]}")
    copies = tuple((j.start, j.end) for j in injections(patched) if j.label == SPLIT_LABEL)
    if bool(copies) != (cfg.uses_split and cfg.k):
        raise PatchError(
            "after patching, the key loop's issue=split copy is " + ("unexpected" if copies else "missing")
        )
    if copies:
        want = sites_of(stock).key.loop_text.replace("\r\n", "\n")
    for start, end in copies:
        copy = [n for n in walk(patched.tu.cursor) if n.kind == ci.CursorKind.FOR_STMT
                and _in_file(patched, n) and start <= n.extent.start.offset < end]  # fmt: skip
        text = patched.data[copy[0].extent.start.offset : copy[0].extent.end.offset].decode() if copy else ""
        if text.replace("\r\n", "\n") != want:
            raise PatchError("after patching, the issue=split copy of the key loop is not stock's loop")
    sites = sites_of(patched, exclude=copies)
    for site in sites:
        wanted = cfg.k if site.kind == "key" else cfg.v
        loop = _loop_node(patched, site)
        # inline asm, or a call of the helper (in a template an unresolved reference)
        has_asm = any(n.kind == ci.CursorKind.ASM_STMT or n.spelling in HELPERS for n in walk(loop))
        if has_asm != wanted:
            state = "lacks" if wanted else "unexpectedly has"
            raise PatchError(f"after patching, the {site.kind} loop {state} the prefetch")


def _in_file(p: Parsed, n: ci.Cursor) -> bool:
    return bool(n.location.file and n.location.file.name == p.path)


def _loop_node(p: Parsed, site: Site) -> ci.Cursor:
    for n in walk(p.tu.cursor):
        if n.kind == ci.CursorKind.FOR_STMT and n.extent.start.offset == site.loop_start and _in_file(p, n):
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
