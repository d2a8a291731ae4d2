"""Validate variants against stock: bit-identical outputs, stock against a reference.

For each configuration of the matrix (query dtype x KV-cache dtype x head size x
block size x kernel x heads x ALiBi x context length), fresh random inputs are drawn
(randn; fp8 caches as random valid e4m3 bytes) with a scattered block table that
always holds physical block 0. Every library runs on NaN-poisoned outputs; then

* stock must write every output element, give the same bits when run twice (a race
  shows up here), and stay within :data:`~kvpatch.gpu.harness.REF_TOLERANCE` of the
  float64 reference attention (worst sequence's relative L2; this proves the harness);
* every other variant must write every element and match stock bit for bit
  (``torch.equal``), for v2 also in the partitions of the scratch buffers that a
  sequence has.

A configuration the stock library was not built for (its call raises RuntimeError)
is *skipped*, and said so; a variant raising where stock ran is a failure.

Standalone, on the GPU machine::

    python -m kvpatch.gpu.validate --lib stock=s.so:stock --lib patched=p.so:patched --json v.json

exits 0 when everything matched, 6 on any mismatch (naming each configuration),
2 on bad arguments.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Sequence

from . import harness as H

#: Context lengths: one token, mid-block, just past one partition, and spanning 3-5
#: v2 partitions (ending mid-block for block sizes 16 and 32).
DEFAULT_CONTEXTS = (1, 17, 513, 1500, 2100)
#: (query heads, KV heads): GQA 4 queries per KV head, and MHA.
DEFAULT_HEADS = ((8, 2), (4, 4))
DEFAULT_HEAD_SIZES = (64, 128, 256)
DEFAULT_BLOCK_SIZES = (16, 32)

#: Exit code on a mismatch (the kvpatch CLI's "GPU check failed").
EXIT_MISMATCH = 6


@dataclass(frozen=True)
class ValidateCase:
    """One configuration. ``context`` is the longest sequence's length (= max_seq_len);
    the batch's other sequences are random lengths in [1, context]."""

    dtype: str
    kv_cache_dtype: str
    head_size: int
    block_size: int
    kernel: str
    num_heads: int
    num_kv_heads: int
    alibi: bool
    context: int
    num_seqs: int = 3

    @property
    def name(self) -> str:
        return (
            f"{self.kernel} q={self.dtype} kv={self.kv_cache_dtype} head={self.head_size} "
            f"block={self.block_size} heads={self.num_heads}/{self.num_kv_heads} "
            f"alibi={'on' if self.alibi else 'off'} ctx={self.context}"
        )

    @property
    def config(self) -> str:
        """The build configuration this case needs (``Kernels.configs`` entry)."""
        return H.config_label(self.dtype, self.kv_cache_dtype, self.head_size, self.block_size)

    def seq_lens(self, seed: int) -> list[int]:
        """``num_seqs`` lengths: ``context`` itself, plus random ones in [1, context]
        (at least one ending mid-block when context allows), shuffled."""
        import random

        rng = random.Random(seed)
        lens = [self.context]
        for _ in range(self.num_seqs - 1):
            lens.append(rng.randint(1, self.context))
        rng.shuffle(lens)
        return lens


def validate_matrix(
    *,
    dtypes: Sequence[str] = H.DTYPES,
    kv_cache_dtypes: Sequence[str] = H.KV_CACHE_DTYPES,
    head_sizes: Sequence[int] = DEFAULT_HEAD_SIZES,
    block_sizes: Sequence[int] = DEFAULT_BLOCK_SIZES,
    kernels: Sequence[str] = H.KERNELS,
    heads: Sequence[tuple[int, int]] = DEFAULT_HEADS,
    alibi: Sequence[bool] = (False, True),
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    num_seqs: int = 3,
) -> list[ValidateCase]:
    """The cross product, in a stable order. vLLM instantiates fp8 (e4m3) caches for
    all three query dtypes (DISPATCH_BY_KV_CACHE_DTYPE), so fp32 + fp8 is included."""
    for d in dtypes:
        if d not in H.DTYPES:
            raise ValueError(f"unknown dtype {d!r}: choose from {', '.join(H.DTYPES)}")
    for kv in kv_cache_dtypes:
        if kv not in H.KV_CACHE_DTYPES:
            raise ValueError(f"unknown kv cache dtype {kv!r}: choose from {', '.join(H.KV_CACHE_DTYPES)}")
    for k in kernels:
        if k not in H.KERNELS:
            raise ValueError(f"unknown kernel {k!r}: v1 or v2")
    for qh, kvh in heads:
        if qh % kvh:
            raise ValueError(f"{qh} query heads are not a multiple of {kvh} KV heads")
    if any(c < 1 for c in contexts):
        raise ValueError("context lengths must be >= 1")
    return [
        ValidateCase(d, kv, hs, bs, k, qh, kvh, al, ctx, num_seqs)
        for d, kv, hs, bs, k, (qh, kvh), al, ctx in itertools.product(
            dtypes, kv_cache_dtypes, head_sizes, block_sizes, kernels, heads, alibi, contexts
        )
    ]


