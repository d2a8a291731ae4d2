"""kvpatch.gpu.bench's pipeline on the CPU with stand-in "kernels": outputs checked before
timing, every variant timed in every round, the A/A control, host-bound chunks reported."""

from __future__ import annotations

import json
import types

import pytest

torch = pytest.importorskip("torch")

from gpu_helpers import FakeKernels, GroupedKernels  # noqa: E402

from kvpatch.errors import UsageError  # noqa: E402
from kvpatch.gpu import bench as B  # noqa: E402
from kvpatch.gpu import bench_report as Br  # noqa: E402
from kvpatch.gpu import points as P  # noqa: E402
from kvpatch.gpu import timing as Tm  # noqa: E402


def _points(**kw):
    base = dict(
        dtypes=("fp16",), batches=(1,), contexts=(16,), num_heads=4, num_kv_heads=2, head_size=32, block_size=16
    )
    return P.make_points(**{**base, **kw})


@pytest.mark.slow
def test_run_bench_on_cpu_with_fakes():
    libs = {"stock": FakeKernels(), "paper": FakeKernels(), "broken": FakeKernels("offbyone")}
    pts = _points(batches=(1, 2), contexts=(16, 600))
    msgs = []
    rep = B.run_bench(libs, pts, reps=3, warmup=1, rounds=2, device="cpu", l2_bytes=1 << 16,
                      copy_bytes=1 << 20, variant_info={"paper": {"preset": "paper"}}, progress=msgs.append)  # fmt: skip
    assert rep.variants == ["stock", "paper", "broken"]
    assert len(rep.results) == 4 * 2 * 2
    for r in rep.results:
        for t in r.variants.values():
            assert len(t.samples_us) == 2 and all(len(s) == 3 for s in t.samples_us)  # 2 rounds x 3 reps
            assert t.median_us > 0 and t.kv_bytes_per_s > 0
        assert r.variants["paper"].outputs_match is True and r.variants["broken"].outputs_match is False
    assert len(rep.mismatches) == 8 and all(m.startswith("broken: ") for m in rep.mismatches)
    assert rep.copy_bandwidth["bytes_per_s"] > 0 and rep.copy_bandwidth["bytes_moved"] == 2 << 20
    assert rep.settings["pools"][0]["blocks"] >= 1.2 * 2 * 38
    assert rep.env["variants"]["paper"] == {"preset": "paper"}
    assert any(m.startswith("pool 1/1") for m in msgs)
    d = json.loads(rep.to_json())
    assert d["settings"]["modes"] == ["warm", "cold"] and d["env"]["torch"] == torch.__version__
    assert {r["dispatched"] for r in d["results"]} == {True, False}
    lead = d["settings"]["lead"]  # every timed round went through chunks; none late on the CPU (no sleep)
    assert lead["chunks"] >= 4 * 2 * 2 and lead["retried"] == lead["host_bound"] == 0
    assert not any("host" in w for w in rep.warnings)
    assert not rep.ok


def test_run_bench_without_the_output_check_times_a_broken_variant_too():
    libs = {"stock": FakeKernels(), "broken": FakeKernels("offbyone")}
    rep = B.run_bench(libs, _points(), reps=2, warmup=0, rounds=1, device="cpu", l2_bytes=1 << 16,
                      copy_bytes=1 << 16, check_outputs=False, cold=False)  # fmt: skip
    assert rep.ok and rep.mismatches == []
    assert all(r.variants["broken"].outputs_match is None for r in rep.results)


def test_run_bench_warns_when_chunks_stay_host_bound(monkeypatch):
    """A sleep that has always ended before the host is done: every chunk is timed twice,
    counted as host-bound, and the report says so."""
    monkeypatch.setattr(Tm.Timer, "lead", lambda self, seconds: types.SimpleNamespace(query=lambda: True))
    libs = {"stock": FakeKernels(), "v": FakeKernels()}
    rep = B.run_bench(libs, _points(), reps=2, warmup=1, rounds=1, device="cpu", l2_bytes=1 << 16, copy_bytes=1 << 16)
    lead = rep.settings["lead"]
    assert lead["host_bound"] > 0 and lead["chunks"] == Tm.LEAD_ATTEMPTS * lead["host_bound"]
    assert any(f"{lead['host_bound']} of {lead['chunks']} chunks" in w for w in rep.warnings)


