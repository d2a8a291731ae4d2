"""The weight-prefetch sweep (kvpatch.decode.sweep, .stages) end to end on the CPU, as the bench
runs there (decode_helpers.cpu_bench): every stage in order, each one's JSON, the pick, the
guard check and the sweep's text; and a stage past its share of the budget is skipped."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from decode_helpers import cpu_bench, one_thread  # noqa: E402

from kvpatch.decode.windows import STEP_WINDOWS  # noqa: E402


@pytest.fixture
def cpu(monkeypatch):
    with one_thread():
        yield cpu_bench(monkeypatch)


@pytest.mark.slow
def test_the_sweep_runs_its_stages_in_order_and_picks(cpu, tmp_path, monkeypatch):
    libs, pf, _ = cpu
    from kvpatch.decode import picks as PK
    from kvpatch.decode import sweep as SW

    monkeypatch.setattr(PK, "BATCHES", (1, 4))
    monkeypatch.setattr(PK, "CONTEXTS", (32,))
    monkeypatch.setattr(PK, "LAYERS", 2)
    monkeypatch.setattr(PK, "ROUNDS", 2)
    monkeypatch.setattr(PK, "STEP_ROUNDS", 2)
    monkeypatch.setattr(PK, "KERNEL_CAPS_MIB", (1,))
    monkeypatch.setattr(PK, "KERNEL_HINTS", ("evict_normal", "evict_last"))
    monkeypatch.setattr(PK, "MICRO_SHAPES", (("tiny", 64, 32),))
    result = SW.run_sweep(libs, tmp_path, budget_s=1e6, prefetch_library=pf)
    assert result["errors"] == {}, result["errors"]
    assert [line.split("] ")[1] for line in result["log"] if line.endswith(": start")] == [
        "lead: start",
        "micro: start",
        "kernels: start",
        "steps: start",
        "final: start",
        "guard_off: start",
    ]
    for name in (
        "sweep.json",
        "decode_lead.json",
        "micro.json",
        "kernels.json",
        "decode_steps.json",
        "decode_final.json",
        "decode_guard_off.json",
    ):
        assert (tmp_path / name).is_file(), name
    assert result["picked"]["config"]["label"] and result["guard_check"]["demoted_bytes"] > 0
    steps = json.loads((tmp_path / "decode_steps.json").read_text())
    assert {f"w:{n}" for n in result["steps"]["windows"]} <= set(steps["variants"])
    kernels = json.loads((tmp_path / "kernels.json").read_text())
    assert {r["window"] for run in kernels for r in run["results"]} == set(STEP_WINDOWS)
    from kvpatch.render import sweep_text

    reports = {
        k: json.loads((tmp_path / f"decode_{k}.json").read_text()) for k in ("final", "lead", "steps", "guard_off")
    }
    text = sweep_text(result, reports=reports, kernels=kernels)
    assert "picked weight prefetch" in text and "per window, kernel by kernel" in text and "guard off" in text


def test_a_stage_past_its_share_is_skipped(cpu, tmp_path):
    libs, pf, _ = cpu
    from kvpatch.decode import sweep as SW

    result = SW.run_sweep(libs, tmp_path, budget_s=1e-9, prefetch_library=pf, stages=["lead", "micro"])
    assert result["skipped_stages"] == ["lead", "micro"] and not (tmp_path / "decode_lead.json").exists()
