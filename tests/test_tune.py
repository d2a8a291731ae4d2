"""kvpatch.tune's pure parts: the grid, scoring a bench report, choosing per instantiation."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from kvpatch.config import make_config
from kvpatch.config_io import config_from_marker
from kvpatch.tune import Pick, Score, candidates, choose, combine, parse_grid, score, validation_failures


def test_the_grid_is_every_combination_uniform_and_shares_one_helper() -> None:
    grid = candidates()
    assert len(grid) == 12
    assert len({c.marker() for c in grid.values()}) == 12
    assert all(c.overrides == () for c in grid.values())
    assert grid["call_kvhead_la2"].scope == "kv-head" and grid["call_kvhead_la2"].lookahead == 2
    assert grid["inline_cta_la1"].issue == "inline"
    # every candidate keeps the base's hint/align, so one helper serves all of them in a combined config
    assert {(c.cache_hint, c.align) for c in grid.values()} == {("none", 16)}


def _timing(speedup: float, rounds=None, verdict=None) -> dict:
    rounds = rounds or [speedup, speedup]
    v = verdict or ("slower" if max(rounds) < 1 else "faster" if min(rounds) > 1 else "noise")
    return {"speedup": speedup, "speedup_rounds": rounds, "verdict": v}


def _bench(speedups: dict[str, dict[str, list]]) -> dict:
    """A bench report dict: speedups[variant]["dtype/head/block/auto/kernel"] = [speedup or
    (speedup, rounds)] at points where that kernel is dispatched, plus the other kernel's
    result at each point (not dispatched: ignored by score)."""
    results = []
    sels = {i for per in speedups.values() for i in per}
    for sel in sorted(sels):
        dtype, head, block, kv, kernel = sel.split("/")
        point = {"dtype": dtype, "head_size": int(head), "block_size": int(block), "kv_cache_dtype": kv}
        n = len(next(iter(speedups.values()))[sel])
        other = "v2" if kernel == "v1" else "v1"
        for i in range(n):
            variants = {"stock": {"speedup": 1.0}}
            for name, per in speedups.items():
                x = per[sel][i]
                variants[name] = _timing(*x) if isinstance(x, tuple) else _timing(x)
            results.append({"point": point, "kernel": kernel, "dispatched": True, "variants": variants})
            results.append({"point": point, "kernel": other, "dispatched": False,
                            "variants": {k: _timing(0.1) for k in variants}})  # fmt: skip
    return {"baseline": "stock", "results": results}


def test_score_is_per_kernel_on_dispatched_points() -> None:
    bench = _bench({"a": {"fp16/128/16/auto/v2": [1.1, 0.9], "fp16/128/16/auto/v1": [1.3, 1.2]},
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
    assert [s.name for s in strict["fp16/128/16/auto/v2"].ranked] == ["steady", "steadier", "faster-dips", "fast-but-wrong"]
    loose = choose(scores, "geomean")
    assert loose["fp16/128/16/auto/v2"].name == "faster-dips" and loose["bf16/256/16/auto/v2"].name == "dips"
    assert loose["bf16/64/32/auto/v1"].name == "off"  # a geomean below 1 never qualifies
    with pytest.raises(ValueError):
        choose(scores, "fastest")


def test_a_candidate_that_failed_validation_is_never_picked() -> None:
    scores = [Score("inline_cta_la1", "bf16/128/32/auto/v1", (1.6, 1.5), False), Score("call_cta_la2", "bf16/128/32/auto/v1", (1.1,), True)]
    assert choose(scores, "geomean")["bf16/128/32/auto/v1"].name == "call_cta_la2"
    assert choose(scores[:1], "geomean")["bf16/128/32/auto/v1"].name == "off"


def _pick(inst: str, name: str | None) -> Pick:
    s = None if name is None else Score(name, inst, (1.2,), True)
    return Pick(inst, s, (s,) if s else ())


def test_combine_writes_a_rule_per_instantiation_or_per_kernel_and_off_elsewhere() -> None:
    configs = candidates()
    picks = {p.selector: p for p in (
        _pick("fp16/128/16/auto/v1", "inline_kvhead_la1"), _pick("fp16/128/16/auto/v2", "inline_kvhead_la1"),
        _pick("bf16/128/16/auto/v1", "call_cta_la1"), _pick("bf16/128/16/auto/v2", "inline_cta_la2"),
        _pick("bf16/64/32/auto/v1", None), _pick("bf16/64/32/auto/v2", None))}  # fmt: skip
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


def test_the_combined_config_builds_each_instantiation_as_its_candidate() -> None:
    """The rule a tuned instantiation gets renders the same prefetch block as the uniform
    candidate tune measured (so the measurement carries over to the combined header)."""
    configs = candidates()
    picks = {"fp16/128/16/auto/v2": _pick("fp16/128/16/auto/v2", "inline_kvhead_la2")}
    cfg = combine(picks, configs)
    chosen = cfg.resolve("fp16", 128, 16, "auto", "v2")
    cand = configs["inline_kvhead_la2"]
    assert all(getattr(chosen, k) == getattr(cand, k) for k in ("issue", "scope", "lookahead", "size", "align",
                                                                 "cache_hint", "placement", "caches", "off"))  # fmt: skip
    assert make_config().quantized == cfg.quantized


def test_run_tune_validates_each_instantiation_benches_the_tuning_set_and_never_picks_a_failure(monkeypatch) -> None:
    """run_tune's wiring, with validate and bench replaced: the failing candidate is the
    fastest one, and it must not be written."""
    from kvpatch.gpu import bench as Bn
    from kvpatch.gpu import points as P
    from kvpatch.gpu import validate as V
    from kvpatch.tune import run_tune

    configs = {k: v for k, v in candidates().items() if k in ("inline_cta_la1", "call_cta_la1")}
    seen = {}

    def fake_validate(libs, matrix, seed=0, **kw):
        seen["matrix"] = matrix
        ok = SimpleNamespace(status="pass")
        bad = SimpleNamespace(status="fail")
        return SimpleNamespace(results=[SimpleNamespace(case=c, reasons=[], variants={
            "inline_cta_la1": bad if (c.dtype, c.alibi) == ("bf16", True) else ok, "call_cta_la1": ok})
            for c in matrix])  # fmt: skip

    def fake_bench(libs, points, **kw):
        seen["points"], seen["kernels"] = points, kw["kernels"]
        results = [{"point": p.to_dict(), "kernel": p.dispatched, "dispatched": True,
                    "variants": {"stock": {"speedup": 1.0}, "inline_cta_la1": _timing(1.5), "call_cta_la1": _timing(1.2)}}
                   for p in points]  # fmt: skip
        return SimpleNamespace(to_dict=lambda: {"baseline": "stock", "results": results})

    monkeypatch.setattr(V, "run_validate", fake_validate)
    monkeypatch.setattr(Bn, "run_bench", fake_bench)
    report = run_tune({"stock": None}, configs, quick=True, reps=1, rounds=1)
    assert seen["kernels"] == ("dispatched",) and {p.seed for p in seen["points"]} == {0}
    assert {P.kernel_selector(p.dtype, p.head_size, p.block_size, "auto", p.dispatched) for p in seen["points"]} == set(report.picked)
    assert len(seen["points"]) == 12 * 4 * 3 and {c.alibi for c in seen["matrix"]} == {True, False}
    assert {(c.num_heads, c.num_kv_heads) for c in seen["matrix"] if not c.alibi} == {(8, 2), (4, 4)}
    assert {(c.num_heads, c.num_kv_heads, c.num_seqs) for c in seen["matrix"] if c.alibi} == {(32, 8, 8), (16, 16, 8)}
    for inst, name in report.picked.items():
        assert name == ("call_cta_la1" if inst.startswith("bf16") else "inline_cta_la1")
    assert report.config.resolve("bf16", 128, 16, "auto", "v2").issue == "call"
    assert report.config.resolve("fp16", 64, 32, "auto", "v1").issue == "inline"
    assert report.to_json()["validation_failures"]["inline_cta_la1"] == sorted(i for i in report.picked if i.startswith("bf16"))


def test_min_kv_mib_grid_pairs_only_with_the_call_form() -> None:
    """min-kv-mib is tested in the call helper: a grid that crosses it with inline and split
    builds it with call only (no duplicate of an ungated inline candidate under another name)."""
    cands = candidates(None, [parse_grid("issue=inline,call;scope=kv-head;lookahead=1;min-kv-mib=0,64")])
    assert sorted(cands) == ["call_kvhead_la1", "call_kvhead_la1_kv64", "inline_kvhead_la1"]
    assert cands["call_kvhead_la1_kv64"].min_kv_mib == 64 and cands["call_kvhead_la1"].min_kv_mib == 0


def test_only_measures_and_builds_just_the_instantiations_its_selectors_pick(monkeypatch, tmp_path) -> None:
    """``--only fp16/128/16``: run_tune benches and validates only that instantiation's points
    (both kernels, all three head layouts); the build spec holds only its shapes; with
    ``--dtype`` the two filters meet."""
    from kvpatch.gpu import bench as Bn
    from kvpatch.gpu import points as P
    from kvpatch.gpu import validate as V
    from kvpatch.gpu.tune_command import tune_build_spec
    from kvpatch.tune import run_tune, tuned_instantiations

    seen = {}
    monkeypatch.setattr(V, "run_validate", lambda libs, matrix, seed=0, **kw: seen.update(matrix=matrix) or
                        SimpleNamespace(results=[]))  # fmt: skip

    def fake_bench(libs, points, **kw):
        seen["points"] = points
        return SimpleNamespace(to_dict=lambda: {"baseline": "stock", "results": []})

    monkeypatch.setattr(Bn, "run_bench", fake_bench)
    configs = {k: v for k, v in candidates().items() if k == "call_cta_la1"}
    run_tune({"stock": None}, configs, quick=False, reps=1, rounds=1, only=["fp16/128/16"])
    assert {(p.dtype, p.head_size, p.block_size) for p in seen["points"]} == {("fp16", 128, 16)}
    assert len(seen["points"]) == len(P.TUNING_HEADS) * len(P.TUNING_BATCHES) * len(P.TUNING_CONTEXTS)
    assert {(c.dtype, c.head_size, c.block_size) for c in seen["matrix"]} == {("fp16", 128, 16)}
    assert tuned_instantiations(["bf16"], ["*/256"]) == [("bf16", 256, 16), ("bf16", 256, 32)]
    assert len(tuned_instantiations()) == len(P.TUNING_DTYPES) * len(P.TUNING_HEAD_SIZES) * len(P.TUNING_BLOCK_SIZES)
    from kvpatch import build as B

    monkeypatch.setattr(B, "make_spec", lambda root, variants, arch, **kw: kw)
    assert tune_build_spec(tmp_path, [], "9.0a", only=["fp16/128/16", "fp16/256/16"]) == {
        "dtypes": ["fp16"], "head_sizes": [128, 256], "block_sizes": [16], "kv_cache_dtypes": ["auto"]}
    assert tune_build_spec(tmp_path, [], "9.0a", dtypes=["bf16"])["head_sizes"] == sorted(P.TUNING_HEAD_SIZES)


# --------------------------------------------------------------------------- choosing again (--from)


def _saved_report() -> dict:
    """What `kvpatch tune --json` writes, for two candidates on one instantiation's two kernels."""
    from kvpatch.tune import TuneReport

    configs = {k: v for k, v in candidates().items() if k in ("inline_cta_la1", "call_cta_la1")}
    bench = _bench({"inline_cta_la1": {"bf16/256/16/auto/v1": [1.5, 1.4], "bf16/256/16/auto/v2": [1.3, 1.2]},
                    "call_cta_la1": {"bf16/256/16/auto/v1": [1.2, 0.95], "bf16/256/16/auto/v2": [1.1, 1.05]}})  # fmt: skip
    bench["variant_info"] = {"stock": {"marker": "stock"}, **{n: {"marker": c.marker()} for n, c in configs.items()}}
    scores = score(bench, {})
    picks = choose(scores)
    return TuneReport(combine(picks, configs), picks, "strict", {}, None, {}, bench).to_json()


