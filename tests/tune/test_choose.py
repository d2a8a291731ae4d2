"""Scoring a bench report per candidate and kernel, choosing per kernel (strict and geomean),
and writing the picks as one configuration."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from tune_helpers import bench_report, pick

from kvpatch.config import config_from_marker, make_config
from kvpatch.tune import Score, candidates, choose, combine, parse_grid, score, validation_failures


def test_score_is_per_kernel_on_dispatched_points() -> None:
    bench = bench_report({"a": {"fp16/128/16/auto/v2": [1.1, 0.9], "fp16/128/16/auto/v1": [1.3, 1.2]},
                    "b": {"fp16/128/16/auto/v2": [1.2, 1.3], "fp16/128/16/auto/v1": [1.0, 1.0]}})  # fmt: skip
    scores = {(s.name, s.selector): s for s in score(bench, {"b": {"fp16/128/16/auto/v2"}})}
    a = scores[("a", "fp16/128/16/auto/v2")]
    assert a.speedups == (1.1, 0.9) and a.bit_identical and a.slower == 1 and a.worst == 0.9
    assert math.isclose(a.geomean, math.sqrt(1.1 * 0.9))
    assert not scores[("b", "fp16/128/16/auto/v2")].bit_identical and scores[("b", "fp16/128/16/auto/v1")].bit_identical
    assert scores[("a", "fp16/128/16/auto/v1")].speedups == (1.3, 1.2) and len(scores) == 4


def test_the_geomean_interval_is_over_rounds() -> None:
    s = Score("a", "fp16/128/16/auto/v2", (1.1, 1.2), True, 0, ((1.0, 1.1), (1.2, 1.3)))
    lo, hi = s.geomean_interval
    assert math.isclose(lo, math.sqrt(1.0 * 1.1)) and math.isclose(hi, math.sqrt(1.2 * 1.3))
    assert s.qualifies()  # lo > 1
    assert not Score("a", "x", (1.05, 1.0), True, 0, ((0.99, 0.99), (1.1, 1.1))).qualifies()


def test_choose_strict_refuses_any_slower_point_and_geomean_does_not() -> None:
    scores = [
        Score("fast-but-wrong", "fp16/128/16/auto/v2", (2.0, 2.0), False),
        Score("faster-dips", "fp16/128/16/auto/v2", (1.5, 0.95), True, slower=1),
        Score("steady", "fp16/128/16/auto/v2", (1.05, 1.02), True),
        Score("steadier", "fp16/128/16/auto/v2", (1.03, 1.01), True),
        Score("only-slower", "bf16/64/32/auto/v1", (0.9, 0.95), True, slower=2),
        Score("dips", "bf16/256/16/auto/v2", (1.4, 0.97), True, slower=1),
    ]
    strict = choose(scores)
    assert strict["fp16/128/16/auto/v2"].name == "steady"
    assert strict["bf16/64/32/auto/v1"].name == "off" and strict["bf16/256/16/auto/v2"].name == "off"
    assert [s.name for s in strict["fp16/128/16/auto/v2"].ranked] == [
        "steady",
        "steadier",
        "faster-dips",
        "fast-but-wrong",
    ]
    loose = choose(scores, "geomean")
    assert loose["fp16/128/16/auto/v2"].name == "faster-dips" and loose["bf16/256/16/auto/v2"].name == "dips"
    assert loose["bf16/64/32/auto/v1"].name == "off"  # a geomean below 1 never qualifies
    with pytest.raises(ValueError):
        choose(scores, "fastest")


def test_a_slower_point_on_stock_code_is_the_noise_floor_not_held_against_the_candidate() -> None:
    """Before: a rule that turns a kernel off but groups it (stock's code below the grouped form's
    launches) lost the kernel to one 0.99 at a point where its grouped form was not taken. After:
    that point, stock against itself, is counted apart; the same dip where the grouped form ran
    still rules it out; a candidate on stock's code at every point is never picked."""
    sel = "bf16/128/32/auto/v2"
    bench = bench_report({"grouped": {sel: [(0.99, [0.99, 0.99]), 1.6, 1.7]},
                          "plain_off": {sel: [(0.99, [0.99, 0.99]), 1.01, 1.02]}})  # fmt: skip
    for i, took in enumerate((False, True, True)):
        bench["results"][2 * i]["variants"]["grouped"]["grouped"] = took
    bench["variant_info"] = {
        "stock": {"marker": "stock"},
        "grouped": {"marker": make_config(inherit_rules=False, bf16="off", group=4).marker()},
        "plain_off": {"marker": make_config(inherit_rules=False, bf16="off").marker()},
    }
    scores = {s.name: s for s in score(bench, {})}
    g, p = scores["grouped"], scores["plain_off"]
    assert (g.slower, g.slower_stock_code, g.stock_points) == (0, 1, 1) and g.qualifies()
    assert (p.slower, p.slower_stock_code, p.stock_points) == (0, 1, 3) and p.only_stock and not p.qualifies()
    picked = choose(scores.values())[sel]
    assert picked.name == "grouped" and [s.name for s in picked.ranked] == ["grouped", "plain_off"]
    bench["results"][0]["variants"]["grouped"]["grouped"] = True  # the dip where its own form ran
    assert choose(score(bench, {}))[sel].name == "off"
    del bench["results"][0]["variants"]["grouped"]["grouped"]  # not measured: cannot say, held against it
    assert choose(score(bench, {}))[sel].name == "off"


