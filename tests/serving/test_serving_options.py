"""The serving benchmark's settings, its schedule and its numbers, as before/after specifications
(no engine, no torch)."""

from __future__ import annotations

import pytest

from kvpatch.errors import UsageError
from kvpatch.serving import ARMS, KVPATCH, VLLM, VLLM_TWIN, ServingOptions, Workload, make_workloads, parse_workload
from kvpatch.serving.report import build_report
from kvpatch.serving.schedule import pending, schedule
from kvpatch.serving.worker import engine_wanted, step_stats


def _opts(**kw) -> ServingOptions:
    base = dict(model="/m", model_label="m", dtype="bf16", workloads=(Workload(512, 512, 1), Workload(4096, 256, 32)))
    return ServingOptions(**{**base, **kw})


def test_workloads_read_as_input_output_and_batches():
    assert parse_workload("4096:256:8,32") == [Workload(4096, 256, 8), Workload(4096, 256, 32)]
    rows = make_workloads(512, 512, [1, 64, 1], ["4096:256:8", "512:512:64"])
    assert rows == (Workload(512, 512, 1), Workload(512, 512, 64), Workload(4096, 256, 8))
    assert Workload(512, 512, 64).label == "512x512 B64"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("4096:256", "INPUT:OUTPUT:BATCHES"),
        ("4096:256:", "names no batch size"),
        ("4096:+-5:8", "not a whole number"),
        ("4096:256:0", "out of range"),
        ("9" * 4000 + ":1:1", "not a whole number"),
        ("4096:256:2000", "out of range"),
        ("４:1:1", "not a whole number"),
    ],
)
def test_a_bad_workload_is_one_line(text, message):
    with pytest.raises(UsageError, match=message):
        parse_workload(text)


def test_the_run_is_checked_before_anything_starts():
    with pytest.raises(UsageError, match="fp16 or bf16"):
        _opts(dtype="fp32")
    with pytest.raises(UsageError, match="--starts"):
        _opts(starts=0)
    with pytest.raises(UsageError, match="gpu-memory-utilization"):
        _opts(gpu_memory_utilization=1.5)
    with pytest.raises(UsageError, match="no workload"):
        make_workloads(512, 512, [], [])
    with pytest.raises(UsageError, match="--batch-sizes"):
        make_workloads(512, 512, [0], [])


def test_the_engine_captures_exactly_its_batches():
    o = _opts()
    assert o.capture_sizes == [1, 32]
    spec = o.engine_spec()
    assert spec["dtype"] == "bfloat16" and spec["workloads"][1] == {"input_len": 4096, "output_len": 256, "batch": 32}


def test_by_default_the_engine_captures_8192_tokens_as_vllm_does_for_any_longer_context():
    default = _opts()
    assert default.context is None and default.max_model_len == 8192 and default.capture_len == 8192
    assert "max_seq_len_to_capture" not in default.engine_spec()  # the whole context captured
    assert engine_wanted(default.engine_spec(), {})["max_seq_len_to_capture"] == 8192
    # a longer workload: its own length, rounded up to 256, and graphs captured up to 8192 tokens
    long = _opts(workloads=(Workload(16384, 256, 8),))
    assert long.max_model_len == 16640 and long.engine_spec()["max_seq_len_to_capture"] == 8192
    assert engine_wanted(long.engine_spec(), {})["max_seq_len_to_capture"] == 8192


def test_a_context_given_sizes_the_engine_and_its_graphs():
    # the default's value given: the same engine, the same fingerprint (saved runs still count)
    assert _opts(context=8192).engine_spec() == _opts().engine_spec()
    assert _opts(context=8192).fingerprint() == _opts().fingerprint()
    # the workload's own 4352 tokens (the default before): graphs sized for 4352 tokens
    short = _opts(context=4352)
    assert short.capture_len == 4352 and engine_wanted(short.engine_spec(), {})["max_seq_len_to_capture"] == 4352
    assert short.fingerprint() != _opts().fingerprint()
    # a deployment's 32k context: graphs captured up to vLLM's default 8192 tokens
    o = _opts(context=32768)
    assert o.max_model_len == 32768 and o.capture_len == 8192
    args = engine_wanted(o.engine_spec(), {})
    assert args["max_model_len"] == 32768 and args["max_seq_len_to_capture"] == 8192
    assert o.fingerprint() != _opts().fingerprint()


@pytest.mark.parametrize(("context", "message"), [(4351, "shorter than workload 4096x256 B32 .4352 tokens"),
                                                  (0, "--max-model-len 0 is out of range"),
                                                  (1 << 18, "out of range")])  # fmt: skip
def test_a_context_shorter_than_a_workload_or_out_of_range_is_one_line(context, message):
    with pytest.raises(UsageError, match=message):
        _opts(context=context)


