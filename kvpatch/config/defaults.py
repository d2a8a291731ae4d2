"""The shipped default rule table and where it was measured (data only: the one place it is stated)."""

from __future__ import annotations

from typing import Any

from .machine import Machine

#: The default rules (tune-28): ``kvpatch tune`` on an H200 with nvcc 13.0 (vLLM 0.10.2's kernels,
#: vLLM's flags, policy strict, the tuning set's three head layouts GQA 32/8, MHA 32/32 and GQA
#: 64/8) over five libraries: stock, tune-27 (the table before: grouped-table/ in benchmarks/ARCHIVE.md),
#: tune-27 with ``group-ctas-per-sm = 4`` (its grouped form compiled under launch bounds that fit
#: four CTAs on an SM), and every tuned kernel grouped in launches of >= 256 grouped CTAs, without
#: and with those bounds; written as ``kvpatch tune --from tune.json.gz --exclude
#: 'g4xo4@bf16/128/16/auto/v1' --exclude 'o4@bf16/128/16/auto/v1' --exclude
#: 'g4x*@fp16/64/16/auto/v1' --exclude 'o4@fp16/64/16/auto/v1'`` wrote them
#: (benchmarks/evidence/bounded-table). The exclusions: the held-out set found bf16 head 128 block
#: 16 v1 under launch bounds (0.96 at batch 64, context 4096) and fp16 head 64 block 16 v1 grouped
#: (0.98 there) slower than tune-27; the held-out set may only take a choice back. Per kernel (v1/v2)
#: of each tuned instantiation -- fp16/bf16 x head 64/128/256 x block 16/32, auto cache -- the
#: fastest candidate that was bit-identical to stock there and slower than stock at none of the
#: tuning points where it ran its own code, else ``off``; every instantiation it did not measure
#: (other head/block sizes, fp32) is ``off`` by the per-dtype rules. fp8 caches are skipped by
#: ``quantized=skip``. bf16 block 16 takes ``issue=split`` (inline asm in the key loop, with stock's
#: loop kept for heads whose ALiBi slope is not 0), which is how it stays bit-identical where the
#: inline form alone is not (the split-1 runs, benchmarks/ARCHIVE.md). 14 kernels prefetch: 7 with
#: ``scope=kv-head-rotate`` (the group's CTAs take turns prefetching, tile by tile), 7 with
#: ``read=warp`` (every lane reads the next block number; read-warp-sass). 22 kernels group
#: (``group = 4, group-min-ctas = 256``: one CTA computes four query heads of a KV group, each K/V
#: tile read once for them, in launches of >= 256 such CTAs, through kvpatch's own launchers; vLLM's
#: launchers never run that form), 9 of them without prefetching; 9 under launch bounds
#: (``group-ctas-per-sm = 4``). One setting was added to tune-28's rules since: every grouped v1
#: kernel takes ``group-half-below = 4`` (the launcher runs half the group where fewer than 4 CTAs
#: of the full group fit an SM and halving adds no wave of CTAs; tune-28 ran 2, the setting's
#: default): benchmarks/evidence/wave-rule. And one since: fp16 head 128 and bf16 head 64, block 16,
#: v1, take ``group-logits = auto`` (their logits in a global buffer where shared memory holds fewer
#: CTAs on an SM, of the full group or half of it, than registers do: launches sized for more than
#: about 7k tokens, as vLLM's 8192-token graphs are): benchmarks/evidence/global-logits. And one
#: since: fp16 head 256 block 16 takes ``group-v-loads = ahead`` (its grouped form loads the next
#: block's V vectors before it computes the block in hand): benchmarks/evidence/v-loads-ahead. And
#: one since: fp16 head 256 block 16 takes ``group-k-loads = ahead`` too (the next block's K vectors
#: loaded before the block in hand is scored): benchmarks/evidence/k-loads-ahead. And one since:
#: fp16 head 64 block 16, which tune-28 left ungrouped, groups (v1: its prefetch rule with the grouped
#: form under launch bounds for 4 CTAs an SM, logits auto, K loads ahead; v2: vLLM's form stock's,
#: the grouped form with K loads ahead): benchmarks/evidence/fp16-h64-grouped.
DEFAULT_OVERRIDES: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = (
    ('bf16', (('off', True),)),
    ('bf16/128/16/auto/v1', (('lookahead', 1), ('scope', 'kv-head-rotate'), ('issue', 'split'), ('read', 'warp'), ('group', 4), ('group_min_ctas', 256), ('group_half_below', 4))),
    ('bf16/128/16/auto/v2', (('lookahead', 1), ('scope', 'kv-head-rotate'), ('issue', 'split'), ('group', 4), ('group_min_ctas', 256), ('group_ctas_per_sm', 4))),
    ('bf16/128/32/auto', (('group', 4), ('group_min_ctas', 256), ('group_ctas_per_sm', 4), ('group_half_below', 4), ('off', True))),
    ('bf16/256/16/auto/v1', (('lookahead', 1), ('scope', 'kv-head'), ('issue', 'split'), ('read', 'warp'), ('group', 4), ('group_min_ctas', 256), ('group_half_below', 4))),
    ('bf16/256/16/auto/v2', (('lookahead', 1), ('scope', 'kv-head'), ('issue', 'split'), ('group', 4), ('group_min_ctas', 256))),
    ('bf16/256/32/auto', (('group', 4), ('group_min_ctas', 256), ('group_half_below', 4), ('off', True))),
    ('bf16/64/16/auto/v1', (('lookahead', 1), ('scope', 'cta'), ('issue', 'split'), ('group', 4), ('group_min_ctas', 256), ('group_ctas_per_sm', 4), ('group_half_below', 4), ('group_logits', 'auto'))),
    ('bf16/64/16/auto/v2', (('lookahead', 2), ('scope', 'cta'), ('issue', 'split'), ('group', 4), ('group_min_ctas', 256))),
    ('bf16/64/32/auto/v1', (('group', 4), ('group_min_ctas', 256), ('group_ctas_per_sm', 4), ('group_half_below', 4), ('off', True))),
    ('bf16/64/32/auto/v2', (('group', 4), ('group_min_ctas', 256), ('off', True))),
    ('fp16', (('off', True),)),
    ('fp16/128/16/auto/v1', (('group', 4), ('group_min_ctas', 256), ('group_ctas_per_sm', 4), ('group_half_below', 4), ('group_logits', 'auto'), ('off', True))),
    ('fp16/128/16/auto/v2', (('lookahead', 1), ('scope', 'kv-head-rotate'), ('min_group', 2), ('issue', 'call'), ('group', 4), ('group_min_ctas', 256), ('group_ctas_per_sm', 4))),
    ('fp16/128/32/auto/v1', (('lookahead', 1), ('scope', 'kv-head-rotate'), ('min_group', 2), ('issue', 'call'), ('group', 4), ('group_min_ctas', 256), ('group_half_below', 4))),
    ('fp16/128/32/auto/v2', (('lookahead', 1), ('scope', 'kv-head'), ('min_group', 2), ('issue', 'call'), ('group', 4), ('group_min_ctas', 256))),
    ('fp16/256/16/auto', (('group', 4), ('group_min_ctas', 256), ('group_half_below', 4), ('group_v_loads', 'ahead'), ('group_k_loads', 'ahead'), ('off', True))),
    ('fp16/256/32/auto/v1', (('lookahead', 1), ('scope', 'kv-head-rotate'), ('min_group', 2), ('issue', 'call'), ('read', 'warp'), ('group', 4), ('group_min_ctas', 256), ('group_half_below', 4))),
    ('fp16/256/32/auto/v2', (('lookahead', 1), ('scope', 'kv-head'), ('min_group', 2), ('issue', 'inline'), ('read', 'warp'), ('group', 4), ('group_min_ctas', 256))),
    ('fp16/64/16/auto/v1', (('lookahead', 1), ('scope', 'kv-head-rotate'), ('min_group', 2), ('issue', 'call'), ('read', 'warp'), ('group', 4), ('group_min_ctas', 256), ('group_ctas_per_sm', 4), ('group_half_below', 4), ('group_logits', 'auto'), ('group_k_loads', 'ahead'))),
    ('fp16/64/16/auto/v2', (('group', 4), ('group_min_ctas', 256), ('group_k_loads', 'ahead'), ('off', True))),
    ('fp16/64/32/auto/v1', (('lookahead', 1), ('scope', 'kv-head'), ('min_group', 2), ('issue', 'inline'), ('read', 'warp'), ('group', 4), ('group_min_ctas', 256), ('group_ctas_per_sm', 4), ('group_half_below', 4))),
    ('fp16/64/32/auto/v2', (('lookahead', 1), ('scope', 'kv-head-rotate'), ('min_group', 2), ('issue', 'inline'), ('read', 'warp'), ('group', 4), ('group_min_ctas', 256), ('group_ctas_per_sm', 4))),
    ('fp32', (('off', True),)),
)  # fmt: skip


#: Where DEFAULT_OVERRIDES were measured; ``apply`` warns when its machine differs.
DEFAULT_TUNED_ON = Machine(
    gpu="NVIDIA H200", driver="580.159.04", nvcc="13.0.88", arch="sm_90a",
    flags="-std=c++17 -O2 -g -DNDEBUG --expt-relaxed-constexpr -DENABLE_FP8",
    note="2026-12-04, vLLM 0.10.2, tuning set, policy strict; chosen again from tune.json.gz, policy strict, excluding g4xo4@bf16/128/16/auto/v1, o4@bf16/128/16/auto/v1, g4x*@fp16/64/16/auto/v1, o4@fp16/64/16/auto/v1",
)  # fmt: skip