def quick_matrix() -> list[ValidateCase]:
    """A trimmed matrix (fp16/bf16, head 128, block 16, GQA, both kernels, ALiBi on/off,
    auto and fp8, contexts 17 and 1500): 32 configurations."""
    return validate_matrix(
        dtypes=("fp16", "bf16"),
        head_sizes=(128,),
        block_sizes=(16,),
        heads=((8, 2),),
        contexts=(17, 1500),
    )


@dataclass
class VariantCheck:
    """One variant on one configuration."""

    status: str  # "pass" | "fail"
    identical: bool = False
    unwritten: int = 0
    mismatched: int = 0
    max_abs_diff: float = 0.0
    error: str | None = None
    reasons: list[str] = field(default_factory=list)


@dataclass
class CaseResult:
    case: ValidateCase
    seed: int
    seq_lens: list[int]
    status: str  # "pass" | "fail" | "skip"
    ref_error: float | None = None
    tolerance: float | None = None
    stock_unwritten: int = 0
    stock_deterministic: bool | None = None
    skip_reason: str | None = None
    reasons: list[str] = field(default_factory=list)  # stock-side failures
    variants: dict[str, VariantCheck] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["name"] = self.case.name
        return d


@dataclass
class ValidateReport:
    baseline: str
    variants: list[str]
    seed: int
    results: list[CaseResult]
    env: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def failures(self) -> list[str]:
        """One line per failure: ``"<variant>: <configuration>: <why>"``."""
        out: list[str] = []
        for r in self.results:
            for why in r.reasons:
                out.append(f"{self.baseline}: {r.case.name} (seed {r.seed}): {why}")
            for name, vc in r.variants.items():
                if vc.status == "fail":
                    out.append(f"{name}: {r.case.name} (seed {r.seed}): {'; '.join(vc.reasons)}")
        return out

    @property
    def skipped(self) -> list[str]:
        return [f"{r.case.name}: {r.skip_reason}" for r in self.results if r.status == "skip"]

    @property
    def n_passed(self) -> int:
        return sum(r.status == "pass" for r in self.results)

    @property
    def n_failed(self) -> int:
        return sum(r.status == "fail" for r in self.results)

    @property
    def ok(self) -> bool:
        """No failure, and at least one configuration actually checked."""
        return self.n_failed == 0 and self.n_passed > 0

    def max_ref_error(self) -> dict[str, float]:
        """Worst stock-vs-reference error per ``dtype/kv_cache_dtype`` (against
        :data:`~kvpatch.gpu.harness.REF_TOLERANCE`: how much of the tolerance is used)."""
        worst: dict[str, float] = {}
        for r in self.results:
            if r.ref_error is not None:
                key = f"{r.case.dtype}/{r.case.kv_cache_dtype}"
                worst[key] = max(worst.get(key, 0.0), r.ref_error)
        return worst

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "kvpatch-validate",
            "version": 1,
            "ok": self.ok,
            "baseline": self.baseline,
            "variants": self.variants,
            "seed": self.seed,
            "seconds": self.seconds,
            "counts": {
                "cases": len(self.results),
                "passed": self.n_passed,
                "failed": self.n_failed,
                "skipped": len(self.results) - self.n_passed - self.n_failed,
            },
            "max_ref_error": self.max_ref_error(),
            "tolerance": dict(H.REF_TOLERANCE),
            "failures": self.failures,
            "skipped": self.skipped,
            "env": self.env,
            "results": [r.to_dict() for r in self.results],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(H.json_safe(self.to_dict()), indent=indent, allow_nan=False)

    def summary_line(self) -> str:
        errs = ", ".join(f"{d} {e:.1e}" for d, e in sorted(self.max_ref_error().items()))
        return (
            f"{len(self.results)} configurations x {len(self.variants) - 1} variant(s): "
            f"{self.n_passed} passed, {self.n_failed} failed, "
            f"{len(self.results) - self.n_passed - self.n_failed} skipped"
            + (f"; worst stock-vs-reference rel-L2: {errs}" if errs else "")
        )


