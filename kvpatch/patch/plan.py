"""From sites and a configuration to patched text: render, plan, patch, re-check.

:func:`plan` renders ``templates/inject/`` into insertions at the sites' byte offsets;
:func:`patch` composes the pipeline: strip whatever kvpatch injected before
(:mod:`.markers`), inject the configuration asked for (:func:`.edits.apply`),
re-parse and check the result (:func:`validate`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .libclang import ci

from ..config import PatchConfig, Selector, config_from_marker
from ..dtypes import QUERY_DTYPES
from ..errors import PatchError, UsageError
from ..templating import render
from .edits import Edit, apply
from .interrupts import interruptible
from .markers import injections, strip, unpatch
from .parse import Parsed, parse_header
from .sites import ALIBI_PARAM, Site, Sites, sites_of

#: The out-of-line prefetch function of ``issue=call`` (templates/inject/prefetch_helper.cuh.j2).
#: The out-of-line prefetch helpers (issue=call; the gated one for min-kv-mib).
HELPERS = ("kvpatch_prefetch_l2", "kvpatch_prefetch_l2_gated")
#: The label of ``issue=split``'s region (templates/inject/split.cuh.j2).
SPLIT_LABEL = "key-split"


def _auto_size(sites: Sites) -> str:
    """One block's K (or V) tile of one head, a constant of each instantiation."""
    return f"{sites.block_size_param} * {sites.head_size_param} * sizeof({sites.cache_type})"


# --------------------------------------------------------------------------- planning


def branch_condition(selector: str, sites: Sites) -> str:
    """The ``if constexpr`` condition that picks a rule's instantiations, in the kernel's own
    template parameters: ``bf16/80/32`` -> ``kvpatch_is_same<scalar_t, __nv_bfloat16>::value
    && HEAD_SIZE == 80 && BLOCK_SIZE == 32``; a kernel part tests ``PARTITION_SIZE`` (0 in v1)."""
    sel = Selector.parse(selector)
    terms = []
    if sel.dtype is not None:
        terms.append(f"kvpatch_is_same<{sites.scalar_type}, {QUERY_DTYPES[sel.dtype].c_type}>::value")
    if sel.head_size is not None:
        terms.append(f"{sites.head_size_param} == {sel.head_size}")
    if sel.block_size is not None:
        terms.append(f"{sites.block_size_param} == {sel.block_size}")
    if sel.kv_cache is not None:
        same = f"kvpatch_is_same<{sites.cache_type}, {sites.scalar_type}>::value"
        terms.append(same if sel.kv_cache == "auto" else f"!{same}")
    if sel.kernel is not None:
        terms.append(f"{sites.partition_size_param} {'==' if sel.kernel == 'v1' else '!='} 0")
    return " && ".join(terms)


def split_condition(branches: list[tuple[str | None, PatchConfig]], cfg: PatchConfig, sites: Sites) -> str:
    """The constant expression, in the kernel's template parameters, that is true for the
    instantiations whose settings say ``issue=split`` (rules by first match, as the
    prefetch's own ``if constexpr`` chain; ``quantized=skip``: never for a quantized cache)."""

    def split(c: PatchConfig) -> str:
        return "true" if c.issue == "split" and not c.off else "false"

    expr = split(branches[-1][1])
    for cond, c in reversed(branches[:-1]):
        if split(c) != expr:  # a rule that gives what the rest gives anyway adds nothing
            expr = f"({cond}) ? {split(c)} : {expr}"
    if cfg.quantized == "skip":
        expr = f"kvpatch_is_same<{sites.cache_type}, {sites.scalar_type}>::value && ({expr})"
    return expr


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
        # the helper's align and hint: a call-form variant some kernel takes (make_config checked
        # they all agree), else any (its code is then never instantiated)
        callers = [c for _, c in (*cfg.live_variants(), *cfg.variants()) if c.issue == "call" and not c.off]
        caller = callers[0] if callers else None
        gated = any(c.issue == "call" and c.min_kv_mib and not c.off for _, c in cfg.variants())
        helper = render("inject/prefetch_helper.cuh.j2", cfg=cfg, c=caller, gated=gated)
        edits.append(_insertion(sites.before_function, helper, "helpers", sites.newline))
    for site in chosen:
        branches = [(None if sel is None else branch_condition(sel, sites), c) for sel, c in cfg.variants()]
        ctx = dict(site=site, sites=sites, cfg=cfg, auto_size=_auto_size(sites), branches=branches)
        if cfg.preset == "paper":
            nxt = render("inject/paper_next_block.cuh.j2", i=site.body_indent, **ctx)
            pre = render("inject/paper_prefetch.cuh.j2", i=site.inner_indent, **ctx)
            edits.append(_insertion(site.after_block_number, nxt, f"{site.kind} next block", sites.newline))
            edits.append(_insertion(site.inner_open, pre, f"{site.kind} prefetch", sites.newline))
        else:
            offset = site.after_block_number if cfg.placement == "start" else site.body_last_end
            text = render("inject/prefetch.cuh.j2", i=site.body_indent, **ctx)
            edits.append(_insertion(offset, text, f"{site.kind} prefetch", sites.newline))
            if site.kind == "key" and cfg.uses_split:
                edits.append(_split(site, sites, cfg, branches))
    return edits


