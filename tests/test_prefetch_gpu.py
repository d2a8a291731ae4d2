"""kvpatch.prefetch on a CUDA GPU (marker ``gpu``; skipped without one).

The prefetch library comes from ``$KVPATCH_PREFETCH_LIB`` or is built here (needs nvcc).
The decode tests need attention libraries: ``KVPATCH_TEST_LIBS=stock=PATH.so:PREFIX,patched=...``
(as tests/test_gpu.py); without it they skip.
"""

from __future__ import annotations

import gc
import os
import weakref

import pytest

pytestmark = pytest.mark.gpu


def _cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


torch = _cuda()
if torch is None:
    pytest.skip("needs a CUDA GPU and torch with CUDA", allow_module_level=True)

from kvpatch.prefetch import PrefetchController  # noqa: E402
from kvpatch.prefetch import decode as D  # noqa: E402
from kvpatch.prefetch.kernel import PrefetchLibrary, archs_for_capability, build_prefetch_library  # noqa: E402

MiB = 1 << 20


@pytest.fixture(scope="module")
def library():
    path = os.environ.get("KVPATCH_PREFETCH_LIB") or build_prefetch_library(archs_for_capability(*torch.cuda.get_device_capability()))
    return PrefetchLibrary(path)


@pytest.fixture(scope="module")
def attention_libs():
    spec = os.environ.get("KVPATCH_TEST_LIBS")
    if not spec:
        pytest.skip("KVPATCH_TEST_LIBS is not set")
    from kvpatch.gpu.launch import Kernels

    libs = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, path, prefix = D.parse_lib_arg(part)
        libs[name] = Kernels(path, prefix)
    return libs


def cycles(us: float) -> int:
    khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", None) or 1_980_000
    return int(us * khz / 1e3)


def test_eager_fork_waits_for_the_current_stream_and_join_rejoins(library):
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    before = w.clone()
    ctl = PrefetchController("cuda", library=library)
    ctl.add("gemm", 0, [w], cap_bytes=16 * MiB)
    torch.cuda.synchronize()
    start, slept, side_done = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    start.record()
    torch.cuda._sleep(cycles(20_000))  # ~20 ms on the current stream
    slept.record()
    assert ctl.fork("gemm", 0) is True
    side_done.record(ctl.stream)
    ctl.join()
    marker = torch.cuda.Event()
    marker.record()
    torch.cuda.synchronize()
    assert ctl.stream.query() and marker.query() and ctl.launches == 1
    # The side stream waited for the work before the fork: its prefetch ended after the sleep
    # (timestamps on the GPU, whatever the clock rate torch reports).
    assert start.elapsed_time(slept) > 1.0
    assert start.elapsed_time(side_done) >= start.elapsed_time(slept)
    assert torch.equal(w, before)  # a prefetch never changes memory


def test_launch_errors_are_raised(library):
    with pytest.raises(RuntimeError, match="kvpatch_l2_prefetch failed"):
        library.launch(0x1000, 1, 0, 0)


def test_graph_captured_fork_and_join(library):
    w = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    x = torch.randn(4, 2048, device="cuda", dtype=torch.float16)
    out = torch.empty(4, 2048, device="cuda", dtype=torch.float16)
    ctl = PrefetchController("cuda", library=library)
    ctl.add("gemm", 0, [w])

    def step():
        ctl.fork("gemm", 0)
        torch.cuda._sleep(cycles(20))
        out.copy_(x @ w.t())
        ctl.join()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # fails with "unjoined" work if join() did not rejoin
        step()
    assert not ctl.pending and ctl.launches == 2
    out.fill_(float("nan"))
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    # cuBLAS may pick another algorithm under capture: close, not bitwise, is the point here
    assert torch.allclose(out.float(), (x @ w.t()).float(), rtol=1e-2, atol=1e-2)
    assert ctl.launches == 2  # replays do not go through Python


def test_tables_keep_tensors_alive_after_the_caller_drops_them(library):
    ctl = PrefetchController("cuda", library=library)

    def add():
        w = torch.full((1024, 1024), 3.0, device="cuda")
        ctl.add("w", 0, [w])
        return weakref.ref(w), w.data_ptr()

    ref, ptr = add()
    gc.collect()
    torch.cuda.empty_cache()
    junk = [torch.zeros(1024, 1024, device="cuda") for _ in range(8)]  # would reuse freed blocks
    assert ref() is not None and ref().data_ptr() == ptr
    assert ctl.table("w", 0).ranges[0][0] == ptr
    assert bool((ref() == 3.0).all())
    ctl.fork("w", 0)
    ctl.join()
    torch.cuda.synchronize()
    del junk


