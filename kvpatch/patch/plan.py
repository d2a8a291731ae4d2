"""From sites and a configuration to patched text: render, plan, patch, re-check.

:func:`plan` renders ``templates/inject/`` into insertions at the sites' byte offsets;
:func:`patch` composes the pipeline: strip whatever kvpatch injected before
(:mod:`.markers`), inject the configuration asked for (:func:`.edits.apply`),
re-parse and check the result (:func:`validate`).
"""

from __future__ import annotations

from dataclasses import dataclass

import clang.cindex as ci

from ..config import PatchConfig, Selector
from ..dtypes import QUERY_DTYPES
from ..errors import PatchError
from ..templating import render
from .edits import Edit, apply
from .markers import unpatch
from .parse import Parsed, parse_header
from .sites import Site, Sites, sites_of

#: The out-of-line prefetch function of ``issue=call`` (templates/inject/prefetch_helper.cuh.j2).
HELPER = "kvpatch_prefetch_l2"


def _auto_size(sites: Sites) -> str:
    """One block's K (or V) tile of one head, a constant of each instantiation."""
    return f"{sites.block_size_param} * {sites.head_size_param} * sizeof({sites.cache_type})"


# --------------------------------------------------------------------------- planning


def branch_condition(selector: str, sites: Sites) -> str:
    """The ``if constexpr`` condition that picks a rule's instantiations, in the kernel's own
    template parameters: ``bf16/80/32`` -> ``kvpatch_is_same<scalar_t, __nv_bfloat16>::value
    && HEAD_SIZE == 80 && BLOCK_SIZE == 32``."""
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
    return " && ".join(terms)


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
        caller = next((c for _, c in cfg.variants() if c.issue == "call" and not c.off), None)
        helper = render("inject/prefetch_helper.cuh.j2", cfg=cfg, c=caller)
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
    return edits


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
