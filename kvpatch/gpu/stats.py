"""The statistics kvpatch reports: one median, quantile and geomean for every module."""

from __future__ import annotations

import math
import statistics
from typing import Sequence


def median(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("median of no values")
    return float(statistics.median(xs))


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), q in [0, 1]."""
    if not xs:
        raise ValueError("quantile of no values")
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def geomean(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("geomean of no values")
    if any(not x > 0 for x in xs):
        raise ValueError("geomean needs positive values")
    return float(math.exp(sum(math.log(x) for x in xs) / len(xs)))


def summarize(xs: Sequence[float]) -> dict[str, float | int]:
    """min / median / geomean / max / n of positive numbers (speedups)."""
    return {"n": len(xs), "min": float(min(xs)), "median": median(xs), "geomean": geomean(xs), "max": float(max(xs))}


#: How a speedup interval compares with 1.00 (stock).
FASTER, SLOWER, NOISE = "faster", "slower", "noise"
VERDICTS = (FASTER, SLOWER, NOISE)


def verdict(lo: float, hi: float) -> str:
    """``slower`` only when the whole interval lies below 1.00, ``faster`` when it lies
    above, ``noise`` when it contains 1.00 (or is NaN)."""
    if hi < 1.0:
        return SLOWER
    if lo > 1.0:
        return FASTER
    return NOISE


def ratio_stats(base: Sequence[float], times: Sequence[float]) -> dict[str, float | list[float]]:
    """Per-round ``base / time`` ratios (one value per round each): ``{median, min, max, rounds}``."""
    r = [b / t for b, t in zip(base, times)]
    return {"median": median(r), "min": min(r), "max": max(r), "rounds": r}


def speedup_interval(
    base_rounds: Sequence[Sequence[float]], var_rounds: Sequence[Sequence[float]]
) -> tuple[float, float]:
    """The spread of a speedup (baseline time / variant time) from per-round samples.

    With two or more rounds: min..max over rounds of the per-round ratio of medians
    (each round interleaves the variants, so a round's ratio sees the same drift).
    With one round: the ratio of the quartiles, base q1 / variant q3 .. base q3 /
    variant q1 (a conservative box).
    """
    pairs = [(b, v) for b, v in zip(base_rounds, var_rounds) if b and v]
    if not pairs:
        return math.nan, math.nan
    if len(pairs) >= 2:
        r = ratio_stats([median(b) for b, _ in pairs], [median(v) for _, v in pairs])
        return r["min"], r["max"]
    b, v = pairs[0]
    return quantile(b, 0.25) / quantile(v, 0.75), quantile(b, 0.75) / quantile(v, 0.25)
