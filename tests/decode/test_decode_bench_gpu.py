"""On a GPU (``-m gpu``): the decode bench over both attention kernels and batch sizes stays
bit-identical to stock, every launch knob of the weight prefetch keeps the step bit-identical,
and the two micro-benchmarks run.

Libraries: ``KVPATCH_DECODE_LIBS`` names a folder ``bash scripts/gpu_decode.sh --prepare`` wrote
(``.gpu/decode`` by default); the tests skip without it, or without a GPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from decode_helpers import prepared_libs  # noqa: E402

from kvpatch.decode.options import WeightPrefetch  # noqa: E402

MiB = 1 << 20


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    libs, pf = prepared_libs(tmp_path_factory)
    return {k: v for k, v in libs.items() if k in ("stock", "patched")}, pf


def test_the_bench_is_bit_identical_on_v1_and_v2_and_prefetches_only_where_its_cap_says(prepared, tmp_path):
    from kvpatch.decode.bench import run_bench_decode
    from kvpatch.render import decode_text

    libs, pf = prepared
    wpf = WeightPrefetch(windows=(), caps={1: 32 * MiB})  # the first form: batch 1 only
    rep = run_bench_decode(libs, models=["llama-3.1-8b"], dtypes=["bf16"], batches=[1, 64], contexts=[1024, 9000],
                           layers=2, rounds=1, cycles=1, weight_prefetch=wpf, prefetch_library=pf,
                           json_path=tmp_path / "d.json", plot_path=tmp_path / "d.png")  # fmt: skip
    assert rep.points and not rep.skipped
    for p in rep.points:
        assert p["finite"], p
        assert p["all_identical"], {n: v["identical_to_stock"] for n, v in p["variants"].items()}
    kernels = {(p["batch"], p["context"]): p["kernel"] for p in rep.points}
    assert kernels[(1, 1024)] == "v2" and kernels[(64, 1024)] == "v1" and kernels[(64, 9000)] == "v2"
    fetched = {(p["batch"], p["context"]): p["variants"]["stock+wpf"]["prefetch_bytes"] for p in rep.points}
    assert fetched[(1, 1024)] == 2 * 32 * MiB and fetched[(64, 1024)] == fetched[(64, 9000)] == 0
    assert all(p["variants"]["stock+zero"]["prefetch_bytes"] == 0 for p in rep.points)
    assert (tmp_path / "d.png").stat().st_size > 1000 and "llama-3.1-8b" in decode_text(rep)


def test_every_prefetch_knob_keeps_the_step_bit_identical(prepared):
    from kvpatch.decode.arms import Arm
    from kvpatch.decode.bench import cuda_device
    from kvpatch.decode.measure import measure_point
    from kvpatch.decode.models import model_shape
    from kvpatch.decode.step import DecodeStep, DecodeWeights
    from kvpatch.gpu.flush import L2Flush
    from kvpatch.gpu.timing import Timer, l2_bytes_of

    libs, pf = prepared
    dev = cuda_device("cuda")
    step = DecodeStep(DecodeWeights(model_shape("llama-3.1-8b"), "bf16", 2, dev), 1, 1024)
    base = WeightPrefetch(windows=(), caps=16 * MiB)
    knobs = base.with_(grid=132, threads=128, chunk=16384, hint="none", fork="qkv", join="oproj", priority="normal")
    arms = [Arm("stock", "stock"), Arm("stock+wpf", "stock", base), Arm("knobs", "stock", knobs),
            Arm("first", "stock", base.with_(hint="evict_first", grid=7)), Arm("windows", "stock", WeightPrefetch())]  # fmt: skip
    p = measure_point(step, arms, libs, pf, dev, rounds=1, cycles=1, round_seconds=0.05, flush=L2Flush(dev, l2_bytes_of(dev)),
                      cold=False, timer=Timer(dev))  # fmt: skip
    assert p["all_identical"], {n: v["identical_to_stock"] for n, v in p["variants"].items()}
    v = p["variants"]
    assert v["knobs"]["grids"] == [132] and v["first"]["grids"] == [7]
    assert v["knobs"]["prefetch_bytes"] == 2 * 16 * MiB and v["stock"]["prefetch_bytes"] == 0
    assert p["guard"]["on"] and p["guard"]["hinted_arms"] == ["stock+wpf", "windows"]  # the library's evict_last


def test_gemm_micro_benchmark_runs(prepared):
    from kvpatch.decode.micro import run_micro_gemm
    from kvpatch.render import micro_table

    _, pf = prepared
    micro = run_micro_gemm(pf, shapes=[("o_proj", 4096, 4096)], batches=[1], trials=5)
    (r,) = micro["results"]
    assert r["cold_us"] > 0 and r["prefetched_us"] > 0 and r["warm_us"] > 0 and r["prefetched_bytes"] == 32 * MiB
    assert micro["demoted"] and "o_proj" in micro_table(micro)


def test_prefetch_micro_benchmark_runs(prepared):
    from kvpatch.decode.micro import run_micro_prefetch
    from kvpatch.render import micro_prefetch_table

    _, pf = prepared
    m = run_micro_prefetch(
        pf,
        configs=[
            {"bytes": 8 * MiB, "grid": 32},
            {"bytes": 8 * MiB, "grid": 132, "threads": 128, "chunk": 16384, "hint": "none"},
        ],
        trials=3,
    )
    assert len(m["results"]) == 2 and all(
        r["kernel_us"] > 0 and r["fill_GBps"] > 0 and r["cold_us"] > 0 for r in m["results"]
    )
    assert "fill GB/s" in micro_prefetch_table(m)