def test_the_fingerprint_changes_with_what_makes_runs_comparable_and_not_with_the_start_count():
    o = _opts()
    assert o.fingerprint() == _opts(starts=7).fingerprint()
    assert o.fingerprint() != _opts(dtype="fp16").fingerprint()
    assert o.fingerprint() != _opts(workloads=(Workload(512, 512, 1),)).fingerprint()
    assert o.fingerprint() != _opts(arms=(KVPATCH, VLLM)).fingerprint()


def test_arms_rotate_so_each_is_in_every_position_equally_often():
    slots = schedule(ARMS, 6)
    assert [s.arm for s in slots[:6]] == [KVPATCH, VLLM, VLLM_TWIN, VLLM, VLLM_TWIN, KVPATCH]
    for arm in ARMS:
        positions = [s.index % 3 for s in slots if s.arm == arm]
        assert sorted(positions) == [0, 0, 1, 1, 2, 2]
    assert [s.index for s in slots] == list(range(18))
    assert [s.name for s in pending(slots[:3], ["r00-vllm"])] == ["r00-kvpatch", "r00-vllm-twin"]
    assert VLLM_TWIN.env == VLLM.env == {"KVPATCH_DISABLE": "1"} and KVPATCH.env == {}


def test_decode_steps_are_those_after_every_request_has_its_first_token():
    # (seconds, new tokens, first tokens): two prefill steps, then decodes of 10 ms, a 1 ms tail
    steps = [(0.3, 2, 2), (0.3, 2, 2), (0.02, 4, 0)] + [(0.010, 4, 0)] * 5 + [(0.012, 4, 0), (0.001, 0, 0)]
    s = step_stats(steps, batch=4, output_len=8)
    assert s["decode_steps"] == 6 and s["decode_ms"] == pytest.approx(10.0)
    assert s["decode_mean_ms"] == pytest.approx(1e3 * (5 * 0.010 + 0.012) / 6)
    assert s["prefill_s"] == pytest.approx(0.6) and s["latency_s"] == pytest.approx(sum(x[0] for x in steps))
    assert s["tokens"] == 32 == s["tokens_expected"]
    assert "decode_ms" not in step_stats([(0.1, 1, 1)], batch=1, output_len=1)
    with pytest.raises(ValueError):
        step_stats([], 1, 1)


def _record(arm: str, rnd: int, decode: float) -> dict:
    row = {"input_len": 512, "output_len": 512, "batch": 1, "decode_ms": decode, "latency_s": decode / 2,
           "tokens_per_s": 1000 / decode}  # fmt: skip
    return {"arm": {"name": arm, "kernels": "kvpatch" if arm == "kvpatch" else "vllm"}, "round": rnd,
            "kernels_logged": ["kvpatch" if arm == "kvpatch" else "vllm"],
            "result": {"engine_start_s": 40.0, "workloads": [row], "plugin": {"line": f"line {arm}"}}}  # fmt: skip


def test_the_report_gives_medians_over_starts_and_ratios_from_rounds_beside_the_aa_twin():
    o = _opts(workloads=(Workload(512, 512, 1),), starts=3)
    recs = [_record("kvpatch", r, k) for r, k in enumerate((5.0, 5.5, 6.0))]
    recs += [_record("vllm", r, v) for r, v in enumerate((6.0, 6.6, 6.3))]
    recs += [_record("vllm-twin", r, v) for r, v in enumerate((6.1, 6.5, 6.3))]
    rep = build_report(o, recs, planned=9)
    row = rep["workloads"][0]
    assert row["arms"]["kvpatch"]["decode_ms"]["median"] == 5.5 and row["arms"]["vllm"]["decode_ms"]["max"] == 6.6
    sp = row["speedup"]["decode_ms"]
    assert sp["median"] == pytest.approx(6.3 / 5.5) and (sp["lo"], sp["hi"]) == pytest.approx((6.3 / 6.0, 6.0 / 5.0))
    assert sp["verdict"] == "faster"
    aa = row["aa"]["decode_ms"]
    assert (aa["lo"], aa["hi"]) == pytest.approx((6.0 / 6.1, 6.6 / 6.5)) and aa["verdict"] == "noise"
    # a rate: more is better, so the ratio is kvpatch's over vLLM's
    assert row["speedup"]["tokens_per_s"]["median"] == pytest.approx((1000 / 5.5) / (1000 / 6.3))
    assert rep["complete"] and rep["arms"]["kvpatch"]["plugin_lines"] == ["line kvpatch"]
    partial = build_report(o, recs[:4], planned=9)
    assert not partial["complete"] and partial["workloads"][0]["aa"]["decode_ms"] == {"n": 0}
    assert partial["workloads"][0]["speedup"]["decode_ms"]["n"] == 1


