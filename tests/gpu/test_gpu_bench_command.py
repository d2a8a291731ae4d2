"""``kvpatch bench`` (kvpatch.commands.bench): options -> the points, the timing options checked
before anything runs, and the CLI on prebuilt libraries with CPU stand-ins."""

from __future__ import annotations

import json

import pytest
from gpu_helpers import FakeKernels, has_matplotlib, needs_torch, run_cli

from kvpatch.commands import bench as Bc
from kvpatch.commands.common import parse_bools, parse_heads
from kvpatch.errors import UsageError
from kvpatch.gpu import bench as Bn
from kvpatch.gpu import launch as Ln


def test_bench_points_from_options():
    pts, name = Bc.bench_points(Bc.BenchOptions())
    assert name == "headline" and len(pts) == 24
    pts, name = Bc.bench_points(Bc.BenchOptions(point_set="heldout", heads=[(8, 1)], batches=[64]))
    assert name == "heldout" and len(pts) == 2 * 3 and {p.num_kv_heads for p in pts} == {1}
    pts, name = Bc.bench_points(Bc.BenchOptions(head_sizes=[64, 256], block_sizes=[32], heads=parse_heads("32/8,8/1"),
                                                batches=[1], contexts=[1024], dtypes=["bf16"], seed=7))  # fmt: skip
    assert name == "custom" and len(pts) == 4 and {p.seed for p in pts} == {7}
    pts, _ = Bc.bench_points(Bc.BenchOptions(point_set="tuning", seed=5))
    assert {p.seed for p in pts} == {5}
    assert len(Bc.bench_points(Bc.BenchOptions(quick=True))[0]) == 8
    with pytest.raises(UsageError):
        Bc.bench_points(Bc.BenchOptions(point_set="tuning", batches=[3]))
    with pytest.raises(UsageError):
        Bc.bench_points(Bc.BenchOptions(point_set="everything"))


def test_capture_len_sizes_every_point_s_launch_and_must_cover_every_context():
    pts, _ = Bc.bench_points(Bc.BenchOptions(contexts=[512, 2048], batches=[16], capture_len=8192))
    assert {p.capture for p in pts} == {8192} and {p.context for p in pts} == {512, 2048}
    assert {p.dispatched for p in pts} == {"v2"}  # 16 x 32 query heads, 16 partitions: vLLM's v2
    assert {p.capture for p in Bc.bench_points(Bc.BenchOptions())[0]} == {0}
    for bad in (1024, 0, 1 << 20):
        with pytest.raises(UsageError, match=f"--capture-len {bad}: choose 2048 .the longest context. to 131072"):
            Bc.bench_points(Bc.BenchOptions(contexts=[512, 2048], capture_len=bad))


def test_heads_and_on_off_lists():
    assert parse_heads("32/8, 8/1") == [(32, 8), (8, 1)]
    assert parse_heads("1024/8") == [(1024, 8)]
    for bad in ("32", "32/x", "30/8", "8/0", "1025/1"):
        with pytest.raises(UsageError, match="invalid heads"):
            parse_heads(bad)
    assert parse_bools("on,off,1") == [True, False, True]
    with pytest.raises(UsageError):
        parse_bools("maybe")


@pytest.mark.parametrize("opts, message", [
    (dict(warm=False, cold=False), "neither warm nor cold"),
    (dict(reps=0), "reps and rounds must be >= 1"),
    (dict(kernels=["v3"]), "unknown kernel 'v3'"),
    (dict(kernels=[]), "no kernels selected"),
])  # fmt: skip
def test_bench_refuses_timing_options_before_anything_runs(tmp_path, opts, message):
    with pytest.raises(UsageError, match=message):
        Bc.run(Bc.BenchOptions(cwd=tmp_path, libs=[f"stock={tmp_path}/none.so:s"], **opts))


@pytest.fixture
def cpu_bench(monkeypatch, tmp_path):
    """``kvpatch bench`` on CPU: stand-in kernels (``kernels``, a FakeKernels class) for the
    libraries s.so and p.so in ``tmp_path``, a small L2 and copy size."""

    def setup(kernels=FakeKernels):
        monkeypatch.setattr(Ln, "load_libs", lambda specs: {s.name: kernels() for s in specs})
        real = Bn.run_bench

        def small(libs, points, **kw):
            kw.update(l2_bytes=1 << 16, copy_bytes=1 << 20)
            return real(libs, points, **kw)

        monkeypatch.setattr(Bn, "run_bench", small)
        for n in ("s", "p"):
            (tmp_path / f"{n}.so").write_bytes(b"")

    return setup


@pytest.mark.slow
@needs_torch
def test_bench_with_prebuilt_libs_on_cpu(cpu_bench, monkeypatch, tmp_path, capsys):
    cpu_bench()
    monkeypatch.chdir(tmp_path)
    info = tmp_path / "info.json"
    info.write_text(json.dumps({"patched": {"marker": "lookahead=2", "compile_flags": ["-O3"]}}))
    rc = run_cli("bench", "--lib", f"stock={tmp_path}/s.so:s", "--lib", f"patched={tmp_path}/p.so:p", "--device", "cpu",
                 "--dtypes", "bf16", "--batches", "1", "--contexts", "40", "--heads", "4/2", "--head-sizes", "32",
                 "--reps", "2", "--rounds", "2", "--no-cold", "--aa", "--json", str(tmp_path / "r.json"),
                 "--variant-info", str(info), *(["--plot", str(tmp_path / "r.png")] if has_matplotlib() else []))  # fmt: skip
    assert rc == 0
    d = json.loads((tmp_path / "r.json").read_text())
    assert d["point_set"] == "custom" and d["variant_info"]["patched"]["marker"] == "lookahead=2"
    assert d["variant_info"]["patched"]["compile_flags"] == ["-O3"]
    assert d["variant_info"]["stock"]["so"] == str(tmp_path / "s.so")
    assert d["variant_info"]["stock"]["marker"] == "stock" and d["variants"] == ["stock", "patched", "stock-aa"]
    assert [p["head_size"] for p in d["settings"]["points"]] == [32] and d["settings"]["modes"] == ["warm"]
    row = d["summary"][0]
    assert row["faster"] + row["noise"] + row["slower"] == row["n"]
    assert "speedup over stock" in capsys.readouterr().out
    if has_matplotlib():
        assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@needs_torch
def test_bench_with_launches_sized_past_the_context_on_cpu(cpu_bench, tmp_path, capsys):
    sized = set()

    class Recording(FakeKernels):
        def _compute(self, out, *args):
            sized.add(args[8])  # max_seq_len, as the launcher is given it
            return super()._compute(out, *args)

    cpu_bench(Recording)
    rc = run_cli("bench", "--lib", f"stock={tmp_path}/s.so:s", "--lib", f"patched={tmp_path}/p.so:p", "--device", "cpu",
                 "--dtypes", "bf16", "--batches", "1", "--contexts", "40", "--heads", "4/2", "--head-sizes", "32",
                 "--capture-len", "1100", "--kernels", "dispatched", "--reps", "2", "--rounds", "1", "--no-cold",
                 "--json", str(tmp_path / "r.json"))  # fmt: skip
    assert rc == 0
    d = json.loads((tmp_path / "r.json").read_text())
    assert [(p["context"], p["capture"]) for p in d["settings"]["points"]] == [(40, 1100)]
    assert [(r["kernel"], r["dispatched"]) for r in d["results"]] == [("v2", True)]
    assert d["results"][0]["variants"]["patched"]["outputs_match"] and not d["mismatches"]
    assert "40@1100" in capsys.readouterr().out and sized == {1100}
