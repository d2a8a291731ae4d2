"""From sites and a configuration to edits: :func:`plan` renders ``templates/inject/`` into
insertions at the sites' byte offsets (pure; :mod:`.header` applies and re-checks them)."""

from __future__ import annotations

from typing import Callable

from ..config import K_LOADS, LOGITS, V_LOADS, PatchConfig, Selector
from ..dtypes import QUERY_DTYPES
from ..errors import PatchError, typed_argument
from ..templating import render
from .edits import Edit
from .sites import ALIBI_PARAM, Site, Sites

#: The out-of-line prefetch function of ``issue=call`` (templates/inject/prefetch_helper.cuh.j2).
#: The out-of-line prefetch helpers (issue=call; the gated one for min-kv-mib).
HELPERS = ("kvpatch_prefetch_l2", "kvpatch_prefetch_l2_gated")
#: The label of ``issue=split``'s region (templates/inject/split.cuh.j2).
SPLIT_LABEL = "key-split"
#: weight-tail (opt-in): rows the kernel's table holds (templates/inject/weight_tail_helper.cuh.j2).
WEIGHT_TAIL_ROWS = 64


def _auto_size(sites: Sites) -> str:
    """One block's K (or V) tile of one head, a constant of each instantiation."""
    return f"{sites.block_size_param} * {sites.head_size_param} * sizeof({sites.cache_type})"


# --------------------------------------------------------------------------- planning