def _case_seed(seed: int, index: int) -> int:
    return (seed * 1_000_003 + index * 7919 + 1) & 0x7FFF_FFFF


def _skip(res: CaseResult, reason: str, t0: float) -> CaseResult:
    res.status = "skip"
    res.skip_reason = reason
    res.seconds = time.perf_counter() - t0
    return res


def check_case(
    libs: dict[str, Any],
    case: ValidateCase,
    *,
    seed: int,
    baseline: str = "stock",
    device: str = "cuda",
) -> CaseResult:
    """Run one configuration on every library (fresh inputs) and judge it."""
    import torch

    t0 = time.perf_counter()
    names = H.order_variants(libs, baseline)
    base = names[0]
    lens = case.seq_lens(seed)
    res = CaseResult(case=case, seed=seed, seq_lens=lens, status="pass")
    label = case.config
    if H.is_built(libs[base], label) is False:
        return _skip(res, f"{label} not built in {base}", t0)
    inp = H.make_inputs(
        dtype=case.dtype,
        kv_cache_dtype=case.kv_cache_dtype,
        head_size=case.head_size,
        block_size=case.block_size,
        num_heads=case.num_heads,
        num_kv_heads=case.num_kv_heads,
        seq_lens=lens,
        alibi=case.alibi,
        seed=seed,
        device=device,
    )

    def run(lib: Any) -> H.OutputBuffers:
        bufs = H.make_buffers(inp, case.kernel)  # poisoned
        H.launch(lib, case.kernel, inp, bufs)
        H.synchronize(device)
        return bufs

    # stock: twice, then against the reference
    try:
        s1 = run(libs[base])
    except RuntimeError as e:
        if H.is_built(libs[base], label) is None:  # a library that cannot say: take it as not built
            return _skip(res, f"{base} raised RuntimeError: {e}", t0)
        res.status = "fail"
        res.reasons.append(f"raised RuntimeError: {e}")
        res.seconds = time.perf_counter() - t0
        return res
    s2 = run(libs[base])
    res.stock_unwritten = H.count_unwritten(s1.out)
    if res.stock_unwritten:
        res.reasons.append(f"{res.stock_unwritten} output elements not written (NaN)")
    res.stock_deterministic = torch.equal(s1.out, s2.out)
    if not res.stock_deterministic and not res.stock_unwritten:
        res.reasons.append("two runs on the same inputs differ (a race?)")
    ref = H.reference_attention(inp)
    res.tolerance = H.ref_tolerance(case.dtype, case.kv_cache_dtype)
    res.ref_error = H.max_rel_l2_per_seq(s1.out, ref)
    if not res.ref_error < res.tolerance:  # NaN fails too
        res.reasons.append(f"rel-L2 error vs reference {res.ref_error:.3g} >= {res.tolerance:g}")

    mask = None
    if case.kernel == "v2":
        mask = H.written_partitions_mask(lens, case.num_heads, inp.max_num_partitions, s1.out.device)

    for name in names[1:]:
        vc = VariantCheck(status="pass")
        res.variants[name] = vc
        if H.is_built(libs[name], label) is False:
            vc.status = "fail"
            vc.reasons.append(f"{label} not built in this library (it is in {base})")
            continue
        try:
            b = run(libs[name])
        except Exception as e:  # noqa: BLE001
            vc.status = "fail"
            vc.error = f"{type(e).__name__}: {e}"
            vc.reasons.append(f"raised {vc.error}")
            continue
        vc.unwritten = H.count_unwritten(b.out)
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
    if res.reasons or any(v.status == "fail" for v in res.variants.values()):
        res.status = "fail"
    res.seconds = time.perf_counter() - t0
    return res


def _int_view(t: Any) -> Any:
    """The same-width integer dtype (compare bits, so NaN == NaN and -0 != +0)."""
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]


def run_validate(
    libs: dict[str, Any],
    matrix: Iterable[ValidateCase] | None = None,
    seed: int = 0,
    *,
    baseline: str = "stock",
    device: str = "cuda",
    progress: Callable[[int, int, CaseResult], None] | None = None,
    env: dict[str, Any] | None = None,
) -> ValidateReport:
    """Check every configuration of ``matrix`` (default :func:`validate_matrix`) on
    ``libs`` (name -> Kernels; ``baseline`` or the first is the reference library).

    ``progress(i, n, result)`` is called after each configuration."""
    cases = list(matrix) if matrix is not None else validate_matrix()
    names = H.order_variants(libs, baseline)
    t0 = time.perf_counter()
    results: list[CaseResult] = []
    for i, case in enumerate(cases):
        r = check_case(libs, case, seed=_case_seed(seed, i), baseline=names[0], device=device)
        results.append(r)
        if progress is not None:
            progress(i + 1, len(cases), r)
    return ValidateReport(
        baseline=names[0],
        variants=names,
        seed=seed,
        results=results,
        env=dict(env or {}),
        seconds=time.perf_counter() - t0,
    )


