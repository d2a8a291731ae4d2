"""Validate variants against stock: bit-identical outputs, stock against a reference.

For each configuration of the matrix (query dtype x KV-cache dtype x head size x
block size x kernel x heads x ALiBi x context length), fresh random inputs are drawn
(randn; fp8 caches as random valid e4m3 bytes) with a scattered block table that
always holds physical block 0. Every library runs on NaN-poisoned outputs; then

* stock must write every output element, give the same bits when run twice (a race
  shows up here), and stay within :data:`~kvpatch.gpu.reference.REF_TOLERANCE` of the
  float64 reference attention (worst sequence's relative L2; this proves the harness);
* every other variant must write every element and match stock bit for bit
  (``torch.equal``), for v2 also in the partitions of the scratch buffers that a
  sequence has.

A configuration the stock library was not built for (its call raises RuntimeError)
is *skipped*, and said so; a variant raising where stock ran is a failure.

Matrices: :func:`validate_matrix` (the cross product; default 1440 configurations),
:func:`quick_matrix` (32), :func:`full_matrix` (every head and block size vLLM
instantiates, sampled: see its docstring).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..dtypes import VLLM_BLOCK_SIZES, VLLM_HEAD_SIZES
from ..errors import UsageError
from . import launch as L
from .cases import ValidateCase
from .dispatch import KERNELS, check_kernel
from .inputs import DTYPES, KV_CACHE_DTYPES, cache_x, make_inputs
from .points import check_contexts, check_heads
from .reference import max_alibi_bias, max_rel_l2_per_seq, ref_tolerance, reference_attention
from .report import CaseResult, ValidateReport, VariantCheck

#: Context lengths: one token, mid-block, just past one partition, and spanning 3-5
#: v2 partitions (ending mid-block for block sizes 16 and 32).
DEFAULT_CONTEXTS = (1, 17, 513, 1500, 2100)
#: (query heads, KV heads): GQA 4 queries per KV head, and MHA.
DEFAULT_HEADS = ((8, 2), (4, 4))
#: ALiBi cases of the full and tune matrices run more sequences and heads: a kernel whose
#: compiler fused the ALiBi multiply-add where stock's did not differs from stock by an ulp
#: in a float logit, which a 16-bit output shows only now and then (v2's float scratch
#: shows it at once; v1 has none). vLLM's own test, 7 sequences x 40 heads, found such a v1
#: kernel that 3 sequences x 8 heads missed.
ALIBI_HEADS = ((32, 8), (16, 16))
ALIBI_NUM_SEQS = 8
DEFAULT_HEAD_SIZES = (64, 128, 256)
DEFAULT_BLOCK_SIZES = (16, 32)


def _check(dtypes: Sequence[str], kv_cache_dtypes: Sequence[str], kernels: Sequence[str],
           heads: Sequence[tuple[int, int]], contexts: Sequence[int]) -> None:  # fmt: skip
    for d in dtypes:
        if d not in DTYPES:
            raise UsageError(f"unknown dtype {d!r}: choose from {', '.join(DTYPES)}")
    for kv in kv_cache_dtypes:
        if kv not in KV_CACHE_DTYPES:
            raise UsageError(f"unknown kv cache dtype {kv!r}: choose from {', '.join(KV_CACHE_DTYPES)}")
    for k in kernels:
        check_kernel(k)
    for qh, kvh in heads:
        check_heads(qh, kvh, f"{qh}/{kvh}")
    check_contexts(contexts)


def validate_matrix(
    *,
    dtypes: Sequence[str] = DTYPES,
    kv_cache_dtypes: Sequence[str] = KV_CACHE_DTYPES,
    head_sizes: Sequence[int] = DEFAULT_HEAD_SIZES,
    block_sizes: Sequence[int] = DEFAULT_BLOCK_SIZES,
    kernels: Sequence[str] = KERNELS,
    heads: Sequence[tuple[int, int]] = DEFAULT_HEADS,
    alibi: Sequence[bool] = (False, True),
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    num_seqs: int = 3,
) -> list[ValidateCase]:
    """The cross product, in a stable order. vLLM instantiates fp8 (e4m3) caches for
    all three query dtypes (DISPATCH_BY_KV_CACHE_DTYPE), so fp32 + fp8 is included."""
    _check(dtypes, kv_cache_dtypes, kernels, heads, contexts)
    cases = [
        ValidateCase(d, kv, hs, bs, k, qh, kvh, al, ctx, num_seqs)
        for d, kv, hs, bs, k, (qh, kvh), al, ctx in itertools.product(
            dtypes, kv_cache_dtypes, head_sizes, block_sizes, kernels, heads, alibi, contexts
        )
        if hs % cache_x(d, kv) == 0  # as vLLM: an fp8 key cache needs head sizes in 16s (not 80, 120)
    ]
    if not cases and head_sizes and dtypes and kv_cache_dtypes and kernels and heads and alibi and contexts:
        raise UsageError(f"no instantiation to validate: head sizes {', '.join(map(str, head_sizes))} with "
                         f"{', '.join(kv_cache_dtypes)} caches (an fp8 key cache needs a multiple of 16)")  # fmt: skip
    return cases


def quick_matrix() -> list[ValidateCase]:
    """A trimmed matrix (fp16/bf16, head 128, block 16, GQA, both kernels, ALiBi on/off,
    auto and fp8, contexts 17 and 1500): 32 configurations."""
    return validate_matrix(dtypes=("fp16", "bf16"), head_sizes=(128,), block_sizes=(16,), heads=((8, 2),),
                           contexts=(17, 1500))  # fmt: skip


def vllm_sizes(tree: str | Path | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The head and block sizes the tree's paged_attention_v1.cu instantiates
    (``kvpatch.jit.vllm_kernel_set``); vLLM's known set without a tree."""
    if tree is None:
        return VLLM_HEAD_SIZES, VLLM_BLOCK_SIZES
    try:
        from .. import jit as B  # parsing work only when a tree is given
    except ImportError:  # a GPU machine without kvpatch's build dependencies (libclang)
        return VLLM_HEAD_SIZES, VLLM_BLOCK_SIZES
    heads, blocks = B.vllm_kernel_set(Path(tree))
    return tuple(heads), tuple(blocks)