def test_controller_refuses_tensors_on_another_device(library):
    ctl = PrefetchController("cuda", library=library)
    with pytest.raises(ValueError, match="cpu"):
        ctl.add("w", 0, [torch.empty(16)])


def test_decode_variants_bit_identical(attention_libs, library, tmp_path):
    rep = D.run_bench_decode(
        attention_libs, models=["llama-3.1-8b"], dtypes=["bf16", "fp16"], batches=[1, 64], contexts=[1024, 9000],
        layers=2, rounds=1, reps=2, weight_prefetch_cap={1: 32 * MiB}, prefetch_library=library,
        json_path=tmp_path / "d.json", plot_path=tmp_path / "d.png", text_path=tmp_path / "d.txt",
    )  # fmt: skip
    assert rep.points and not rep.skipped
    for p in rep.points:
        assert p["finite"], p
        assert p["all_identical"], {n: v["identical_to_stock"] for n, v in p["variants"].items()}
    kernels = {(p["batch"], p["context"]): p["kernel"] for p in rep.points}
    assert kernels[(1, 1024)] == "v2" and kernels[(64, 1024)] == "v1" and kernels[(64, 9000)] == "v2"
    caps = {p["batch"]: p["cap_bytes"] for p in rep.points}
    assert caps[1] == 32 * MiB and caps[64] == 0
    assert (tmp_path / "d.png").stat().st_size > 1000 and "llama-3.1-8b" in (tmp_path / "d.txt").read_text()


def test_gemm_micro_benchmark_runs(library):
    micro = D.run_micro_gemm(library, shapes=[("o_proj", 4096, 4096)], batches=[1], trials=5)
    (r,) = micro["results"]
    assert r["cold_us"] > 0 and r["prefetched_us"] > 0 and r["warm_us"] > 0 and r["prefetched_bytes"] == 32 * MiB


def test_every_prefetch_knob_keeps_the_step_bit_identical(attention_libs, library):
    from kvpatch.prefetch.decode import cuda_device, make_flush, measure_point
    from kvpatch.prefetch.models import model_shape
    from kvpatch.prefetch.options import WeightPrefetch

    dev = cuda_device("cuda")
    w = D.DecodeWeights(model_shape("llama-3.1-8b"), "bf16", 2, dev)
    step = D.DecodeStep(w, 1, 1024)
    base = WeightPrefetch(caps=16 * MiB)
    variants = [("stock", "stock", None), ("stock+wpf", "stock", base),
                ("knobs", "stock", base.with_(grid=132, threads=128, chunk=16384, hint="none", fork="qkv", join="oproj", priority="normal")),
                ("first", "stock", base.with_(hint="evict_first", grid=7))]  # fmt: skip
    p = measure_point(step, variants, attention_libs, library, dev, rounds=1, reps=2, round_seconds=0.05, flush=make_flush(dev, 0), cold=False)
    assert p["all_identical"] and p["graph_equals_eager"], {n: v["identical_to_stock"] for n, v in p["variants"].items()}
    assert p["variants"]["knobs"]["prefetch_grid"] == 132 and p["variants"]["first"]["prefetch_grid"] == 7
    assert p["variants"]["knobs"]["cap_bytes"] == 16 * MiB and p["variants"]["stock"]["cap_bytes"] == 0


def test_prefetch_micro_benchmark_runs(library):
    from kvpatch.prefetch.micro import micro_prefetch_table, run_micro_prefetch

    m = run_micro_prefetch(library, configs=[{"bytes": 8 * MiB, "grid": 32}, {"bytes": 8 * MiB, "grid": 132, "threads": 128, "chunk": 16384, "hint": "none"}], trials=3)
    assert len(m["results"]) == 2 and all(r["kernel_us"] > 0 and r["fill_GBps"] > 0 and r["cold_us"] > 0 for r in m["results"])
    assert "fill GB/s" in micro_prefetch_table(m)