def _split(site: Site, sites: Sites, cfg: PatchConfig, branches: list) -> Edit:
    """``issue=split``'s branch before the key loop, holding a copy of stock's loop."""
    if sites.alibi_var is None:
        raise PatchError(f"issue=split: no variable initialised from the kernel's {ALIBI_PARAM} parameter, which "
                         "split tests; give each split rule that `kvpatch config` lists another issue "
                         "(--rule 'bf16/128/16/auto/v1=issue=call', ...) or drop the rules (rules = \"none\")")
    if site.before_loop < 0:
        raise PatchError(f"issue=split: the key loop at line {site.line} does not start its own line")
    loop_text = site.loop_text.replace("\r\n", "\n")
    text = render("inject/split.cuh.j2", i=site.loop_indent, sites=sites, cfg=cfg, loop_text=loop_text,
                  split_cond=split_condition(branches, cfg, sites))  # fmt: skip
    return _insertion(site.before_loop, text, "key split", sites.newline)


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
def patch(text: str, header_path: str, cfg: PatchConfig) -> Result:
    """Inject ``cfg`` into ``text``, replacing any earlier injection, and validate.

    Validation re-parses the result: both chosen sites must again be found, each
    must now contain an ``asm`` statement, the patched header may carry no error
    diagnostic the stock header did not, and with ``issue=split`` the copy before the
    key loop must be stock's key loop, byte for byte.
    """
    stock, previous = unpatch(text, header_path)
    stock_parsed = parse_header(stock, header_path)
    sites = sites_of(stock_parsed)
    edits = plan(sites, cfg)
    patched = apply(stock_parsed.data, edits)
    validate(stock_parsed, patched, cfg)
    return Result(stock, patched, sites, edits, previous)


@dataclass(frozen=True)
class Injected:
    """What kvpatch injected into a header, and whether it is still exactly that."""

    stock: str  # the header with the injection stripped
    labels: tuple[str, ...]  # the regions found: 'helper', 'key', 'value', 'key-next', ...
    markers: tuple[str, ...]  # their distinct configuration texts
    config: PatchConfig | None  # the configuration the markers name (None: none, or unreadable)
    intact: bool  # every region is byte for byte what kvpatch renders for ``config``

    @property
    def patched(self) -> bool:
        return bool(self.labels)


@interruptible
def inspect(text: str, header_path: str) -> Injected:
    """Find kvpatch's regions in ``text`` and check them against a re-render.

    The regions carry no hash: the marker names the configuration, and the region
    text must equal what :func:`plan` renders for that configuration into the stock
    text (so the generated code stays as it was). A region edited by hand, a marker
    edited by hand, or a region from a kvpatch whose templates differ, is not intact.
    """
    parsed = parse_header(text, header_path)
    found = injections(parsed)
    if not found:
        return Injected(text, (), (), None, True)
    stock = apply(parsed.data, strip(parsed))
    markers = tuple(sorted({j.marker for j in found}))
    labels = tuple(j.label for j in found)
    cfg = None
    if len(markers) == 1:
        try:
            cfg = config_from_marker(markers[0])
        except UsageError:  # not a marker this kvpatch writes
            cfg = None
    intact = False
    if cfg is not None:
        try:
            stock_parsed = parse_header(stock, header_path)
            intact = apply(stock_parsed.data, plan(sites_of(stock_parsed), cfg)) == text
        except PatchError:
            intact = False
    return Injected(stock, labels, markers, cfg, intact)


def validate(stock: Parsed, patched_text: str, cfg: PatchConfig) -> None:
    """Re-parse the patched header and check what :func:`patch` promises."""
    patched = parse_header(patched_text, stock.path)
    new_errors = _multiset_minus(patched.error_messages(), stock.error_messages())
    if new_errors:
        raise PatchError(f"the patched header has new diagnostics: {new_errors[0]}")
    copies = tuple((j.start, j.end) for j in injections(patched) if j.label == SPLIT_LABEL)
    if bool(copies) != (cfg.uses_split and cfg.k):
        raise PatchError("after patching, the key loop's issue=split copy is " + ("unexpected" if copies else "missing"))
    if copies:
        want = sites_of(stock).key.loop_text.replace("\r\n", "\n")
    for start, end in copies:
        copy = [n for n in patched.tu.cursor.walk_preorder() if n.kind == ci.CursorKind.FOR_STMT
                and _in_file(patched, n) and start <= n.extent.start.offset < end]  # fmt: skip
        text = patched.data[copy[0].extent.start.offset : copy[0].extent.end.offset].decode() if copy else ""
        if text.replace("\r\n", "\n") != want:
            raise PatchError("after patching, the issue=split copy of the key loop is not stock's loop")
    sites = sites_of(patched, exclude=copies)
    for site in sites:
        wanted = cfg.k if site.kind == "key" else cfg.v
        loop = _loop_node(patched, site)
        # inline asm, or a call of the helper (in a template an unresolved reference)
        has_asm = any(n.kind == ci.CursorKind.ASM_STMT or n.spelling in HELPERS for n in loop.walk_preorder())
        if has_asm != wanted:
            state = "lacks" if wanted else "unexpectedly has"
            raise PatchError(f"after patching, the {site.kind} loop {state} the prefetch")


def _in_file(p: Parsed, n: ci.Cursor) -> bool:
    return bool(n.location.file and n.location.file.name == p.path)


def _loop_node(p: Parsed, site: Site) -> ci.Cursor:
    for n in p.tu.cursor.walk_preorder():
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