FULL_SHORT_CONTEXTS = (1, 17)
FULL_LONG_CONTEXTS = (513, 1500, 2100)
FULL_SAMPLING = (
    "every query dtype x KV-cache dtype x head size x block size x kernel x ALiBi on/off that vLLM "
    "instantiates (fp8 only for head sizes that are multiples of 16: its key cache packs 16 bytes), "
    "each twice: a short context (1 or 17, alternating) with one head layout and a multi-partition "
    "context (513, 1500 or 2100, rotating) with the other (GQA 8/2 and MHA 4/4 alternate, 3 sequences; "
    "with ALiBi, standard-normal slopes as in vLLM's test, GQA 32/8 and MHA 16/16, 8 sequences)"
)


def full_matrix(
    *,
    head_sizes: Sequence[int] = VLLM_HEAD_SIZES,
    block_sizes: Sequence[int] = VLLM_BLOCK_SIZES,
    dtypes: Sequence[str] = DTYPES,
    kv_cache_dtypes: Sequence[str] = KV_CACHE_DTYPES,
    num_seqs: int = 3,
) -> list[ValidateCase]:
    """Every instantiation vLLM builds, with ALiBi on and off and both kernels, each
    at two sampled (context, heads) pairs (:data:`FULL_SAMPLING`). With vLLM's 9 head
    sizes x 3 block sizes: 1224 configurations."""
    _check(dtypes, kv_cache_dtypes, KERNELS, DEFAULT_HEADS, FULL_SHORT_CONTEXTS + FULL_LONG_CONTEXTS)
    cases: list[ValidateCase] = []
    i = 0
    for d, kv, hs, bs, k, al in itertools.product(dtypes, kv_cache_dtypes, head_sizes, block_sizes, KERNELS,
                                                  (False, True)):  # fmt: skip
        if hs % cache_x(d, kv):
            continue
        heads, n = (ALIBI_HEADS, ALIBI_NUM_SEQS) if al else (DEFAULT_HEADS, num_seqs)
        h1, h2 = heads[i % 2], heads[(i + 1) % 2]
        cases.append(ValidateCase(d, kv, hs, bs, k, *h1, al, FULL_SHORT_CONTEXTS[i % 2], n))
        cases.append(ValidateCase(d, kv, hs, bs, k, *h2, al, FULL_LONG_CONTEXTS[i % 3], n))
        i += 1
    return cases


# --------------------------------------------------------------------------- checking


def _case_seed(seed: int, index: int) -> int:
    return (seed * 1_000_003 + index * 7919 + 1) & 0x7FFF_FFFF


def _skip(res: CaseResult, reason: str, t0: float) -> CaseResult:
    res.status = "skip"
    res.skip_reason = reason
    res.seconds = time.perf_counter() - t0
    return res


def _int_view(t: Any) -> Any:
    """The same-width integer dtype (compare bits, so NaN == NaN and -0 != +0)."""
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]


