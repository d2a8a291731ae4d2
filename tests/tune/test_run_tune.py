"""``run_tune``'s wiring, with validate and bench replaced: what it validates, what it benches
(the tuning set, ``quick``, ``--only``), and that a candidate that failed validation is never
written, however fast."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tune_helpers import timing

from kvpatch.tune import candidates, run_tune, tuned_instantiations


@pytest.fixture
def measured(monkeypatch):
    """Validate and bench replaced: ``inline_cta_la1`` fails validation on bf16 with ALiBi and
    is the faster everywhere; what each was asked lands in the dict returned."""
    from kvpatch.gpu import bench as Bn
    from kvpatch.gpu import validate as V

    seen: dict = {}

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
                    "variants": {"stock": {"speedup": 1.0}, "inline_cta_la1": timing(1.5), "call_cta_la1": timing(1.2)}}
                   for p in points]  # fmt: skip
        return SimpleNamespace(to_dict=lambda: {"baseline": "stock", "results": results})

    monkeypatch.setattr(V, "run_validate", fake_validate)
    monkeypatch.setattr(Bn, "run_bench", fake_bench)
    return seen


CONFIGS = {k: v for k, v in candidates().items() if k in ("inline_cta_la1", "call_cta_la1")}


def test_run_tune_validates_each_instantiation_benches_the_tuning_set_and_never_picks_a_failure(measured) -> None:
    from kvpatch.config.selector import kernel_selector
    from kvpatch.gpu import points as P

    report = run_tune({"stock": None}, CONFIGS, quick=True, reps=1, rounds=1)
    points = measured["points"]
    assert measured["kernels"] == ("dispatched",) and {p.seed for p in points} == {0}
    # quick: the tuning set's points at batch 2/32 and context 512/12288, every instantiation and head layout
    assert set(points) <= set(P.point_set("tuning"))
    assert {p.batch for p in points} == {2, 32} and {p.context for p in points} == {512, 12288}
    layouts = {(p.num_heads, p.num_kv_heads) for p in P.point_set("tuning")}
    assert {(p.dtype, p.head_size, p.block_size, p.num_heads, p.num_kv_heads) for p in points} == {
        (*i, *h) for i in tuned_instantiations() for h in layouts}  # fmt: skip
    assert {kernel_selector(p.dtype, p.head_size, p.block_size, "auto", p.dispatched) for p in points} == set(
        report.picked
    )
    # validated: both kernels, ALiBi on and off, GQA and MHA
    matrix = measured["matrix"]
    assert {(c.dtype, c.head_size, c.block_size) for c in matrix} == set(tuned_instantiations())
    assert {c.kernel for c in matrix} == {"v1", "v2"} and {c.alibi for c in matrix} == {True, False}
    assert {(c.num_heads, c.num_kv_heads) for c in matrix if not c.alibi} == {(8, 2), (4, 4)}
    assert {(c.num_heads, c.num_kv_heads, c.num_seqs) for c in matrix if c.alibi} == {(32, 8, 8), (16, 16, 8)}
    for inst, name in report.picked.items():
        assert name == ("call_cta_la1" if inst.startswith("bf16") else "inline_cta_la1")
    assert report.config.resolve("bf16", 128, 16, "auto", "v2").issue == "call"
    assert report.config.resolve("fp16", 64, 32, "auto", "v1").issue == "inline"
    assert report.to_json()["validation_failures"]["inline_cta_la1"] == sorted(
        i for i in report.picked if i.startswith("bf16")
    )


def test_only_measures_just_the_instantiations_its_selectors_pick(measured) -> None:
    """``--only fp16/128/16``: run_tune benches and validates that instantiation's points of the
    full run (both kernels, all three head layouts) and nothing else; the others come out off."""
    run_tune({"stock": None}, CONFIGS, quick=False, reps=1, rounds=1)
    full_points, full_matrix = measured["points"], measured["matrix"]
    report = run_tune({"stock": None}, CONFIGS, quick=False, reps=1, rounds=1, only=["fp16/128/16"])
    mine = lambda x: (x.dtype, x.head_size, x.block_size) == ("fp16", 128, 16)  # noqa: E731
    assert measured["points"] == [p for p in full_points if mine(p)] and measured["points"]
    assert measured["matrix"] == [c for c in full_matrix if mine(c)] and measured["matrix"]
    assert {p.dispatched for p in measured["points"]} == {"v1", "v2"}
    assert len({(p.num_heads, p.num_kv_heads) for p in measured["points"]}) == 3
    assert set(report.picked) == {"fp16/128/16/auto/v1", "fp16/128/16/auto/v2"}
    assert (
        report.config.resolve("fp16", 128, 32, "auto", "v1").off
        and not report.config.resolve("fp16", 128, 16, "auto", "v1").off
    )
    # with --dtype the two filters meet
    run_tune({"stock": None}, CONFIGS, quick=False, reps=1, rounds=1, dtypes=["fp16"], only=["*/256"])
    assert {(p.dtype, p.head_size) for p in measured["points"]} == {("fp16", 256)}
