"""``kvpatch tune --incumbent NAME``: a kernel keeps the incumbent's settings unless a candidate
is faster than it at no cost: never slower than it at a tuning point (the interval of their
per-round ratio) and faster in geomean (that geomean's interval above 1.00)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from tune_helpers import bench_report

from kvpatch.commands.tune import TuneOptions, run
from kvpatch.config import config_and_tuned, make_config
from kvpatch.errors import UsageError
from kvpatch.tune import Score, candidates, choose, rechoose, score, versus

K = "bf16/128/16/auto/v2"
CANDIDATES = ("call_cta_la1", "inline_cta_la1", "split_cta_la1", "call_kvhead_la1")


def _scores(**speedups: list) -> dict[str, Score]:
    """Scores of candidates on kernel K from a bench report: name=[(speedup, rounds), ...] per point."""
    return {s.name: s for s in score(bench_report({n: {K: v} for n, v in speedups.items()}), {})}


# The incumbent: 1.30 and 1.10 over stock at two points, the same in both rounds.
HELD = [(1.30, [1.30, 1.30]), (1.10, [1.10, 1.10])]
# Faster in geomean than the incumbent, but slower than it at the second point in every round.
DIPS = [(1.60, [1.60, 1.60]), (1.05, [1.05, 1.05])]
# Faster than the incumbent at both points in every round.
BEATS = [(1.35, [1.34, 1.36]), (1.15, [1.14, 1.16])]
# As fast as the incumbent within the rounds' spread: its geomean interval over it spans 1.00.
TIES = [(1.31, [1.27, 1.35]), (1.11, [1.07, 1.15])]


def test_versus_pairs_the_points_and_rounds_of_two_candidates() -> None:
    s = _scores(held=HELD, dips=DIPS, beats=BEATS, ties=TIES)
    dips, beats, ties = versus(s["dips"], s["held"]), versus(s["beats"], s["held"]), versus(s["ties"], s["held"])
    assert dips.points == 2 and dips.slower == 1 and dips.geomean > 1 and not dips.beats
    assert beats.slower == 0 and beats.geomean_interval[0] > 1 and beats.beats
    lo, hi = ties.geomean_interval
    assert ties.slower == 0 and lo < 1 < hi and not ties.beats
    assert math.isclose(beats.geomean, math.sqrt(1.35 / 1.30 * 1.15 / 1.10))


def test_without_an_incumbent_the_best_geomean_wins_with_one_it_stays_unless_beaten() -> None:
    before = choose(_scores(held=HELD, dips=DIPS, ties=TIES).values())
    assert before[K].name == "dips"  # the best geomean over stock, though slower than 'held' at a point
    after = choose(_scores(held=HELD, dips=DIPS, ties=TIES).values(), incumbent="held")
    assert after[K].name == "held"
    assert choose(_scores(held=HELD, dips=DIPS, beats=BEATS).values(), incumbent="held")[K].name == "beats"


def test_an_incumbent_that_does_not_qualify_is_not_kept() -> None:
    """Slower than stock at a point (strict) or not bit-identical: the kernel is chosen as without it."""
    slow = [(1.30, [1.30, 1.30]), (0.95, [0.95, 0.95])]
    assert choose(_scores(held=slow, dips=DIPS).values(), incumbent="held")[K].name == "dips"
    scores = score(bench_report({"held": {K: HELD}, "dips": {K: DIPS}}), {"held": {K}})
    assert choose(scores, incumbent="held")[K].name == "dips"


def test_points_where_both_ran_stocks_code_are_not_held_against_the_challenger() -> None:
    held = Score("held", K, (1.0, 1.3), True, 0, ((1.0, 1.3), (1.0, 1.3)), rows=(0, 1), own=(False, True))
    c = Score("c", K, (0.97, 1.4), True, 0, ((0.97, 1.4), (0.96, 1.4)), rows=(0, 1), own=(False, True))
    assert versus(c, held).slower == 0
    own = Score("c", K, (0.97, 1.4), True, 0, ((0.97, 1.4), (0.96, 1.4)), rows=(0, 1), own=(True, True))
    assert versus(own, held).slower == 1  # its own code, slower than the incumbent's stock code: held against it


def _grouping_run(digests: dict[str, dict[str, str]], sha: dict[str, str] | None = None) -> list[Score]:
    """The incumbent 'held' prefetches K; 'c' is held's settings grouped. Two points where neither
    launch groups, c 0.98 of held in every round; two where c groups, 1.3x held. ``digests``: per
    library, its build's SASS digests; ``sha``: the sha256 they were recorded for (else the file's)."""
    held = [(1.10, [1.10, 1.10])] * 4
    c = [(1.078, [1.078, 1.078])] * 2 + [(1.43, [1.43, 1.43])] * 2
    bench = bench_report({"held": {K: held}, "c": {K: c}})
    rows = [r for r in bench["results"] if r["dispatched"]]
    for i, r in enumerate(rows):
        r["variants"]["held"]["grouped"] = False
        r["variants"]["c"]["grouped"] = i >= 2
    markers = {
        "held": make_config(inherit_rules=False).marker(),
        "c": make_config(inherit_rules=False, group=4).marker(),
    }
    bench["variant_info"] = {"stock": {"marker": "stock"}, **{
        n: {"marker": markers[n], "sha256": "ab" * 32,
            "code": {"library_sha256": (sha or {}).get(n, "ab" * 32), "kernels": digests[n]}} for n in markers}}  # fmt: skip
    return score(bench, {})


def test_points_where_both_ran_the_same_sass_of_their_own_are_not_held_against_the_challenger() -> None:
    """Before: neither grouped at two points, so both ran the incumbent's prefetch code, and the
    challenger's 0.98 there (noise between two copies of one code) kept the incumbent. After: the
    builds' SASS digests say it is the same code; the challenger, 1.3x where it groups, wins. Where
    the digests differ, or were recorded for another file, the 0.98 counts as before."""
    same = {"held": {K: "f1"}, "c": {K: "f1", K + " grouped": "g1"}}
    s = {x.name: x for x in _grouping_run(same)}
    v = versus(s["c"], s["held"])
    assert v.slower == 0 and v.slower_same_code == 2 and v.beats
    assert choose(s.values(), incumbent="held")[K].name == "c"
    other = {"held": {K: "f1"}, "c": {K: "f2", K + " grouped": "g1"}}
    for scores in (_grouping_run(other), _grouping_run(same, sha={"c": "cd" * 32})):
        s = {x.name: x for x in scores}
        assert versus(s["c"], s["held"]).slower == 2 and versus(s["c"], s["held"]).slower_same_code == 0
        assert choose(s.values(), incumbent="held")[K].name == "held"


def test_with_one_round_any_ratio_below_one_is_slower() -> None:
    held = Score("held", K, (1.3, 1.1), True, rows=(0, 1), own=(True, True))
    c = Score("c", K, (1.5, 1.099), True, rows=(0, 1), own=(True, True))
    assert versus(c, held).slower == 1 and not versus(c, held).beats


def _saved(tmp_path: Path) -> Path:
    """A saved tune JSON: four real candidate names on K; the third is the incumbent."""
    configs = candidates()
    bench = bench_report({n: {K: v} for n, v in zip(CANDIDATES, (DIPS, TIES, HELD, BEATS[:1] + DIPS[1:]))})
    bench["variant_info"] = {"stock": {"marker": "stock"}, **{n: {"marker": configs[n].marker()} for n in CANDIDATES}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"bench": bench, "validation_failures": {}, "machine": None}))
    return path


def test_tune_from_with_an_incumbent_writes_its_settings_and_records_the_comparison(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    plain = run(TuneOptions(cwd=tmp_path, from_json=[path], output=tmp_path / "a.toml"))
    assert plain.picked[K] == "call_cta_la1"
    run(TuneOptions(cwd=tmp_path, from_json=[path], output=tmp_path / "b.toml", json_out=tmp_path / "b.json",
                    incumbent="split_cta_la1"))  # fmt: skip
    cfg, _ = config_and_tuned(tmp_path / "b.toml")
    assert cfg.resolve("bf16", 128, 16, "auto", "v2").issue == "split"
    saved = json.loads((tmp_path / "b.json").read_text())
    assert saved["incumbent"] == "split_cta_la1" and saved["picked"][K] == "split_cta_la1"
    ranked = {e["name"]: e for e in saved["ranking"][K]}
    assert "versus_incumbent" not in ranked["split_cta_la1"]
    assert ranked["call_cta_la1"]["versus_incumbent"]["slower"] == 1
    assert ranked["call_cta_la1"]["versus_incumbent"]["beats"] is False


def test_an_incumbent_the_data_does_not_hold_is_refused_in_one_line(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    with pytest.raises(UsageError, match="--incumbent 'shipped' is not a candidate the tune JSON measured"):
        rechoose(json.loads(path.read_text()), incumbent="shipped")
    result = run_cli("tune", "--from", str(path), "--incumbent", "shipped", "-o", "k.toml", cwd=tmp_path)
    assert_one_line_error(result, 2, "--incumbent 'shipped' is not a candidate")
    assert not (tmp_path / "k.toml").exists()


@pytest.mark.parametrize("name, needle", [
    ("stock", "names stock or one of the grid's candidates"),
    ("call_cta_la1", "names stock or one of the grid's candidates"),
    ("no good", "invalid variant name 'no good'"),
])  # fmt: skip
def test_when_building_the_incumbents_name_must_stand_apart(tmp_path: Path, name: str, needle: str) -> None:
    assert_one_line_error(run_cli("tune", "--incumbent", name, cwd=tmp_path), 2, needle)


def test_with_libs_the_incumbent_is_one_of_them(tmp_path: Path) -> None:
    (tmp_path / "fake.so").write_bytes(b"")
    (tmp_path / "vi.json").write_text(json.dumps({"b": candidates()["call_cta_la1"].marker()}))
    args = ["--lib", "stock=fake.so:p", "--lib", "b=fake.so:q", "--variant-info", "vi.json", "--incumbent", "c"]
    assert_one_line_error(run_cli("tune", *args, cwd=tmp_path), 2, "--incumbent 'c' is not a --lib candidate (b)")


def test_when_building_the_trees_own_configuration_is_built_as_the_incumbent(applied: Path, work: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Before: the tree's configuration (here the shipped table) was never a candidate when building.
    After: it is one more candidate, under the incumbent's name, rules and all."""
    seen: dict = {}

    def fake_run_tune(libs, configs, **kw):
        seen.update(configs=configs, incumbent=kw["incumbent"], note=kw["machine"].note)
        raise UsageError("stopped before the GPU")

    monkeypatch.setattr("kvpatch.gpu.env.require_cuda", lambda: None)
    monkeypatch.setattr("kvpatch.jit.build", lambda spec, **kw: None)
    monkeypatch.setattr("kvpatch.commands.tune.built", lambda result, variants: SimpleNamespace(libs={}, info={}))
    monkeypatch.setattr("kvpatch.tune.run_tune", fake_run_tune)
    with pytest.raises(UsageError, match="stopped before the GPU"):
        run(TuneOptions(cwd=work, incumbent="shipped"))
    assert set(seen["configs"]) == set(candidates()) | {"shipped"}
    assert seen["configs"]["shipped"] == make_config() and make_config().overrides  # the shipped table
    assert seen["incumbent"] == "shipped" and "against shipped" in seen["note"]


def test_the_table_shows_each_candidate_against_the_incumbent(tmp_path: Path) -> None:
    result = run_cli("tune", "--from", str(_saved(tmp_path)), "--incumbent", "split_cta_la1", "-o", "k.toml",
                     cwd=tmp_path, env={"COLUMNS": "250"})  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "against split_cta_la1" in result.stdout and "over split_cta_la1" in result.stdout
    row = next(line for line in result.stdout.splitlines() if "call_cta_la1" in line)
    assert "1, 1.084 [1.084..1.084]" in row  # slower at one point; geomean sqrt(1.60/1.30 * 1.05/1.10)
