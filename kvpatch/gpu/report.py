"""Result types of validate (and what every report's JSON shares): data and JSON only
(rich tables: kvpatch.render; bench's types: :mod:`.bench_report`)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from .reference import ALIBI_BIAS_TOLERANCE, REF_TOLERANCE

if TYPE_CHECKING:  # pragma: no cover
    from .cases import ValidateCase

#: The marker a library of stock's unpatched header records (``variant_info[name]["marker"]``).
STOCK_MARKER = "stock"


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
    #: Whether the grouped form (``group`` > 1) served this configuration; None: the library has none.
    grouped: bool | None = None


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

    def grouped_counts(self) -> dict[str, dict[str, int]]:
        """Per variant with a grouped form: configurations checked and how many of them it served
        (the others fell back to vLLM's form: MHA, ALiBi, fp8, too few CTAs)."""
        out: dict[str, dict[str, int]] = {}
        for r in self.results:
            for name, vc in r.variants.items():
                if vc.grouped is not None:
                    c = out.setdefault(name, {"checked": 0, "grouped": 0})
                    c["checked"] += 1
                    c["grouped"] += int(vc.grouped)
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
            "grouped": self.grouped_counts(),
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