def test_a_candidate_that_failed_validation_is_never_picked() -> None:
    scores = [
        Score("inline_cta_la1", "bf16/128/32/auto/v1", (1.6, 1.5), False),
        Score("call_cta_la2", "bf16/128/32/auto/v1", (1.1,), True),
    ]
    assert choose(scores, "geomean")["bf16/128/32/auto/v1"].name == "call_cta_la2"
    assert choose(scores[:1], "geomean")["bf16/128/32/auto/v1"].name == "off"


def test_validation_failures_map_cases_to_kernels() -> None:
    from kvpatch.gpu.validate import ValidateCase

    def case(dtype, head, block, kernel="v1"):
        return ValidateCase(dtype, "auto", head, block, kernel, 8, 2, True, 17)

    ok = SimpleNamespace(status="pass")
    bad = SimpleNamespace(status="fail")
    results = [
        SimpleNamespace(case=case("bf16", 128, 32), reasons=[], variants={"a": bad, "b": ok}),
        SimpleNamespace(case=case("fp16", 64, 16), reasons=["stock wrote NaN"], variants={"a": ok, "b": ok}),
        SimpleNamespace(case=case("fp16", 128, 16), reasons=[], variants={"a": ok, "b": ok}),
        SimpleNamespace(case=case("bf16", 128, 32, "v2"), reasons=[], variants={"a": ok, "b": bad}),
    ]
    assert validation_failures(SimpleNamespace(results=results)) == {
        "a": {"bf16/128/32/auto/v1", "fp16/64/16/auto/v1"}, "b": {"fp16/64/16/auto/v1", "bf16/128/32/auto/v2"}}  # fmt: skip


def test_combine_writes_a_rule_per_instantiation_or_per_kernel_and_off_elsewhere() -> None:
    configs = candidates()
    picks = {p.selector: p for p in (
        pick("fp16/128/16/auto/v1", "inline_kvhead_la1"), pick("fp16/128/16/auto/v2", "inline_kvhead_la1"),
        pick("bf16/128/16/auto/v1", "call_cta_la1"), pick("bf16/128/16/auto/v2", "inline_cta_la2"),
        pick("bf16/64/32/auto/v1", None), pick("bf16/64/32/auto/v2", None))}  # fmt: skip
    cfg = combine(picks, configs)
    for kernel in ("v1", "v2", None):
        r = cfg.resolve("fp16", 128, 16, "auto", kernel)
        assert (r.issue, r.scope, r.lookahead, r.off) == ("inline", "kv-head", 1, False)
    r = cfg.resolve("bf16", 128, 16, "auto", "v1")
    assert (r.issue, r.scope, r.lookahead, r.off) == ("call", "cta", 1, False)
    r = cfg.resolve("bf16", 128, 16, "auto", "v2")
    assert (r.issue, r.scope, r.lookahead, r.off) == ("inline", "cta", 2, False)
    assert cfg.resolve("bf16", 64, 32, "auto", "v1").off and cfg.resolve("bf16", 64, 32).off
    # what tune did not measure is off (the fallback): other sizes, fp32, fp8 caches
    assert cfg.resolve("fp16", 96, 16).off and cfg.resolve("fp32", 128, 16).off and cfg.resolve("bf16", 128, 8).off
    assert cfg.resolve("fp16", 128, 16, "fp8", "v1").off and cfg.quantized == "skip"
    # one rule where both kernels agree, one per kernel where they differ; no default rule survives
    sels = {sel for sel, _ in cfg.overrides}
    assert sels == {"fp16", "bf16", "fp32", "fp16/128/16/auto", "bf16/128/16/auto/v1", "bf16/128/16/auto/v2",
                    "bf16/64/32/auto"}  # fmt: skip
    assert config_from_marker(cfg.marker()) == cfg
    base = combine(picks, configs, fallback="base")
    assert not base.resolve("fp16", 96, 16).off and base.resolve("fp16", 96, 16).issue == "call"
    with pytest.raises(ValueError):
        combine(picks, configs, fallback="maybe")


