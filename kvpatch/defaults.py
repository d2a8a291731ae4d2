"""The shipped default rule table and where it was measured (data only; kvpatch.config uses it)."""

from __future__ import annotations

from typing import Any

from .machine import Machine

#: The default rules: ``kvpatch tune`` on an H200 with nvcc 13.0 (vLLM 0.10.2's kernels,
#: vLLM's flags, policy strict, the tuning set's three head layouts GQA 32/8, MHA 32/32 and
#: GQA 64/8; benchmarks/results/tune-6), chosen again without a GPU (``kvpatch tune --from``)
#: with inline asm excluded on bf16 head 64 and 128 block 16 v1, whose ALiBi outputs differ
#: from stock (vLLM's own test and the probe in benchmarks/results/eval-tune-7;
#: benchmarks/results/tune-7, docs/tuning.md), written as tune wrote them. Per kernel (v1/v2)
#: of each tuned instantiation -- fp16/bf16 x head 64/128/256 x block 16/32, auto cache --
#: the fastest candidate that was bit-identical to stock there and slower than stock at
#: none of its tuning points, else ``off``; every instantiation it did not measure (other
#: head/block sizes, fp32) is ``off`` by the per-dtype rules. fp8 caches are skipped by
#: ``quantized=skip``.
DEFAULT_OVERRIDES: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = (
    ('bf16', (('off', True),)),
    ('bf16/128/16/auto/v1', (('lookahead', 1), ('scope', 'kv-head'), ('issue', 'call'))),
    ('bf16/128/16/auto/v2', (('lookahead', 1), ('scope', 'cta'), ('issue', 'call'))),
    ('bf16/128/32/auto', (('off', True),)),
    ('bf16/256/16/auto', (('off', True),)),
    ('bf16/256/32/auto', (('off', True),)),
    ('bf16/64/16/auto/v1', (('lookahead', 1), ('scope', 'cta'), ('issue', 'call'))),
    ('bf16/64/16/auto/v2', (('lookahead', 2), ('scope', 'cta'), ('issue', 'call'))),
    ('bf16/64/32/auto', (('off', True),)),
    ('fp16', (('off', True),)),
    ('fp16/128/16/auto', (('off', True),)),
    ('fp16/128/32/auto', (('off', True),)),
    ('fp16/256/16/auto', (('off', True),)),
    ('fp16/256/32/auto', (('off', True),)),
    ('fp16/64/16/auto/v1', (('lookahead', 1), ('scope', 'cta'), ('issue', 'inline'))),
    ('fp16/64/16/auto/v2', (('off', True),)),
    ('fp16/64/32/auto', (('off', True),)),
    ('fp32', (('off', True),)),
)  # fmt: skip


#: Where DEFAULT_OVERRIDES were measured; ``apply`` warns when its machine differs.
DEFAULT_TUNED_ON = Machine(
    gpu="NVIDIA H200", driver="580.159.04", nvcc="13.0.88", arch="sm_90a",
    flags="-std=c++17 -O2 -g -DNDEBUG --expt-relaxed-constexpr -DENABLE_FP8",
    note="2026-11-30, vLLM 0.10.2, tuning set, policy strict; chosen again from tune.json.gz, policy strict, excluding inline_*@bf16/128/16/auto/v1, inline_*@bf16/64/16/auto/v1 (benchmarks/results/tune-7)",
)  # fmt: skip
