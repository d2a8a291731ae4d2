"""The serving benchmark's run, end to end on the CPU with a stand-in vLLM engine
(``standin_vllm/``: kvpatch's real plugin decision and log line, a sleeping engine with
V0's step API): engine processes per arm, alternated, each counted only when the plugin's
own log line says it ran the arm's kernels; resumable; stopped by a budget or a timeout."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")

from kvpatch.errors import BuildError, GpuCheckError, UsageError
from kvpatch.progress import Recorder
from kvpatch.serving import ARMS, KVPATCH, VLLM, VLLM_TWIN, ServingOptions, Worker, Workload, run_bench
from kvpatch.serving.engine import engine_env
from kvpatch.serving.options import bundle_arm
from kvpatch.serving.schedule import schedule

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _worker(**env: str) -> Worker:
    path = os.pathsep.join([str(HERE / "standin_vllm"), str(HERE.parent / "vllm_plugin"), str(ROOT)])
    # no bundle folder from the environment: the stand-in makes its own (an arm of --bundle sets one)
    return Worker(extra_env=(("PYTHONPATH", path), ("KVPATCH_PLUGIN_DIR", ""), *env.items()))


def _options(tmp_path: Path, *, starts: int = 2, timeout: float = 120.0, batches=(2, 3)) -> ServingOptions:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"rope_theta": 500000.0}))
    return ServingOptions(model=str(model), model_label="standin", dtype="bf16", starts=starts,
                          workloads=tuple(Workload(4, 12, b) for b in batches), engine_timeout_s=timeout)  # fmt: skip


def test_the_arms_alternate_each_engine_runs_its_arms_kernels_and_the_ratios_read_them(tmp_path):
    starts = tmp_path / "starts.txt"
    options = _options(tmp_path, starts=3)
    progress = Recorder()
    worker = _worker(STANDIN_STEP_MS="12", STANDIN_STEP_MS_KVPATCH="6", STANDIN_STARTS=str(starts))
    report = run_bench(options, tmp_path / "raw", worker=worker, progress=progress)
    # one engine process per slot, in the schedule's order, each with its arm's environment
    seen = starts.read_text().splitlines()
    order = [s.arm.name for s in schedule(ARMS, 3)]
    assert order == ["kvpatch", "vllm", "vllm-twin", "vllm", "vllm-twin", "kvpatch", "vllm-twin", "kvpatch", "vllm"]
    assert [line.split("|")[0] for line in seen] == ["" if a == "kvpatch" else "1" for a in order]
    assert {line.split("|", 1)[1].rsplit("|", 1)[0] for line in seen} == {"0|XFORMERS|[2, 3]"}
    assert report["complete"] and report["engine_starts"] == 9 and report["planned"] == 9
    arms = report["arms"]
    assert arms["kvpatch"]["kernels_logged"] == ["kvpatch"] and arms["vllm"]["kernels_logged"] == ["vllm"]
    assert arms["vllm-twin"]["kernels_logged"] == ["vllm"] and {a["starts"] for a in arms.values()} == {3}
    assert any("now run kvpatch's patched kernels" in line for line in arms["kvpatch"]["plugin_lines"])
    assert any("KVPATCH_DISABLE" in line for line in arms["vllm"]["plugin_lines"])
    for row in report["workloads"]:
        speed, aa = row["speedup"]["decode_ms"], row["aa"]["decode_ms"]
        assert speed["n"] == 3 and 1.5 < speed["lo"] <= speed["median"] <= speed["hi"] < 2.6, speed  # 12 ms vs 6 ms
        assert aa["n"] == 3 and 0.75 < aa["lo"] <= aa["hi"] < 1.35, aa  # identical arms: about 1
        assert row["speedup"]["decode_ms"]["verdict"] == "faster"
        assert row["speedup"]["tokens_per_s"]["median"] > 1.2  # fewer seconds, more tokens a second
        assert row["arms"]["kvpatch"]["decode_ms"]["n"] == 3
    assert any("engine start 9 of 9: vllm, round 3" in line for line in progress.lines)
    assert any(line.startswith("r00-kvpatch: engine up in") for line in progress.lines)
    raw = sorted(p.name for p in (tmp_path / "raw").glob("r*.json") if p.name.count(".") == 1)
    assert raw == sorted(f"{s.name}.json" for s in schedule(ARMS, 3))


def test_an_arm_of_another_bundle_loads_that_bundle_and_reads_against_vllm_and_the_enabled_one(tmp_path):
    sys.path.insert(0, str(HERE.parent / "vllm_plugin"))
    try:
        import standin
    finally:
        sys.path.pop(0)
    other = standin.make_bundle(tmp_path / "bundle-fast")
    (other / "standin-step-ms").write_text("3")
    fast = bundle_arm("fast=bundle-fast", tmp_path)
    with pytest.raises(UsageError, match="the name 'fast' is taken"):
        bundle_arm("fast=bundle-fast", tmp_path, taken=["fast"])
    options = replace(_options(tmp_path, starts=2), arms=(KVPATCH, fast, VLLM, VLLM_TWIN))
    worker = _worker(STANDIN_STEP_MS="12", STANDIN_STEP_MS_KVPATCH="6")
    report = run_bench(options, tmp_path / "raw", worker=worker)
    assert [s.arm.name for s in schedule(options.arms, 2)] == [
        "kvpatch", "fast", "vllm", "vllm-twin", "fast", "vllm", "vllm-twin", "kvpatch"]  # fmt: skip
    assert report["complete"] and report["engine_starts"] == 8
    arms = report["arms"]
    assert arms["fast"]["kernels_logged"] == ["kvpatch"] and arms["fast"]["bundle"] == str(other.resolve())
    assert "bundle" not in arms["kvpatch"]
    for row in report["workloads"]:
        theirs = row["others"]["fast"]
        assert 1.5 < row["speedup"]["decode_ms"]["median"] < 2.6  # 12 ms vs 6 ms, as without the arm
        assert 2.8 < theirs["speedup"]["decode_ms"]["lo"] <= theirs["speedup"]["decode_ms"]["hi"] < 5.5  # 12 vs 3
        assert 1.4 < theirs["over_kvpatch"]["decode_ms"]["lo"] <= theirs["over_kvpatch"]["decode_ms"]["hi"] < 2.8
        assert theirs["over_kvpatch"]["decode_ms"]["n"] == 2
    # the bundle's kernels, not its folder, make the runs comparable: a copy elsewhere resumes them
    moved = tmp_path / "elsewhere"
    shutil.copytree(other, moved)
    again = replace(options, arms=(KVPATCH, bundle_arm(f"fast={moved}", tmp_path), VLLM, VLLM_TWIN))
    assert run_bench(again, tmp_path / "raw", worker=_worker(STANDIN_FAIL="crash"))["engine_starts"] == 8


def test_a_second_run_on_the_same_folder_starts_only_what_is_missing(tmp_path):
    starts = tmp_path / "starts.txt"
    worker = _worker(STANDIN_STARTS=str(starts))
    first = run_bench(_options(tmp_path, starts=1), tmp_path / "raw", worker=worker)
    assert first["complete"] and len(starts.read_text().splitlines()) == 3
    second = run_bench(_options(tmp_path, starts=2), tmp_path / "raw", worker=worker)
    assert second["complete"] and second["engine_starts"] == 6
    assert len(starts.read_text().splitlines()) == 6  # three more, not six
    third = run_bench(_options(tmp_path, starts=2), tmp_path / "raw", worker=worker)
    assert third["engine_starts"] == 6 and len(starts.read_text().splitlines()) == 6
    with pytest.raises(UsageError, match="another benchmark"):
        run_bench(_options(tmp_path, starts=2, batches=(2,)), tmp_path / "raw", worker=worker)


def test_a_budget_stops_before_a_start_that_would_overrun_and_says_how_to_go_on(tmp_path):
    progress = Recorder()
    report = run_bench(_options(tmp_path, starts=2), tmp_path / "raw", worker=_worker(), budget_s=0.001,
                       progress=progress)  # fmt: skip
    assert not report["complete"] and report["engine_starts"] == 1 and report["planned"] == 6
    assert any("budget" in line and "same --raw" in line for line in progress.lines)


def test_an_engine_that_stays_on_vllms_kernels_in_the_kvpatch_arm_is_refused(tmp_path):
    # KVPATCH_DISABLE leaks into every engine: the kvpatch arm would measure vLLM's kernels
    worker = _worker(KVPATCH_DISABLE="1")
    options = _options(tmp_path, starts=1)
    assert engine_env(schedule(ARMS, 1)[0], {"KVPATCH_DISABLE": "1"}, Worker()).get("KVPATCH_DISABLE") is None
    with pytest.raises(
        GpuCheckError, match=r"r00-kvpatch: the plugin's log says vllm kernels ran, the arm needs kvpatch"
    ):
        run_bench(options, tmp_path / "raw", worker=worker)
    assert not (tmp_path / "raw" / "r00-kvpatch.json").exists()  # a run that does not count is not kept
    assert (tmp_path / "raw" / "r00-kvpatch.log").exists()


def test_a_request_that_stops_short_fails_the_run(tmp_path):
    with pytest.raises(GpuCheckError, match="generated .* tokens of"):
        run_bench(_options(tmp_path, starts=1), tmp_path / "raw", worker=_worker(STANDIN_FAIL="short"))


def test_an_engine_that_fails_to_start_is_one_line_naming_its_log(tmp_path):
    with pytest.raises(
        BuildError, match=r"engine process failed \(exit 1\): RuntimeError: stand-in engine failed.*log: "
    ):
        run_bench(_options(tmp_path, starts=1), tmp_path / "raw", worker=_worker(STANDIN_FAIL="crash"))


def test_an_engine_past_its_timeout_is_stopped_with_its_whole_group(tmp_path):
    import time

    t0 = time.monotonic()
    with pytest.raises(BuildError, match="ran past --engine-timeout"):
        run_bench(_options(tmp_path, starts=1, timeout=3.0), tmp_path / "raw", worker=_worker(STANDIN_FAIL="hang"))
    assert time.monotonic() - t0 < 30


def test_sigterm_stops_the_engine_in_flight_with_its_group(tmp_path):
    """SIGTERM reaches the bench as the CLI turns it (a KeyboardInterrupt): the engine process
    in flight is gone when the bench has stopped."""
    import signal
    import subprocess
    import sys
    import time

    starts = tmp_path / "starts.txt"
    script = f"""
