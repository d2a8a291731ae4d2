"""PrefetchController and the prefetch library on a CUDA GPU (marker ``gpu``; skipped without
one): an eager fork waits for the current stream and join rejoins it, launch errors are raised,
fork and join inside a captured CUDA graph, the tables' hold on their tensors, the device check.

The prefetch library comes from ``$KVPATCH_PREFETCH_LIB`` or is built here (needs nvcc).
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
from kvpatch.prefetch.kernel import PrefetchLibrary, archs_for_capability, build_prefetch_library  # noqa: E402

MiB = 1 << 20


@pytest.fixture(scope="module")
def library():
    path = os.environ.get("KVPATCH_PREFETCH_LIB") or build_prefetch_library(
        archs_for_capability(*torch.cuda.get_device_capability())
    )
    return PrefetchLibrary(path)


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
