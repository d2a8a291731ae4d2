"""kvpatch.gpu.stats: median, quantile, geomean, and the speedup interval and its verdict
(``slower`` only when the whole interval lies below 1.00)."""

from __future__ import annotations

import math

import pytest

from kvpatch.gpu import stats as S


def test_statistics():
    xs = [0.5, 1.0, 2.0, 4.0]
    assert S.geomean(xs) == pytest.approx(math.sqrt(2))
    assert S.median(xs) == 1.5
    assert S.quantile([1, 2, 3, 4, 5], 0.1) == pytest.approx(1.4)
    assert S.quantile([3.0], 0.9) == 3.0
    s = S.summarize([1.1, 0.9, 1.21])
    assert s["n"] == 3 and s["min"] == 0.9 and s["median"] == 1.1 and s["max"] == 1.21
    assert s["geomean"] == pytest.approx((1.1 * 0.9 * 1.21) ** (1 / 3))
    for empty in (S.geomean, S.median, lambda xs: S.quantile(xs, 0.5)):
        with pytest.raises(ValueError):
            empty([])
    with pytest.raises(ValueError):
        S.geomean([1.0, 0.0])


def test_speedup_interval_and_verdict():
    base = [[10.0, 10.0], [10.0, 10.0], [10.0, 10.0]]
    faster = [[8.0, 8.0], [9.0, 9.0], [7.0, 7.0]]
    lo, hi = S.speedup_interval(base, faster)
    assert (lo, hi) == (pytest.approx(10 / 9), pytest.approx(10 / 7)) and S.verdict(lo, hi) == S.FASTER
    slower = [[11.0], [12.0], [10.5]]
    assert S.verdict(*S.speedup_interval([[10.0]] * 3, slower)) == S.SLOWER
    mixed = [[9.5], [10.5], [10.0]]
    assert S.verdict(*S.speedup_interval([[10.0]] * 3, mixed)) == S.NOISE
    # one round: the quartile box
    lo, hi = S.speedup_interval([[9.0, 10.0, 11.0, 12.0, 10.0]], [[9.0, 10.0, 11.0, 12.0, 10.0]])
    assert lo < 1.0 < hi
    assert math.isnan(S.speedup_interval([[]], [[]])[0])
    assert S.verdict(math.nan, math.nan) == S.NOISE


def test_a_round_that_disagrees_keeps_the_verdict_at_noise():
    """The interval spans the rounds: one round against the rest is enough to call it noise."""
    base = [[10.0]] * 4
    assert S.verdict(*S.speedup_interval(base, [[9.0], [9.0], [9.0], [9.0]])) == S.FASTER
    assert S.verdict(*S.speedup_interval(base, [[9.0], [9.0], [9.0], [10.5]])) == S.NOISE
