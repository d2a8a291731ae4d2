"""Result types of validate and bench: data and JSON only (rich tables: kvpatch.render)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from . import stats
from .points import BenchPoint
from .reference import ALIBI_BIAS_TOLERANCE, REF_TOLERANCE

if TYPE_CHECKING:  # pragma: no cover
    from .validate import ValidateCase


def json_safe(obj: Any) -> Any:
    """A copy that strict JSON accepts: NaN / inf as strings, tuples as lists, other
    unknown objects through ``str``."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return str(obj)


def dumps(d: Any, indent: int | None = 1) -> str:
    return json.dumps(json_safe(d), indent=indent, allow_nan=False) + "\n"


# --------------------------------------------------------------------------- validate


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
    case: "ValidateCase"
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
    #: The matrix's name (quick / default / full / custom) and how it was sampled.
    matrix: str = "custom"
    sampling: str = ""
    #: A skipped configuration is a failure too (``--full``: everything vLLM builds must run).
    strict: bool = False

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
        """No failure, at least one configuration checked (and, when strict, none skipped)."""
        return self.n_failed == 0 and self.n_passed > 0 and not (self.strict and self.skipped)

    def identical_counts(self) -> dict[str, dict[str, int]]:
        """Per variant: configurations checked and how many were bit-identical to the baseline."""
        out: dict[str, dict[str, int]] = {}
        for r in self.results:
            for name, vc in r.variants.items():
                c = out.setdefault(name, {"checked": 0, "identical": 0})
                c["checked"] += 1
                c["identical"] += int(vc.identical)
        return out

    def mismatch_groups(self) -> dict[str, int]:
        """Failing configurations grouped by variant, dtype, ALiBi, head and block size (where the bits differ)."""
        out: dict[str, int] = {}
        for r in self.results:
            for name, vc in r.variants.items():
                if vc.status == "fail":
                    c = r.case
                    key = (f"{name}: {c.dtype} kv={c.kv_cache_dtype} alibi={'on' if c.alibi else 'off'} "
                           f"head={c.head_size} block={c.block_size}")  # fmt: skip
                    out[key] = out.get(key, 0) + 1
        return out

    def max_ref_error(self) -> dict[str, float]:
        """Worst stock-vs-reference error per ``dtype/kv_cache_dtype``."""
        worst: dict[str, float] = {}
        for r in self.results:
            if r.ref_error is not None:
                key = f"{r.case.dtype}/{r.case.kv_cache_dtype}"
                worst[key] = max(worst.get(key, 0.0), r.ref_error)
        return worst

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "kvpatch-validate",
            "version": 2,
            "ok": self.ok,
            "matrix": self.matrix,
            "sampling": self.sampling,
            "strict": self.strict,
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
            "identical": self.identical_counts(),
            "mismatch_groups": self.mismatch_groups(),
            "max_ref_error": self.max_ref_error(),
            "tolerance": dict(REF_TOLERANCE),
            "alibi_bias_tolerance": ALIBI_BIAS_TOLERANCE,
            "failures": self.failures,
            "skipped": self.skipped,
            "env": self.env,
            "results": [r.to_dict() for r in self.results],
        }

    def to_json(self, indent: int | None = 1) -> str:
        return dumps(self.to_dict(), indent)

    def summary_line(self) -> str:
        errs = ", ".join(f"{d} {e:.1e}" for d, e in sorted(self.max_ref_error().items()))
        return (
            f"{len(self.results)} configurations ({self.matrix}) x {len(self.variants) - 1} variant(s): "
            f"{self.n_passed} passed, {self.n_failed} failed, {len(self.skipped)} skipped"
            + (f"; worst stock-vs-reference rel-L2: {errs}" if errs else "")
        )


# --------------------------------------------------------------------------- bench