def test_rechoose_rules_out_exclusions_and_chooses_again() -> None:
    from kvpatch.tune import rechoose

    data = _saved_report()
    assert data["picked"] == {"bf16/256/16/auto/v1": "inline_cta_la1", "bf16/256/16/auto/v2": "inline_cta_la1"}
    again = rechoose(data)
    assert again.picked == data["picked"] and again.config.marker() == data["marker"]
    # what vLLM's test found on one kernel: the call form has a slower point there (0.95), so strict turns it off
    r = rechoose(data, exclude=["inline_*@bf16/256/16/auto/v1"])
    assert r.picked == {"bf16/256/16/auto/v1": "off", "bf16/256/16/auto/v2": "inline_cta_la1"}
    assert r.config.resolve("bf16", 256, 16, "auto", "v1").off and r.exclusions == {"inline_cta_la1": {"bf16/256/16/auto/v1"}}
    assert "inline_cta_la1" not in r.failures  # excluded, not a validation failure
    assert rechoose(data, policy="geomean", exclude=["inline_*@*/v1"]).picked["bf16/256/16/auto/v1"] == "call_cta_la1"
    # an excluded candidate keeps its measured bit-identity: the table says excluded, not "NO"
    ranked = {s["name"]: s for s in r.to_json()["ranking"]["bf16/256/16/auto/v1"]}
    assert ranked["inline_cta_la1"]["excluded"] and ranked["inline_cta_la1"]["bit_identical"]
    assert not ranked["inline_cta_la1"]["qualifies"] and not ranked["call_cta_la1"]["excluded"]
    from rich.console import Console

    from kvpatch.render import tune_table

    console = Console(width=200, record=True)
    console.print(tune_table(r))
    rows = [line for line in console.export_text().splitlines() if "inline_cta_la1" in line]
    assert sum("yes, excluded" in line for line in rows) == 1 and not any("NO" in line for line in rows)
    # chosen again from the excluded report's own JSON: still excluded, still bit-identical, and a
    # further --exclude adds to the saved one
    saved = r.to_json()
    assert saved["exclusions"] == {"inline_cta_la1": ["bf16/256/16/auto/v1"]} and saved["validation_failures"] == data["validation_failures"]
    again = rechoose(saved)
    assert again.picked == r.picked and again.exclusions == r.exclusions
    ranked = {s["name"]: s for s in again.to_json()["ranking"]["bf16/256/16/auto/v1"]}
    assert ranked["inline_cta_la1"]["excluded"] and ranked["inline_cta_la1"]["bit_identical"]
    more = rechoose(saved, exclude=["inline_*@bf16/256/16/auto/v2"])
    assert more.exclusions == {"inline_cta_la1": {"bf16/256/16/auto/v1", "bf16/256/16/auto/v2"}}
    assert more.picked["bf16/256/16/auto/v2"] != "inline_cta_la1"