def check_case(libs: dict[str, Any], case: ValidateCase, *, seed: int, baseline: str = "stock",
               device: str = "cuda") -> CaseResult:  # fmt: skip
    """Run one configuration on every library (fresh inputs) and judge it."""
    import torch

    t0 = time.perf_counter()
    names = L.order_variants(libs, baseline)
    base = names[0]
    lens = case.seq_lens(seed)
    res = CaseResult(case=case, seed=seed, seq_lens=lens, status="pass")
    label = case.config
    if L.is_built(libs[base], label) is False:
        return _skip(res, f"{label} not built in {base}", t0)
    inp = make_inputs(dtype=case.dtype, kv_cache_dtype=case.kv_cache_dtype, head_size=case.head_size,
                      block_size=case.block_size, num_heads=case.num_heads, num_kv_heads=case.num_kv_heads,
                      seq_lens=lens, alibi=case.alibi, seed=seed, device=device)  # fmt: skip

    def run(lib: Any) -> tuple[L.OutputBuffers, bool | None]:
        bufs = L.make_buffers(inp, case.kernel)  # poisoned
        grouped = L.launch(lib, case.kernel, inp, bufs)
        L.synchronize(device)
        return bufs, grouped

    # stock: twice, then against the reference
    try:
        s1, _ = run(libs[base])
    except RuntimeError as e:
        if L.is_built(libs[base], label) is None:  # a library that cannot say: take it as not built
            return _skip(res, f"{base} raised RuntimeError: {e}", t0)
        res.status = "fail"
        res.reasons.append(f"raised RuntimeError: {e}")
        res.seconds = time.perf_counter() - t0
        return res
    s2, _ = run(libs[base])
    res.stock_unwritten = L.count_unwritten(s1.out)
    if res.stock_unwritten:
        res.reasons.append(f"{res.stock_unwritten} output elements not written (NaN)")
    res.stock_deterministic = torch.equal(s1.out, s2.out)
    if not res.stock_deterministic and not res.stock_unwritten:
        res.reasons.append("two runs on the same inputs differ (a race?)")
    ref = reference_attention(inp)
    res.tolerance = ref_tolerance(case.dtype, case.kv_cache_dtype, max_alibi_bias(inp))
    res.ref_error = max_rel_l2_per_seq(s1.out, ref)
    if not res.ref_error < res.tolerance:  # NaN fails too
        res.reasons.append(f"rel-L2 error vs reference {res.ref_error:.3g} >= {res.tolerance:g}")

    mask = None
    if case.kernel == "v2":
        mask = L.written_partitions_mask(lens, case.num_heads, inp.max_num_partitions, s1.out.device)

    for name in names[1:]:
        vc = VariantCheck(status="pass")
        res.variants[name] = vc
        if L.is_built(libs[name], label) is False:
            vc.status = "fail"
            vc.reasons.append(f"{label} not built in this library (it is in {base})")
            continue
        try:
            b, grouped = run(libs[name])
        except Exception as e:  # noqa: BLE001
            vc.status = "fail"
            vc.error = f"{type(e).__name__}: {e}"
            vc.reasons.append(f"raised {vc.error}")
            continue
        vc.grouped = grouped  # which form served it: both give the same output
        vc.unwritten = L.count_unwritten(b.out)
        if vc.unwritten:
            vc.reasons.append(f"{vc.unwritten} output elements not written (NaN)")
        vc.identical = torch.equal(b.out, s1.out)
        if not vc.identical:
            differ = b.out.view(_int_view(b.out)) != s1.out.view(_int_view(s1.out))
            vc.mismatched = int(differ.sum().item())
            finite = ~(torch.isnan(b.out) | torch.isnan(s1.out))
            if finite.any():
                vc.max_abs_diff = float((b.out[finite].float() - s1.out[finite].float()).abs().max().item())
            if not vc.unwritten:
                vc.reasons.append(
                    f"output differs from {base}: {vc.mismatched} elements, max |diff| {vc.max_abs_diff:.3g}"
                )
        if mask is not None and vc.identical:
            for part in ("exp_sums", "max_logits"):
                sv, bv = getattr(s1, part)[mask], getattr(b, part)[mask]
                if not torch.equal(sv.view(torch.int32), bv.view(torch.int32)):
                    vc.reasons.append(f"v2 {part} differ from {base} in written partitions")
            mt = mask[..., None].expand_as(s1.tmp_out)
            if not torch.equal(s1.tmp_out[mt].view(_int_view(s1.tmp_out)), b.tmp_out[mt].view(_int_view(b.tmp_out))):
                vc.reasons.append(f"v2 tmp_out differs from {base} in written partitions")
        if vc.reasons:
            vc.status = "fail"
            vc.identical = False
    if res.reasons or any(v.status == "fail" for v in res.variants.values()):
        res.status = "fail"
    res.seconds = time.perf_counter() - t0
    return res


def run_validate(
    libs: dict[str, Any],
    matrix: Iterable[ValidateCase] | None = None,
    seed: int = 0,
    *,
    baseline: str = "stock",
    device: str = "cuda",
    progress: Callable[[int, int, CaseResult], None] | None = None,
    env: dict[str, Any] | None = None,
    matrix_name: str = "custom",
    sampling: str = "",
    strict: bool = False,
) -> ValidateReport:
    """Check every configuration of ``matrix`` (default :func:`validate_matrix`) on
    ``libs`` (name -> Kernels; ``baseline`` or the first is the reference library).

    ``progress(i, n, result)`` is called after each configuration."""
    cases = list(matrix) if matrix is not None else validate_matrix()
    names = L.order_variants(libs, baseline)
    t0 = time.perf_counter()
    results: list[CaseResult] = []
    for i, case in enumerate(cases):
        r = check_case(libs, case, seed=_case_seed(seed, i), baseline=names[0], device=device)
        results.append(r)
        if progress is not None:
            progress(i + 1, len(cases), r)
    return ValidateReport(baseline=names[0], variants=names, seed=seed, results=results, env=dict(env or {}),
                          seconds=time.perf_counter() - t0, matrix=matrix_name, sampling=sampling,
                          strict=strict)  # fmt: skip