@dataclass
class VariantTiming:
    """One variant at one (point, kernel, mode). Times in microseconds."""

    samples_us: list[list[float]]  # per round
    median_us: float = 0.0  # median of the round medians
    round_medians_us: list[float] = field(default_factory=list)
    p10_us: float = 0.0
    p90_us: float = 0.0
    q1_us: float = 0.0
    q3_us: float = 0.0
    speedup: float = 1.0  # baseline median / this median
    speedup_rounds: list[float] = field(default_factory=list)
    #: The speedup's spread (stats.speedup_interval) and what it says against 1.00.
    speedup_lo: float = 1.0
    speedup_hi: float = 1.0
    verdict: str = stats.NOISE
    kv_bytes_per_s: float = 0.0
    copy_fraction: float = 0.0
    outputs_match: bool | None = None

    @classmethod
    def from_samples(cls, samples_us: list[list[float]]) -> "VariantTiming":
        pooled = [x for r in samples_us for x in r]
        rm = [stats.median(r) for r in samples_us if r]
        return cls(
            samples_us=samples_us,
            median_us=stats.median(rm),
            round_medians_us=rm,
            p10_us=stats.quantile(pooled, 0.10),
            p90_us=stats.quantile(pooled, 0.90),
            q1_us=stats.quantile(pooled, 0.25),
            q3_us=stats.quantile(pooled, 0.75),
        )

    @property
    def spread(self) -> float:
        """(p90 - p10) / median."""
        return (self.p90_us - self.p10_us) / self.median_us if self.median_us else math.nan


@dataclass
class BenchResult:
    point: BenchPoint
    kernel: str
    mode: str
    variants: dict[str, VariantTiming]
    reps: int = 0
    #: Indices into BenchReport.rounds: the windows this result was timed in.
    rounds: list[int] = field(default_factory=list)
    #: True when any of those rounds ran power-capped or throttled (nvidia-smi).
    flagged: bool = False

    @property
    def dispatched(self) -> bool:
        return self.kernel == self.point.dispatched

    def to_dict(self) -> dict[str, Any]:
        return {
            "point": self.point.to_dict(),
            "name": self.point.name,
            "kernel": self.kernel,
            "mode": self.mode,
            "dispatched": self.dispatched,
            "kv_bytes": self.point.kv_bytes,
            "reps": self.reps,
            "rounds": self.rounds,
            "flagged": self.flagged,
            "variants": {n: asdict(v) for n, v in self.variants.items()},
        }


def finish_results(
    raw: Mapping[tuple[BenchPoint, str, str], Mapping[str, list[list[float]]]],
    names: Sequence[str],
    copy_bytes_per_s: float,
    outputs_match: Mapping[tuple[BenchPoint, str], Mapping[str, bool]] | None = None,
) -> list[BenchResult]:
    """Raw per-round samples -> results with stats, speedups, intervals and throughput."""
    base = names[0]
    out: list[BenchResult] = []
    for (point, kernel, mode), per_var in raw.items():
        timings = {n: VariantTiming.from_samples(per_var[n]) for n in names if n in per_var}
        b = timings[base]
        for n, t in timings.items():
            t.speedup = b.median_us / t.median_us
            t.speedup_rounds = [x / y for x, y in zip(b.round_medians_us, t.round_medians_us)]
            t.speedup_lo, t.speedup_hi = stats.speedup_interval(b.samples_us, t.samples_us)
            t.verdict = stats.verdict(t.speedup_lo, t.speedup_hi) if n != base else stats.NOISE
            t.kv_bytes_per_s = point.kv_bytes / (t.median_us * 1e-6)
            t.copy_fraction = t.kv_bytes_per_s / copy_bytes_per_s if copy_bytes_per_s else math.nan
            if outputs_match is not None and (point, kernel) in outputs_match:
                t.outputs_match = outputs_match[(point, kernel)].get(n)
        reps = max((len(s) for s in per_var[base]), default=0)
        out.append(BenchResult(point, kernel, mode, timings, reps=reps))
    return out


#: The marker a library of stock's unpatched header records (``variant_info[name]["marker"]``).
STOCK_MARKER = "stock"

#: ``stock_code(variant, result)``: True where that variant compiles the result's kernel exactly
#: as stock, False where it does not, None where it cannot say.
StockCode = Callable[[str, "BenchResult"], "bool | None"]