import signal, sys
from pathlib import Path
sys.path[:0] = [{str(ROOT)!r}, {str(HERE)!r}]
from test_serving_run import _options, _worker
from kvpatch.serving import run_bench
def stop(*_):
    raise KeyboardInterrupt
signal.signal(signal.SIGTERM, stop)
try:
    run_bench(_options(Path({str(tmp_path)!r})), Path({str(tmp_path / "raw")!r}),
              worker=_worker(STANDIN_FAIL="hang", STANDIN_STARTS={str(starts)!r}))
except KeyboardInterrupt:
    sys.exit(143)
"""
    proc = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    while not (starts.exists() and starts.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.2)
    engine = int(starts.read_text().split("|")[-1])
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(engine, 0)
    assert not (tmp_path / "raw" / "r00-kvpatch.json").exists()


def _shape_options(folder: Path, starts: int = 1) -> ServingOptions:
    """A shipped shape as 'kvpatch plugin bench' makes one: its config.json inside the --raw folder."""
    model = folder / "model-standin-bfloat16"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps({"rope_theta": 500000.0}))
    return ServingOptions(model=str(model), model_label="standin", dtype="bf16", starts=starts,
                          workloads=(Workload(4, 12, 2),), extra={"model_shape": "standin"})  # fmt: skip


def test_a_raw_folder_moved_elsewhere_resumes_also_one_written_when_the_models_path_was_hashed(tmp_path):
    starts = tmp_path / "starts.txt"
    worker = _worker(STANDIN_STARTS=str(starts))
    run_bench(_shape_options(tmp_path / "a"), tmp_path / "a", worker=worker)
    assert len(starts.read_text().splitlines()) == 3
    (tmp_path / "a").rename(tmp_path / "b")
    again = run_bench(_shape_options(tmp_path / "b"), tmp_path / "b", worker=worker)
    assert again["complete"] and len(starts.read_text().splitlines()) == 3  # nothing ran again
    # a folder whose manifest and runs hashed the model's path (as kvpatch did before): still its runs
    old = _shape_options(tmp_path / "b").fingerprint(model=str(tmp_path / "a" / "model-standin-bfloat16"))
    for p in (tmp_path / "b").glob("*.json"):
        if not p.name.endswith((".spec.json", ".result.json")):
            p.write_text(json.dumps({**json.loads(p.read_text()), "fingerprint": old}))
    (tmp_path / "b").rename(tmp_path / "c")
    third = run_bench(_shape_options(tmp_path / "c"), tmp_path / "c", worker=worker)
    assert third["complete"] and len(starts.read_text().splitlines()) == 3
    # another benchmark's runs stay refused, whatever the paths
    other = ServingOptions(**{**_shape_options(tmp_path / "c").__dict__, "workloads": (Workload(4, 12, 3),)})
    with pytest.raises(UsageError, match="another benchmark"):
        run_bench(other, tmp_path / "c", worker=worker)


@pytest.mark.parametrize("name", ["bench.json", "r00-kvpatch.json", "r00-kvpatch.spec.json"])
def test_a_fifo_in_the_raw_folder_is_a_damaged_file_not_a_hang(tmp_path, name):
    """Before: a FIFO where a run's record, a spec or the manifest goes blocked the resume's read
    forever. After: read as no regular file: damaged (a manifest so is another benchmark's)."""
    from conftest import in_thread

    from kvpatch.serving.bench import saved_runs

    folder = tmp_path / "raw"
    folder.mkdir()
    os.mkfifo(folder / name)
    options = _shape_options(tmp_path / "model")
    outcome: list = []
    finished, error = in_thread(lambda: outcome.append(saved_runs(options, folder, schedule(options.arms, 1))), 30)
    assert finished, "the read of a FIFO blocked"
    assert (isinstance(error, UsageError) and "another benchmark" in str(error)) if name == "bench.json" else \
        (error is None and outcome == [{}])  # fmt: skip