# --------------------------------------------------------------------------- standalone entry


def _csv(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse(s: str) -> list[Any]:
        return [kind(x.strip()) for x in s.split(",") if x.strip()]

    return parse


def _heads(s: str) -> list[tuple[int, int]]:
    out = []
    for part in s.split(","):
        q, _, kv = part.strip().partition("/")
        out.append((int(q), int(kv)))
    return out


def _bools(s: str) -> list[bool]:
    m = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}
    return [m[x.strip().lower()] for x in s.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kvpatch.gpu.validate",
        description="Check kernel libraries bit-identical to stock, and stock against a float64 reference.",
    )
    p.add_argument("--lib", action="append", required=True, metavar="NAME=PATH.so:PREFIX",
                   help="a library (repeatable; comma-separated lists too); 'stock' or the first is the baseline")
    p.add_argument("--baseline", default="stock")
    p.add_argument("--json", metavar="PATH", help="write the full report here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="the trimmed matrix (32 configurations)")
    p.add_argument("--dtypes", type=_csv(str), help=f"query dtypes (default {','.join(H.DTYPES)})")
    p.add_argument("--kv", type=_csv(str), help="KV cache dtypes (default auto,fp8)")
    p.add_argument("--head-sizes", type=_csv(int))
    p.add_argument("--block-sizes", type=_csv(int))
    p.add_argument("--kernels", type=_csv(str), help="v1,v2")
    p.add_argument("--heads", type=_heads, help="query/kv head pairs, e.g. 8/2,4/4")
    p.add_argument("--alibi", type=_bools, help="on,off")
    p.add_argument("--contexts", type=_csv(int))
    p.add_argument("--strict", action="store_true", help="a skipped configuration is a failure too")
    p.add_argument("--device", default="cuda")
    p.add_argument("-q", "--quiet", action="store_true")
    return p


def matrix_from_args(a: argparse.Namespace) -> list[ValidateCase]:
    if a.quick:
        cases = quick_matrix()
        keep = {
            "dtype": a.dtypes, "kv_cache_dtype": a.kv, "head_size": a.head_sizes, "block_size": a.block_sizes,
            "kernel": a.kernels, "alibi": a.alibi, "context": a.contexts,
        }
        return [c for c in cases if all(v is None or getattr(c, k) in v for k, v in keep.items())
                and (a.heads is None or (c.num_heads, c.num_kv_heads) in a.heads)]
    kw: dict[str, Any] = {}
    for arg, key in (("dtypes", "dtypes"), ("kv", "kv_cache_dtypes"), ("head_sizes", "head_sizes"),
                     ("block_sizes", "block_sizes"), ("kernels", "kernels"), ("heads", "heads"),
                     ("alibi", "alibi"), ("contexts", "contexts")):
        v = getattr(a, arg)
        if v is not None:
            kw[key] = v
    return validate_matrix(**kw)


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    try:
        specs = H.parse_lib_specs(a.lib)
        cases = matrix_from_args(a)
    except (ValueError, KeyError) as e:
        p.error(str(e))
    if not cases:
        p.error("the matrix is empty")
    try:
        libs = H.load_libs(specs)
    except (RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    env = {"libs": {n: H.lib_info(path, pre) for n, path, pre in specs}}
    try:
        from .bench import collect_env

        env.update(collect_env(a.device))
    except Exception as e:  # noqa: BLE001 - the environment is informational
        env["env_error"] = str(e)

    def progress(i: int, n: int, r: CaseResult) -> None:
        if a.quiet:
            return
        if r.status == "fail" or i == n or i % 50 == 0:
            print(f"[{i}/{n}] {r.status:4s} {r.case.name}", file=sys.stderr, flush=True)

    report = run_validate(libs, cases, a.seed, baseline=a.baseline, device=a.device, progress=progress, env=env)
    if a.json:
        with open(a.json, "w") as f:
            f.write(report.to_json())
    for line in report.failures:
        print(f"MISMATCH {line}")
    if a.strict:
        for line in report.skipped:
            print(f"SKIPPED {line}")
    print(report.summary_line())
    if not report.ok:
        if report.n_passed == 0 and report.n_failed == 0:
            print("nothing was validated: every configuration was skipped (not built?)")
        return EXIT_MISMATCH
    if a.strict and report.skipped:
        return EXIT_MISMATCH
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