def test_the_report_says_how_often_each_start_launched_the_grouped_form():
    from kvpatch.render import serving_lines

    o = _opts(workloads=(Workload(512, 512, 1),), starts=2)
    recs = [_record(a, r, 5.0) for r in (0, 1) for a in ("kvpatch", "vllm", "vllm-twin")]
    rep = build_report(o, recs, planned=6)
    assert rep["arms"]["kvpatch"]["grouped_launches"] == [None, None]  # not said: a library without the form
    assert "grouped form" not in "\n".join(serving_lines(rep))
    for r, n in zip(recs[::3], (384, 390), strict=True):
        r["result"]["plugin_after"] = {"grouped_launches": n}
    rep = build_report(o, recs, planned=6)
    assert rep["arms"]["kvpatch"]["grouped_launches"] == [384, 390]
    (line,) = [x for x in serving_lines(rep) if x.lstrip().startswith("kvpatch:")]
    assert line.endswith("; grouped form launched 384-390 times a start (CUDA graph captures)")


def test_the_worker_reads_the_grouped_launches_from_the_registered_library(monkeypatch):
    from types import SimpleNamespace

    from kvpatch.serving import worker
    from kvpatch.vllm_plugin import plugin

    decision = SimpleNamespace(action="register", line=lambda: "kvpatch: ...", bundle="/b")
    monkeypatch.setattr(plugin, "default_target", lambda: SimpleNamespace(namespace="_C", dispatch_key="CUDA"))
    monkeypatch.setattr(plugin, "active_kernel", lambda *a: ("kvpatch", "vllm"))
    monkeypatch.setattr(plugin, "decide", lambda: decision)
    launcher = SimpleNamespace(grouped_launches=lambda: 7)
    monkeypatch.setattr(plugin, "registration", lambda: SimpleNamespace(override=SimpleNamespace(launcher=launcher)))
    assert worker._plugin_state()["grouped_launches"] == 7
    launcher.grouped_launches = None  # a library without the grouped form
    assert worker._plugin_state()["grouped_launches"] is None
    monkeypatch.setattr(plugin, "registration", lambda: None)  # KVPATCH_DISABLE=1: nothing registered
    state = worker._plugin_state()
    assert state["registered"] is False and state["grouped_launches"] is None


def test_a_report_with_another_bundle_reads_it_against_vllm_and_the_enabled_bundle():
    from kvpatch.render import serving_lines
    from kvpatch.serving import Arm

    fast = Arm("fast", "kvpatch", bundle="/bundles/fast", bundle_id="abc")
    o = _opts(workloads=(Workload(512, 512, 1),), starts=2, arms=(KVPATCH, fast, VLLM, VLLM_TWIN))
    ms = {"kvpatch": (5.0, 5.2), "fast": (4.0, 4.0), "vllm": (6.0, 6.4), "vllm-twin": (6.1, 6.3)}
    recs = [_record(a, r, ms[a][r]) for r in (0, 1) for a in ms]
    for r in recs[1::4]:
        r["arm"]["kernels"], r["kernels_logged"] = "kvpatch", ["kvpatch"]
    row = build_report(o, recs, planned=8)["workloads"][0]
    theirs = row["others"]["fast"]
    assert theirs["speedup"]["decode_ms"]["median"] == pytest.approx(6.2 / 4.0)
    assert (theirs["over_kvpatch"]["decode_ms"]["lo"], theirs["over_kvpatch"]["decode_ms"]["hi"]) == pytest.approx(
        (5.0 / 4.0, 5.2 / 4.0))  # fmt: skip
    assert row["speedup"]["decode_ms"]["median"] == pytest.approx(6.2 / 5.1)  # unchanged by the other arm
    text = "\n".join(serving_lines(build_report(o, recs, planned=8)))
    assert "fast speedup" in text and "fast/kvpatch" in text and "1.550 (1.500-1.600)  1.275 (1.250-1.300)" in text
    assert "fast: 2 starts, kvpatch's kernels (the bundle at /bundles/fast) needed, the plugin logged kvpatch" in text
    assert "other" not in build_report(_opts(workloads=(Workload(512, 512, 1),), starts=2), recs, planned=6)[
        "workloads"][0]  # fmt: skip


def test_an_engine_that_loaded_another_bundle_than_its_arms_does_not_count(tmp_path):
    from kvpatch.serving.engine import problems

    (tmp_path / "mine").mkdir()
    (tmp_path / "other").mkdir()
    row = {"input_len": 4, "output_len": 2, "batch": 1, "tokens": 2, "tokens_expected": 2, "decode_ms": 1.0}

    def record(loaded: str) -> dict:
        return {"arm": {"name": "fast", "kernels": "kvpatch", "bundle": str(tmp_path / "mine")},
                "kernels_logged": ["kvpatch"],
                "result": {"plugin": {"registered": True, "bundle": loaded}, "workloads": [row]}}  # fmt: skip

    assert problems(record(str(tmp_path / "mine" / "."))) == []
    assert problems(record(str(tmp_path / "other"))) == [
        f"the plugin loaded the bundle at {tmp_path / 'other'}, the arm needs {tmp_path / 'mine'}'s"]  # fmt: skip
    assert problems(record(""))  # said nothing: not counted
