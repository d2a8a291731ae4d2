"""What a configuration reaches: the options and rules that change no kernel vLLM builds
(``kvpatch apply`` warns about those given on its command line)."""

from __future__ import annotations

import itertools
from typing import Iterable, Sequence

from ..dtypes import VLLM_BLOCK_SIZES, VLLM_HEAD_SIZES
from .model import DTYPES, GROUPING, RULE_KERNELS, RULE_KV, V1_ONLY, PatchConfig, Selector
from .settings import label

#: Settings that apply to every kernel that prefetches (no rule sets them).
GLOBAL_SETTINGS = ("caches", "placement")
#: The grouped form's settings that change only kernels that take it (``group`` itself decides
#: which do); of them, V1_ONLY only v1 launches read.
GROUPED_ONLY = tuple(s for s in GROUPING if s != "group")


def unreached(cfg: PatchConfig, options: Iterable[str] = (), selectors: Iterable[str] = (),
              head_sizes: Sequence[int] = VLLM_HEAD_SIZES, block_sizes: Sequence[int] = VLLM_BLOCK_SIZES, *,
              user_rules: Iterable[str] | None = None) -> list[str]:  # fmt: skip
    """The base settings (``options``: ``'lookahead'``...) and rules (``selectors``) that
    change no kernel vLLM builds, one line each (for a warning): a rule that selects no such
    kernel, or only fp8-cache kernels under ``quantized=skip``, or whose kernels more specific
    rules all decide (a rule of the table's inside it takes its settings: not one of those); a
    setting every prefetching kernel takes from its own rule, or any setting when no kernel
    prefetches; a setting of the grouped form when no kernel (no v1 kernel, for those v1 alone
    reads) groups but from a rule of its own; ``quantized=prefetch`` when every fp8-cache kernel
    is off.
    ``user_rules``: the selectors of the rules the user gave (None: every rule is theirs): only
    those keep their own settings against a base setting; the shipped table's rules take it."""
    kernels = list(itertools.product(DTYPES, head_sizes, block_sizes, RULE_KV, RULE_KERNELS))
    rules = dict(cfg.overrides)
    owned = {str(Selector.parse(s)) for s in user_rules} if user_rules is not None else set()
    given = [Selector.parse(s) for s in (owned or {str(Selector.parse(s)) for s in selectors})
             if s in rules and s not in DTYPES]  # fmt: skip

    def carried(sel: str | None) -> str | None:
        """The rule of the user's a kernel's rule carries: its own, or, where the user's rules meet
        the table's inside a selector of theirs, the most specific of theirs holding it."""
        if sel is None or sel in owned or sel in DTYPES:
            return sel
        where = Selector.parse(sel)
        holding = [u for u in given if u.intersect(where) == where]
        return str(min(holding, key=lambda u: (-u.specificity, str(u)))) if holding else sel

    decided: set[str | None] = set()
    reached: set[str] = set()
    prefetching = fp8_prefetching = False
    for (_, _, _, kv, kernel), entry, settings in cfg.kernel_variants(head_sizes, block_sizes):
        sel = carried(entry)
        decided.update((entry, sel))
        mine = sel is not None and (user_rules is None or sel in owned)
        own = dict(rules.get(sel, ())) if mine else {}
        if settings.group > 1 and kv == "auto":  # fp8 caches never group
            reached.update(o for o in options if o in GROUPED_ONLY and o not in own
                           and (o not in V1_ONLY or kernel == "v1"))  # fmt: skip
        if settings.off:
            continue
        prefetching = True
        fp8_prefetching = fp8_prefetching or kv != "auto"
        reached.update(o for o in options if o not in GROUPED_ONLY and (o in GLOBAL_SETTINGS or o not in own))
    out = []
    for o in options:
        flag = "--" + label(o)
        if o == "quantized":
            if cfg.quantized == "prefetch" and not fp8_prefetching:
                out.append(f"{flag} prefetch changes no kernel: every fp8-cache kernel is off by its rules "
                           "(turn some on, e.g. --rule 'bf16/128/16/fp8=issue=call')")  # fmt: skip
        elif o in GROUPED_ONLY and o not in reached:
            which = "v1 kernel" if o in V1_ONLY else "kernel"
            out.append(f"{flag} changes no kernel: no {which} takes the grouped form under these rules, or every "
                       f"one that does takes {label(o)} from a rule of its own (--group 4 groups every kernel)")  # fmt: skip
        elif o not in reached and not prefetching:
            out.append(f"{flag} changes no kernel: no kernel prefetches under these rules")
        elif o not in reached:
            out.append(f"{flag} changes no kernel: every kernel that prefetches takes {label(o)} from a "
                       f"rule of its own (set it there, e.g. --rule 'fp16/64/16/auto/v1={label(o)}=...')")  # fmt: skip
    for sel in selectors:
        key = str(Selector.parse(sel))
        if key not in rules or key in decided:
            continue
        chosen = Selector.parse(key)
        hits = [kernel for kernel in kernels if chosen.matches(*kernel)]
        only_fp8 = all(kv != "auto" for _, _, _, kv, _ in hits)
        if not hits:
            why = (f"it selects no kernel vLLM builds (head sizes {', '.join(map(str, head_sizes))}; "
                   f"block sizes {', '.join(map(str, block_sizes))})")  # fmt: skip
        elif only_fp8 and set(dict(rules[key])) <= {*GROUPING, "off"}:
            why = "it selects only fp8-cache kernels, which never take the grouped form"
        elif only_fp8 and cfg.quantized != "prefetch":
            why = "it selects only fp8-cache kernels, which stay stock under quantized=skip (add --quantized prefetch)"
        else:
            why = "more specific rules decide every kernel it selects (name the kernels, e.g. dtype/head/block/auto/v1)"
        out.append(f"rule {key} changes no kernel: {why}")
    return out