def test_the_combined_config_builds_each_instantiation_as_its_candidate() -> None:
    """The rule a tuned instantiation gets renders the same prefetch block as the uniform
    candidate tune measured (so the measurement carries over to the combined header)."""
    configs = candidates()
    picks = {"fp16/128/16/auto/v2": pick("fp16/128/16/auto/v2", "inline_kvhead_la2")}
    cfg = combine(picks, configs)
    chosen = cfg.resolve("fp16", 128, 16, "auto", "v2")
    cand = configs["inline_kvhead_la2"]
    assert all(getattr(chosen, k) == getattr(cand, k) for k in ("issue", "scope", "lookahead", "size", "align",
                                                                 "cache_hint", "placement", "caches", "off"))  # fmt: skip
    assert make_config().quantized == cfg.quantized


def test_combine_writes_a_gate_only_where_the_pick_has_one() -> None:
    configs = candidates(None, [parse_grid("issue=call;scope=kv-head;lookahead=1;min-group=1,2;min-ctas=1,1024")])
    picks = {"fp16/128/32/auto/v1": pick("fp16/128/32/auto/v1", "call_kvhead_la1_mg2_ctas1024"),
             "fp16/128/32/auto/v2": pick("fp16/128/32/auto/v2", "call_kvhead_la1"),
             "fp16/64/32/auto/v1": pick("fp16/64/32/auto/v1", "call_kvhead_la1_mg2"),
             "fp16/64/32/auto/v2": pick("fp16/64/32/auto/v2", "call_kvhead_la1_mg2")}  # fmt: skip
    cfg = combine(picks, configs)
    assert (cfg.min_group, cfg.min_ctas) == (1, 1)  # the base has no gate, whatever the first candidate has
    v1, v2 = cfg.resolve("fp16", 128, 32, "auto", "v1"), cfg.resolve("fp16", 128, 32, "auto", "v2")
    assert (v1.min_group, v1.min_ctas, v2.min_group, v2.min_ctas) == (2, 1024, 1, 1)
    rules = dict(cfg.overrides)
    assert "min_group" not in dict(rules["fp16/128/32/auto/v2"]) and dict(rules["fp16/64/32/auto"])["min_group"] == 2
    assert config_from_marker(cfg.marker()) == cfg


def test_combine_takes_each_kernels_own_settings_from_a_candidate_with_rules() -> None:
    """Candidates built over the shipped table (``group`` on top of its per-kernel rules; ``group
    = 1, group-min-ctas = 1`` ungroups it): each pick is the winner's settings at that kernel,
    grouping kept also where its rule says off."""
    configs = {"shipped": make_config(group=1, group_min_ctas=1), "g4": make_config(group=4, group_min_ctas=256)}
    picks = {p.selector: p for p in (
        pick("bf16/128/16/auto/v1", "g4"), pick("bf16/128/16/auto/v2", "shipped"),
        pick("bf16/128/32/auto/v1", "g4"), pick("bf16/128/32/auto/v2", None))}  # fmt: skip
    cfg = combine(picks, configs)
    shipped = configs["shipped"]
    for kernel, group in (("v1", 4), ("v2", 1)):
        got, want = cfg.resolve("bf16", 128, 16, "auto", kernel), shipped.resolve("bf16", 128, 16, "auto", kernel)
        assert (got.issue, got.scope, got.lookahead, got.read, got.off) == (
            want.issue, want.scope, want.lookahead, want.read, False)  # fmt: skip
        assert (got.group, got.group_min_ctas) == ((4, 256) if group == 4 else (1, 1))
    assert shipped.resolve("bf16", 128, 32, "auto", "v1").off  # the shipped table prefetches nothing there
    v1, v2 = cfg.resolve("bf16", 128, 32, "auto", "v1"), cfg.resolve("bf16", 128, 32, "auto", "v2")
    assert (v1.off, v1.group, v1.group_min_ctas) == (True, 4, 256) and (v2.off, v2.group) == (True, 1)
    assert cfg.group == 1 and config_from_marker(cfg.marker()) == cfg
