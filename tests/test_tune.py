"""kvpatch.tune's pure parts: the grid, scoring a bench report, choosing per dtype."""

from __future__ import annotations

import math

from kvpatch.config import make_config
from kvpatch.tune import Score, candidates, choose, combine, score


def test_the_grid_is_every_combination_and_uniform() -> None:
    grid = candidates()
    assert len(grid) == 16
    assert len({c.marker() for c in grid.values()}) == 16
    assert all(c.overrides == () for c in grid.values())
    assert grid["call_kvhead_la2_el"].scope == "kv-head"
    assert grid["call_kvhead_la2_el"].cache_hint == "evict_last"
    assert grid["inline_cta_la1_nh"].issue == "inline"


def _bench(speedups: dict[str, dict[str, list[float]]]) -> dict:
    """A bench report dict: speedups[variant][dtype] at dispatched points, plus a v1
    result at each point that is not dispatched (ignored by score)."""
    results = []
    dtypes = {d for per in speedups.values() for d in per}
    for dtype in sorted(dtypes):
        n = len(next(iter(speedups.values()))[dtype])
        for i in range(n):
            variants = {"stock": {"speedup": 1.0}}
            variants |= {name: {"speedup": per[dtype][i]} for name, per in speedups.items()}
            results.append({"point": {"dtype": dtype}, "dispatched": True, "variants": variants})
            results.append({"point": {"dtype": dtype}, "dispatched": False,
                            "variants": {k: {"speedup": 0.1} for k in variants}})  # fmt: skip
    return {"baseline": "stock", "results": results}


def test_score_uses_dispatched_points_and_validation() -> None:
    bench = _bench({"a": {"fp16": [1.1, 0.9]}, "b": {"fp16": [1.2, 1.3]}})
    scores = {s.name: s for s in score(bench, {"b": {"fp16"}})}
    assert scores["a"].speedups == (1.1, 0.9)
    assert scores["a"].bit_identical and not scores["b"].bit_identical
    assert math.isclose(scores["a"].geomean, math.sqrt(1.1 * 0.9))
    assert scores["a"].worst == 0.9


def test_choose_prefers_bit_identical_then_never_slower_then_geomean() -> None:
    s = [
        Score("fast-but-wrong", "fp16", (2.0, 2.0), bit_identical=False),
        Score("faster-dips", "fp16", (1.5, 0.99), bit_identical=True),
        Score("steady", "fp16", (1.05, 1.02), bit_identical=True),
        Score("steadier", "fp16", (1.03, 1.01), bit_identical=True),
    ]
    assert [x.name for x in choose(s)["fp16"]] == ["steady", "steadier", "faster-dips", "fast-but-wrong"]


def test_combine_gives_fp16_its_own_table_and_bf16_the_base() -> None:
    configs = candidates()
    ranked = {
        "bf16": [Score("call_cta_la1_nh", "bf16", (1.3,), True)],
        "fp16": [Score("inline_kvhead_la1_nh", "fp16", (1.1,), True)],
    }
    cfg, picked = combine(ranked, configs)
    assert picked == {"bf16": "call_cta_la1_nh", "fp16": "inline_kvhead_la1_nh"}
    assert cfg == make_config()  # what the H200 measurements made the default


def test_combine_skips_an_fp16_winner_that_clashes_with_the_base_helper() -> None:
    configs = candidates()
    ranked = {
        "bf16": [Score("call_cta_la1_nh", "bf16", (1.3,), True)],
        "fp16": [
            Score("call_kvhead_la1_el", "fp16", (1.2,), True),  # call with another hint: clashes
            Score("inline_kvhead_la2_el", "fp16", (1.1,), True),
        ],
    }
    cfg, picked = combine(ranked, configs)
    assert picked["fp16"] == "inline_kvhead_la2_el"
    assert cfg.for_dtype("fp16").issue == "inline" and cfg.for_dtype("fp16").lookahead == 2
    assert cfg.for_dtype("bf16").issue == "call" and cfg.for_dtype("bf16").cache_hint == "none"


def test_combine_never_writes_a_candidate_that_failed_validation() -> None:
    configs = candidates()
    ranked = {
        "bf16": [Score("inline_cta_la1_nh", "bf16", (1.5,), False), Score("call_cta_la2_nh", "bf16", (1.2,), True)],
        "fp16": [Score("inline_kvhead_la1_nh", "fp16", (1.3,), False)],
    }
    cfg, picked = combine(ranked, configs)
    assert picked == {"bf16": "call_cta_la2_nh", "fp16": "off"}
    assert cfg.for_dtype("bf16").lookahead == 2 and cfg.for_dtype("bf16").issue == "call"
    assert cfg.for_dtype("fp16").off and cfg.resolve("fp16", 128, 16).off


def test_combine_turns_a_dtype_off_when_no_candidate_is_bit_identical() -> None:
    ranked = {"bf16": [Score("inline_cta_la1_nh", "bf16", (1.5,), False)]}
    cfg, picked = combine(ranked, candidates())
    assert picked["bf16"] == "off" and cfg.resolve("bf16", 128, 16).off
    assert not cfg.resolve("fp32", 128, 16).off