@pytest.mark.parametrize("exclude, message", [(["inline_cta_la1"], "use CANDIDATE@SELECTOR"),
                                              (["nothing@bf16/*"], "matches no candidate")])  # fmt: skip
def test_rechoose_refuses_bad_exclusions(exclude, message) -> None:
    from kvpatch.errors import UsageError
    from kvpatch.tune import rechoose

    with pytest.raises(UsageError, match=message):
        rechoose(_saved_report(), exclude=exclude)
    with pytest.raises(UsageError, match="not a kvpatch tune JSON"):
        rechoose({"picked": {}})
    broken = _saved_report()
    broken["bench"]["results"] = [{"dispatched": True, "point": {}}]
    with pytest.raises(UsageError, match="bench results are not"):
        rechoose(broken)


def test_tune_from_a_saved_json_needs_no_gpu(tmp_path) -> None:
    """`kvpatch tune --from` on the CLI: writes kvpatch.toml with the machine and the exclusion noted."""
    import gzip
    import json
    import subprocess
    import sys

    data = _saved_report()
    data["machine"] = {"gpu": "NVIDIA H200", "nvcc": "13.0.88", "note": "tuned"}
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(json.dumps(data).encode()))
    proc = subprocess.run([sys.executable, "-m", "kvpatch", "tune", "--from", "t.json.gz", "--exclude",
                           "inline_*@bf16/256/16/auto/v1", "-o", "k.toml"], cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "k.toml").read_text()
    assert '"bf16/256/16/auto/v1" = { off = true }' in text and 'gpu = "NVIDIA H200"' in text
    assert "excluding inline_*@bf16/256/16/auto/v1" in text
    bad = subprocess.run([sys.executable, "-m", "kvpatch", "tune", "--exclude", "a@b"], cwd=tmp_path,
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "--exclude works with --from" in bad.stderr


# --------------------------------------------------------------------------- --grid, gates, several --from


def test_parse_grid_replaces_or_adds_axes_and_names_the_gates() -> None:
    from kvpatch.errors import UsageError
    from kvpatch.tune import GRID, parse_grid

    g = parse_grid("issue=inline,call; min-group=2; min-ctas=1,1024")
    assert dict(g) == {**dict(GRID), "issue": ("inline", "call"), "min_group": (2,), "min_ctas": (1, 1024)}
    cands = candidates(None, [g])
    assert len(cands) == 2 * 2 * 2 * 2
    c = cands["inline_kvhead_la2_mg2_ctas1024"]
    assert (c.issue, c.scope, c.lookahead, c.min_group, c.min_ctas) == ("inline", "kv-head", 2, 2, 1024)
    assert "call_cta_la1_mg2" in cands and cands["call_cta_la1_mg2"].min_ctas == 1
    # several grids: their union, the default one's names unchanged
    both = candidates(None, [GRID, g])
    assert len(both) == 12 + 16 and set(candidates()) < set(both)
    # read: a grid axis too, named _warp
    w = candidates(None, [parse_grid("issue=inline;scope=kv-head;lookahead=2;min-group=2;read=lane,warp")])
    assert set(w) == {"inline_kvhead_la2_mg2", "inline_kvhead_la2_mg2_warp"} and w["inline_kvhead_la2_mg2_warp"].read == "warp"
    assert w["inline_kvhead_la2_mg2"].read == "lane"
    for text, message in [("bogus=1", "KEY=V1,V2"), ("issue", "KEY=V1,V2"), ("issue=inline;issue=call", "twice"),
                          ("lookahead=1,1", "twice"), ("min-ctas=0", "min-ctas"), ("issue=fast", "invalid issue"),
                          (" ; ", "empty")]:  # fmt: skip
        with pytest.raises(UsageError, match=message):
            parse_grid(text)


def test_combine_writes_a_gate_only_where_the_pick_has_one() -> None:
    from kvpatch.tune import parse_grid

    configs = candidates(None, [parse_grid("issue=call;scope=kv-head;lookahead=1;min-group=1,2;min-ctas=1,1024")])
    picks = {"fp16/128/32/auto/v1": _pick("fp16/128/32/auto/v1", "call_kvhead_la1_mg2_ctas1024"),
             "fp16/128/32/auto/v2": _pick("fp16/128/32/auto/v2", "call_kvhead_la1"),
             "fp16/64/32/auto/v1": _pick("fp16/64/32/auto/v1", "call_kvhead_la1_mg2"),
             "fp16/64/32/auto/v2": _pick("fp16/64/32/auto/v2", "call_kvhead_la1_mg2")}  # fmt: skip
    cfg = combine(picks, configs)
    assert (cfg.min_group, cfg.min_ctas) == (1, 1)  # the base has no gate, whatever the first candidate has
    v1, v2 = cfg.resolve("fp16", 128, 32, "auto", "v1"), cfg.resolve("fp16", 128, 32, "auto", "v2")
    assert (v1.min_group, v1.min_ctas, v2.min_group, v2.min_ctas) == (2, 1024, 1, 1)
    rules = dict(cfg.overrides)
    assert "min_group" not in dict(rules["fp16/128/32/auto/v2"]) and dict(rules["fp16/64/32/auto"])["min_group"] == 2
    assert config_from_marker(cfg.marker()) == cfg


def _run(kernels: dict[str, dict[str, list]], failures=None, seconds=1.0) -> dict:
    """A saved tune JSON of one run: kernels[candidate][selector] = speedups."""
    configs = candidates()
    bench = _bench(kernels)
    bench["variant_info"] = {"stock": {"marker": "stock"}, **{n: {"marker": configs[n].marker()} for n in kernels}}
    bench["seconds"] = seconds
    return {"bench": bench, "validation_failures": failures or {}, "machine": None}


def test_merge_takes_each_kernel_from_the_last_run_that_measured_it() -> None:
    from kvpatch.errors import UsageError
    from kvpatch.tune import merge_tune_data, rechoose

    old = _run({"inline_cta_la1": {"bf16/128/16/auto/v1": [1.3, 1.2], "fp16/128/16/auto/v2": [1.5, 1.4]},
                "call_cta_la1": {"bf16/128/16/auto/v1": [1.1, 1.1], "fp16/128/16/auto/v2": [1.2, 1.2]}},
               failures={"call_cta_la1": ["fp16/128/16/auto/v2"]})  # fmt: skip
    # the new run measured fp16 again: there inline is slower at one point now, and call is clean
    new = _run({"inline_cta_la1": {"fp16/128/16/auto/v2": [1.5, 0.9]},
                "call_cta_la1": {"fp16/128/16/auto/v2": [1.2, 1.1]}}, seconds=2.0)  # fmt: skip
    merged = merge_tune_data([old, new])
    r = rechoose(merged)
    assert r.picked == {"bf16/128/16/auto/v1": "inline_cta_la1", "fp16/128/16/auto/v2": "call_cta_la1"}
    # the old run's validation failure was about the old run's fp16 measurements: dropped with them
    assert merged["validation_failures"] == {}
    assert [m["kernels"] for m in merged["bench"]["merged_from"]] == [["bf16/128/16/auto/v1"], ["fp16/128/16/auto/v2"]]
    # the order decides: the old run last, fp16 comes from it
    assert rechoose(merge_tune_data([new, old])).picked["fp16/128/16/auto/v2"] == "inline_cta_la1"
    # a saved exclusion travels with its kernel's measurements, and is dropped with them
    old["exclusions"] = {"inline_cta_la1": ["bf16/128/16/auto/v1", "fp16/128/16/auto/v2"]}
    merged = merge_tune_data([old, new])
    assert merged["exclusions"] == {"inline_cta_la1": ["bf16/128/16/auto/v1"]}
    assert rechoose(merged).picked["bf16/128/16/auto/v1"] == "call_cta_la1"
    del old["exclusions"]
    clash = _run({"inline_cta_la1": {"fp16/64/16/auto/v1": [1.1, 1.1]}})
    clash["bench"]["variant_info"]["inline_cta_la1"]["marker"] = candidates()["call_cta_la2"].marker()
    with pytest.raises(UsageError, match="different configurations"):
        merge_tune_data([old, clash])
    with pytest.raises(UsageError, match="not a kvpatch tune JSON"):
        merge_tune_data([old, {"bench": {}}])


def test_merge_keeps_one_machine_and_joins_the_notes() -> None:
    from kvpatch.errors import UsageError
    from kvpatch.tune import merge_tune_data

    h200 = {"gpu": "NVIDIA H200", "driver": "580.159.04", "nvcc": "13.0.88", "arch": "sm_90a", "flags": "-O2"}
    fp16 = {**_run({"inline_cta_la1": {"fp16/128/16/auto/v2": [1.5, 1.4]}}), "machine": {**h200, "note": "tuning set (fp16)"}}
    bf16 = {**_run({"inline_cta_la1": {"bf16/128/16/auto/v1": [1.3, 1.2]}}), "machine": {**h200, "note": "tuning set (bf16)"}}
    merged = merge_tune_data([fp16, bf16])
    assert merged["machine"] == {**h200, "note": "tuning set (fp16) + tuning set (bf16)"}
    h100 = {**bf16, "machine": {**h200, "gpu": "NVIDIA H100 80GB HBM3"}}
    with pytest.raises(UsageError, match="different machines"):
        merge_tune_data([fp16, h100])
    assert merge_tune_data([fp16, {**bf16, "machine": None}])["machine"]["note"] == "tuning set (fp16)"


def test_tune_cli_merges_several_from_and_refuses_what_would_be_ignored(tmp_path) -> None:
    import json
    import subprocess
    import sys

    a = _run({"inline_cta_la1": {"bf16/128/16/auto/v1": [1.3, 1.2], "fp16/128/16/auto/v2": [1.5, 1.4]}})
    b = _run({"call_cta_la1": {"fp16/128/16/auto/v2": [1.2, 1.1]}})
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    kv = [sys.executable, "-m", "kvpatch", "tune"]
    proc = subprocess.run([*kv, "--from", "a.json", "--from", "b.json", "-o", "k.toml"], cwd=tmp_path,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "k.toml").read_text()
    assert '"bf16/128/16/auto" = { lookahead = 1, scope = "cta", issue = "inline" }' in text
    assert '"fp16/128/16/auto" = { lookahead = 1, scope = "cta", issue = "call" }' in text
    for args, message in [(["--from", "a.json", "--grid", "min-group=2"], "--from measures nothing"),
                          (["--from", "a.json", "--dtype", "fp16"], "--from measures nothing"),
                          (["--dtype", "fp32"], "invalid --dtype 'fp32'"),
                          (["--from", "a.json", "--only", "fp16/128/16"], "--from measures nothing"),
                          (["--only", "fp16/80"], "pick no tuned instantiation"),
                          (["--only", "fp16/128/16/auto/v2"], "invalid --only 'fp16/128/16/auto/v2'"),
                          (["--only", "fp17"], "invalid selector 'fp17'"),
                          (["--grid", "min-ctas=1,x"], "invalid min_ctas 'x'"),
                          (["--lib", "stock=s.so:p", "--grid", "min-group=2"], "with --lib the candidates")]:  # fmt: skip
        bad = subprocess.run([*kv, *args], cwd=tmp_path, capture_output=True, text=True)
        assert bad.returncode == 2 and message in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, (args, bad.stderr)