def test_run_bench_aa_control_times_the_baseline_again():
    """--aa adds stock's own kernels as one more variant: every slower verdict it gets is
    counted as stock code (the method's false verdicts), and its outputs equal stock's."""
    stock, other = FakeKernels(), FakeKernels()
    rep = B.run_bench({"stock": stock, "v": other}, _points(), reps=2, warmup=1, rounds=2, device="cpu",
                      l2_bytes=1 << 16, copy_bytes=1 << 16, kernels=("v1",), adaptive=False, aa=True,
                      variant_info={"stock": {"so": "s.so"}})  # fmt: skip
    assert rep.variants == ["stock", "v", B.AA]
    assert rep.variant_info[B.AA] == {"so": "s.so", "marker": "stock", "aa_of": "stock"}
    assert all(r.variants[B.AA].outputs_match for r in rep.results)
    assert stock.calls == 2 * other.calls  # the A/A launches stock's kernels
    assert all(Br.result_stock_code(Br.stock_code_of(rep.variant_info, "stock"), B.AA, r) is True for r in rep.results)
    row = next(r for r in rep.summary if r["variant"] == B.AA and r["scope"] == "dispatched")
    assert row["slower_stock_code"] == row["slower"]
    with pytest.raises(UsageError, match="A/A"):
        B.run_bench({"stock": stock, B.AA: other}, _points(), reps=1, rounds=1, device="cpu", l2_bytes=1 << 16,
                    copy_bytes=1 << 16, aa=True)  # fmt: skip


def test_run_bench_records_which_launches_took_the_grouped_form():
    """The output check's launch tells per point and variant whether the grouped form ran (the
    library's counter): GQA 4 takes it, MHA does not; a library without one says nothing."""
    libs = {"stock": FakeKernels(), "g4": GroupedKernels()}
    pts = _points(num_heads=8, num_kv_heads=2) + _points(num_heads=4, num_kv_heads=4)
    rep = B.run_bench(libs, pts, reps=2, warmup=1, rounds=1, device="cpu", l2_bytes=1 << 16, copy_bytes=1 << 16,
                      kernels=("v1",), adaptive=False, cold=False)  # fmt: skip
    took = {r.point.num_kv_heads: r.variants["g4"].grouped for r in rep.results}
    assert took == {2: True, 4: False}
    assert all(r.variants["stock"].grouped is None for r in rep.results)
    assert json.loads(rep.to_json())["results"][0]["variants"]["g4"]["grouped"] is True
    unchecked = B.run_bench(libs, pts, reps=2, warmup=1, rounds=1, device="cpu", l2_bytes=1 << 16,
                            copy_bytes=1 << 16, kernels=("v1",), adaptive=False, cold=False, check_outputs=False)  # fmt: skip
    assert all(r.variants["g4"].grouped is None for r in unchecked.results)


def test_run_bench_refuses_unbuilt_points():
    libs = {"stock": FakeKernels(), "v": FakeKernels(configs=("fp16/auto/32/16",))}
    with pytest.raises(UsageError, match="bf16/auto/32/16 not built in v"):
        B.run_bench(libs, _points(dtypes=("fp16", "bf16")), reps=1, rounds=1, device="cpu", l2_bytes=1 << 16,
                    copy_bytes=1 << 16)  # fmt: skip


def test_run_bench_times_only_the_dispatched_kernel_when_asked():
    libs = {"stock": FakeKernels(), "v": FakeKernels()}
    pts = _points(contexts=(16, 600))  # batch 1: v1 at one partition, v2 at two
    rep = B.run_bench(libs, pts, reps=1, warmup=0, rounds=1, device="cpu", l2_bytes=1 << 16, copy_bytes=1 << 16,
                      kernels=("dispatched",), cold=False)  # fmt: skip
    assert [(r.point.context, r.kernel) for r in rep.results] == [(16, "v1"), (600, "v2")]
    assert all(r.dispatched for r in rep.results)