def stock_code_of(variant_info: Mapping[str, Any], baseline: str) -> StockCode:
    """From each variant's configuration marker (``variant_info``): whether it compiles a
    result's kernel as stock -- a rule turns it off, or its cache is quantized under
    ``quantized=skip`` (what ``kvpatch build`` checks in the SASS), or its marker is
    :data:`STOCK_MARKER` (bench's A/A control). A timing there compares stock's code with
    itself: it measures the bench's noise floor, not the patch."""
    from ..errors import UsageError
    from ..tune import candidate_configs

    configs: dict[str, Any] = {}
    stock = {n for n, i in variant_info.items() if n != baseline and i.get("marker") == STOCK_MARKER}
    for name, info in variant_info.items():
        if name in stock:
            continue
        try:
            configs.update(candidate_configs({name: info}, baseline))
        except UsageError:  # no marker kvpatch can read: it cannot say
            continue

    def stock_code(name: str, r: BenchResult) -> bool | None:
        if name in stock:
            return True
        cfg = configs.get(name)
        if cfg is None:
            return None
        p = r.point
        return not cfg.prefetches(p.dtype, p.head_size, p.block_size, p.kv_cache_dtype, r.kernel)

    return stock_code


def summarize_results(results: Iterable[BenchResult], names: Sequence[str],
                      stock_code: StockCode | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Speedup statistics per variant x dtype x mode x scope, where scope is
    ``dispatched`` (the kernel vLLM launches at each point: the headline), ``v1`` or
    ``v2`` (that kernel at every point). Each row also counts the points whose
    interval lies above 1.00 (faster), below it (slower) or across it (noise), and
    the points timed in a power-capped or throttled round. With ``stock_code``,
    ``slower_stock_code`` counts the slower points whose kernel the variant compiles
    exactly as stock (None where it cannot say for every slower point)."""
    results = list(results)
    rows: list[dict[str, Any]] = []
    dtypes = list(dict.fromkeys(r.point.dtype for r in results))
    modes = list(dict.fromkeys(r.mode for r in results))
    kernels = list(dict.fromkeys(r.kernel for r in results))
    for name in names[1:]:
        for dt in dtypes:
            for mode in modes:
                for scope in ["dispatched", *kernels]:
                    sel = [
                        r for r in results
                        if r.point.dtype == dt and r.mode == mode and name in r.variants
                        and (r.dispatched if scope == "dispatched" else r.kernel == scope)
                    ]  # fmt: skip
                    if not sel:
                        continue
                    v = [r.variants[name] for r in sel]
                    row = {"variant": name, "dtype": dt, "mode": mode, "scope": scope,
                           **stats.summarize([t.speedup for t in v])}  # fmt: skip
                    for verdict in (stats.FASTER, stats.SLOWER, stats.NOISE):
                        row[verdict] = sum(t.verdict == verdict for t in v)
                    row["worst_hi"] = min(t.speedup_hi for t in v)
                    row["flagged"] = sum(r.flagged for r in sel)
                    known = [stock_code(name, r) if stock_code else None
                             for r in sel if r.variants[name].verdict == stats.SLOWER]  # fmt: skip
                    row["slower_stock_code"] = None if None in known else sum(known)
                    rows.append(row)
    return rows


@dataclass
class BenchReport:
    baseline: str
    variants: list[str]
    results: list[BenchResult]
    copy_bandwidth: dict[str, Any]
    settings: dict[str, Any]
    env: dict[str, Any] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: The point set (tuning / headline / heldout / custom).
    point_set: str = "custom"
    #: Per variant: its exact configuration (marker line), compile flags, library.
    variant_info: dict[str, Any] = field(default_factory=dict)
    #: One entry per (round, pool): time window and nvidia-smi summary.
    rounds: list[dict[str, Any]] = field(default_factory=list)
    skipped_points: list[str] = field(default_factory=list)

    @property
    def summary(self) -> list[dict[str, Any]]:
        return summarize_results(self.results, self.variants, stock_code_of(self.variant_info, self.baseline))

    @property
    def ok(self) -> bool:
        return not self.mismatches

    @property
    def flagged_rounds(self) -> int:
        return sum(bool((r.get("smi") or {}).get("flagged")) for r in self.rounds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "kvpatch-bench",
            "version": 2,
            "point_set": self.point_set,
            "baseline": self.baseline,
            "variants": self.variants,
            "variant_info": self.variant_info,
            "seconds": self.seconds,
            "env": self.env,
            "settings": self.settings,
            "copy_bandwidth": self.copy_bandwidth,
            "mismatches": self.mismatches,
            "warnings": self.warnings,
            "skipped_points": self.skipped_points,
            "flagged_rounds": self.flagged_rounds,
            "rounds": self.rounds,
            "summary": self.summary,
            "results": [r.to_dict() for r in self.results],
        }

    def to_json(self, indent: int | None = 1) -> str:
        return dumps(self.to_dict(), indent)
