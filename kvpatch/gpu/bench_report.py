"""Result types of bench: per point and variant the timings, per run the summary (data and
JSON only; rich tables: kvpatch.render)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

from . import stats
from .points import BenchPoint
from .report import STOCK_MARKER, dumps


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
    #: Whether this variant's launch at the point took the grouped form (its library's launch
    #: counter around the output check); None: not checked, or a library without a grouped form.
    grouped: bool | None = None

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
    grouped: Mapping[tuple[BenchPoint, str], Mapping[str, bool | None]] | None = None,
) -> list[BenchResult]:
    """Raw per-round samples -> results with stats, speedups, intervals and throughput
    (``outputs_match``, ``grouped``: per (point, kernel) and variant, from the output check)."""
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
            if grouped is not None and (point, kernel) in grouped:
                t.grouped = grouped[(point, kernel)].get(n)
        reps = max((len(s) for s in per_var[base]), default=0)
        out.append(BenchResult(point, kernel, mode, timings, reps=reps))
    return out


#: ``stock_code(variant, dtype, head_size, block_size, kv_cache_dtype, kernel, grouped)``: True
#: where that variant ran stock's code at one point, False where it did not, None where it
#: cannot say (:func:`stock_code_of`).
StockCode = Callable[[str, str, int, int, str, str, "bool | None"], "bool | None"]


def stock_code_of(variant_info: Mapping[str, Any], baseline: str) -> StockCode:
    """From each variant's configuration marker (``variant_info``): whether it ran stock's code at
    a point. Not where its launch took the grouped form (``grouped``, measured), nor where it
    compiles the kernel with the prefetch; where neither, the kernel is stock's -- a rule turns it
    off, or its cache is quantized under ``quantized=skip`` (what ``kvpatch build`` checks in the
    SASS) -- unless the kernel has a grouped form and no launch was checked (None: cannot say).
    A variant whose marker is :data:`STOCK_MARKER` (bench's A/A control) always runs it. A timing
    on stock's code compares stock with itself: it measures the bench's noise floor, not the patch."""
    from ..config import config_from_marker
    from ..errors import UsageError

    configs: dict[str, Any] = {}
    stock = {n for n, i in variant_info.items() if n != baseline and i.get("marker") == STOCK_MARKER}
    for name, info in variant_info.items():
        if name in stock or name == baseline:
            continue
        try:
            configs[name] = config_from_marker(str(info.get("marker", "")))
        except UsageError:  # no marker kvpatch can read: it cannot say
            continue

    def stock_code(name: str, dtype: str, head_size: int, block_size: int, kv_cache_dtype: str, kernel: str,
                   grouped: bool | None) -> bool | None:  # fmt: skip
        if name in stock:
            return True
        cfg = configs.get(name)
        if cfg is None:
            return None
        if grouped or cfg.prefetches(dtype, head_size, block_size, kv_cache_dtype, kernel):
            return False
        if grouped is False:
            return True
        return None if cfg.resolve(dtype, head_size, block_size, kv_cache_dtype, kernel).group > 1 else True

    return stock_code


#: ``code(variant, dtype, head_size, block_size, kv_cache_dtype, kernel, grouped)``: which code that
#: variant ran at one point, equal for two variants that ran the same code; None where it cannot
#: say (:func:`code_of`).
CodeOf = Callable[[str, str, int, int, str, str, "bool | None"], "Hashable | None"]

#: :data:`CodeOf`'s answer where a variant ran stock's code.
STOCK_CODE = "stock"


def code_of(variant_info: Mapping[str, Any], baseline: str) -> CodeOf:
    """Which code each variant ran at a point: :data:`STOCK_CODE` where :func:`stock_code_of`
    says stock's; else, where its build recorded its kernels' SASS (``variant_info[name]['code']``,
    :meth:`kvpatch.jit.result.VariantResult.code`) for this very library (its sha256 the one
    measured of the file loaded), the digest of the form it launched (``grouped``, measured) with,
    for the grouped form, the grouping settings its launcher decides by. None where it cannot say:
    no digest, another file, the form not checked. Two variants with the same answer ran the same
    SASS in the same launches: what one measures against the other there is the bench's noise."""
    stock_code = stock_code_of(variant_info, baseline)
    from ..config import config_from_marker
    from ..config.model import GROUPING
    from ..config.selector import kernel_selector
    from ..errors import UsageError

    digests: dict[str, Mapping[str, Any]] = {}
    configs: dict[str, Any] = {}
    for name, info in variant_info.items():
        code = info.get("code")
        if not isinstance(code, Mapping) or not isinstance(code.get("kernels"), Mapping):
            continue
        if not info.get("sha256") or code.get("library_sha256") != info.get("sha256"):
            continue  # recorded for another build of the library than the one measured
        try:
            configs[name] = config_from_marker(str(info.get("marker", "")))
        except UsageError:
            continue
        digests[name] = code["kernels"]

    def code(name: str, dtype: str, head_size: int, block_size: int, kv_cache_dtype: str, kernel: str,
             grouped: bool | None) -> Hashable | None:  # fmt: skip
        stock = stock_code(name, dtype, head_size, block_size, kv_cache_dtype, kernel, grouped)
        if stock:
            return STOCK_CODE
        if stock is None or name not in digests:
            return None
        sel = kernel_selector(dtype, head_size, block_size, kv_cache_dtype, kernel)
        own = configs[name].resolve(dtype, head_size, block_size, kv_cache_dtype, kernel)
        if grouped is None and own.group > 1:
            return None  # either form may have run
        if not grouped:
            form = digests[name].get(sel)
            return ("form", sel, form) if isinstance(form, str) and form else None
        form = digests[name].get(sel + " grouped")
        if not isinstance(form, str) or not form:
            return None
        return ("grouped", sel, form, tuple((k, getattr(own, k)) for k in GROUPING))

    return code


def result_stock_code(stock_code: StockCode, name: str, r: BenchResult) -> bool | None:
    """:data:`StockCode` at one result."""
    p = r.point
    return stock_code(name, p.dtype, p.head_size, p.block_size, p.kv_cache_dtype, r.kernel, r.variants[name].grouped)


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
                    known = [result_stock_code(stock_code, name, r) if stock_code else None
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