def branch_condition(selector: str, sites: Sites) -> str:
    """The ``if constexpr`` condition that picks a rule's instantiations, in the kernel's own
    template parameters: ``bf16/80/32`` -> ``kvpatch_is_same<scalar_t, <bf16's C type>>::value
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


def rule_value(branches: list[tuple[str | None, PatchConfig]], value: Callable[[PatchConfig], str]) -> str:
    """The constant expression, in the kernel's template parameters, whose value for each
    instantiation is ``value`` of the settings it takes (rules by first match, as the prefetch's
    own ``if constexpr`` chain): ``(cond) ? a : (cond2) ? b : base``."""
    expr = value(branches[-1][1])
    for cond, c in reversed(branches[:-1]):
        if value(c) != expr:  # a rule that gives what the rest gives anyway adds nothing
            expr = f"({cond}) ? {value(c)} : {expr}"
    return expr


def split_condition(branches: list[tuple[str | None, PatchConfig]], cfg: PatchConfig, sites: Sites) -> str:
    """The constant expression, in the kernel's template parameters, that is true for the
    instantiations whose settings say ``issue=split`` (``quantized=skip``: never for a
    quantized cache)."""
    expr = rule_value(branches, lambda c: "true" if c.issue == "split" and not c.off else "false")
    if cfg.quantized == "skip":
        expr = f"kvpatch_is_same<{sites.cache_type}, {sites.scalar_type}>::value && ({expr})"
    return expr


def group_values(branches: list[tuple[str | None, PatchConfig]], cfg: PatchConfig) -> dict[str, str]:
    """The grouped form's per-instantiation constants (templates/inject/grouped.cuh.j2), as
    :func:`rule_value` expressions: query heads per CTA, the least CTAs of a grouped launch, the
    CTAs per SM its launch bounds ask for (0: none), below how many CTAs per SM a v1 launch takes
    half the group (0: never), for how many CTAs per SM a v1 launch's shared memory is sized, its
    CTAs taking their heads in passes where they must (0: never), where a v1 launch keeps its logits
    (0 shared, 1 global, 2 auto: the index in ``LOGITS``), when it loads its V vectors (0 at use, 1 a
    block ahead: the index in ``V_LOADS``), its K vectors (the same, ``K_LOADS``) and its prefetch's
    lookahead (0: none)."""
    return {
        "heads": rule_value(branches, lambda c: str(c.group)),
        "min_ctas": rule_value(branches, lambda c: str(c.group_min_ctas)),
        "ctas_per_sm": rule_value(branches, lambda c: str(c.group_ctas_per_sm)),
        "half_below": rule_value(branches, lambda c: str(c.group_half_below)),
        "fit_ctas": rule_value(branches, lambda c: str(c.group_fit_ctas)),
        "logits": rule_value(branches, lambda c: str(LOGITS.index(c.group_logits))),
        "v_loads": rule_value(branches, lambda c: str(V_LOADS.index(c.group_v_loads))),
        "k_loads": rule_value(branches, lambda c: str(K_LOADS.index(c.group_k_loads))),
        "lookahead": rule_value(branches, lambda c: "0" if c.off else str(c.lookahead)),
    }


def takes_grouped_form(sites: Sites, cfg: PatchConfig) -> bool:
    """Whether the patched header holds the grouped form: some kernel's settings group, and the
    header declares what the form calls (a header that lacks it gets none)."""
    return cfg.uses_group and not sites.group_missing


def _insertion(offset: int, body: str, what: str, newline: str = "\n") -> Edit:
    # Every injection starts with a newline right after the statement (or brace) it
    # follows and ends at the end of its last line, so deleting
    # [offset, offset + len(text)) restores the original bytes exactly.
    return Edit(offset, 0, newline + body.replace("\n", newline), what)


def plan(sites: Sites, cfg: PatchConfig) -> list[Edit]:
    """The insertions that inject ``cfg`` into a stock header with these sites."""
    typed_argument(sites, Sites, "the sites")
    typed_argument(cfg, PatchConfig, "the configuration")
    edits: list[Edit] = []
    chosen: list[Site] = [s for s in sites if (s.kind == "key" and cfg.k) or
                          (s.kind == "value" and cfg.v)]  # fmt: skip
    branches = [(None if sel is None else branch_condition(sel, sites), c) for sel, c in cfg.variants()]
    grouped = takes_grouped_form(sites, cfg)
    if (cfg.uses_call or cfg.branches_on_types or cfg.weight_tail or grouped) and chosen:
        # the helper's align and hint: a call-form variant some kernel takes (make_config checked
        # they all agree), else any (its code is then never instantiated)
        callers = [c for _, c in (*cfg.live_variants(), *cfg.variants()) if c.issue == "call" and not c.off]
        caller = callers[0] if callers else None
        gated = any(c.issue == "call" and c.min_kv_mib and not c.off for _, c in cfg.variants())
        helper = render("inject/prefetch_helper.cuh.j2", cfg=cfg, c=caller, gated=gated, max_rows=WEIGHT_TAIL_ROWS,
                        sites=sites, grouped=grouped, group=group_values(branches, cfg))  # fmt: skip
        edits.append(_insertion(sites.before_function, helper, "helpers", sites.newline))
    for site in chosen:
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
    if cfg.weight_tail and cfg.preset != "paper":  # after the value loop: the kernel's tail
        text = render("inject/weight_tail.cuh.j2", i=sites.value.loop_indent, cfg=cfg, sites=sites)
        edits.append(_insertion(sites.value.loop_end, text, "weight tail", sites.newline))
    return edits


def _split(site: Site, sites: Sites, cfg: PatchConfig, branches: list) -> Edit:
    """``issue=split``'s branch before the key loop, holding a copy of stock's loop."""
    if sites.alibi_var is None:
        raise PatchError(
            f"issue=split: no variable initialised from the kernel's {ALIBI_PARAM} parameter, which "
            "split tests; give each split rule that `kvpatch config` lists another issue "
            "(--rule 'bf16/128/16/auto/v1=issue=call', ...) or drop the rules (rules = \"none\")"
        )
    if site.before_loop < 0:
        raise PatchError(f"issue=split: the key loop at line {site.line} does not start its own line")
    loop_text = site.loop_text.replace("\r\n", "\n")
    text = render("inject/split.cuh.j2", i=site.loop_indent, sites=sites, cfg=cfg, loop_text=loop_text,
                  split_cond=split_condition(branches, cfg, sites))  # fmt: skip
    return _insertion(site.before_loop, text, "key split", sites.newline)
