"""PrefetchController (kvpatch.prefetch.controller) without a GPU: the stream/event wiring of
fork and join, the launch knobs, per-batch tables and their buckets, device checks, the
tables' hold on their tensors, the disabled controller, priorities and the capability check.
A fake stream API logs every call; a fake library logs every launch."""

from __future__ import annotations

import gc
import weakref

import pytest
from prefetch_helpers import FakeAPI, FakeLibrary, FakeTensor, MiB, controller

from kvpatch.decode.options import WeightPrefetch
from kvpatch.errors import UsageError
from kvpatch.prefetch import PrefetchController


def test_fork_records_on_current_then_side_waits_then_launches_on_side():
    ctl, api = controller()
    w1, w2 = FakeTensor(0x10000000, 4 * MiB), FakeTensor(0x20000000, 2 * MiB)
    ctl.add("attn", 0, [w1, w2], cap_bytes=5 * MiB)
    assert api.tables == [[(0x10000000, 4 * MiB), (0x20000000, MiB)]]
    assert ctl.fork("attn", 0) is True
    assert api.log == [
        ("record", "event0", "main"),
        ("wait_event", "side", "event0"),
        ("device", "cuda:0"),
        ("launch", 0x7100, 2, 5, 0x2222),  # table, rows, grid (5 MiB -> 5 CTAs), the side stream
    ]
    assert ctl.pending
    api.log.clear()
    ctl.join()
    assert api.log == [("wait_stream", "main", "side")] and not ctl.pending
    ctl.join()  # nothing forked since: no call
    assert api.log == [("wait_stream", "main", "side")]


def test_the_default_grid_grows_with_the_window_between_4_and_32_ctas():
    ctl, api = controller()
    w = FakeTensor(0x10000000, 256 * MiB)
    for layer, cap in enumerate((4096, 5 * MiB, 5 * MiB + 16, 100 * MiB)):
        ctl.add("attn", layer, [w], cap_bytes=cap)
        ctl.fork("attn", layer)
    assert [e[3] for e in api.log if e[0] == "launch"] == [4, 5, 6, 32]  # one CTA per MiB begun


def test_launch_knobs_reach_every_launch_and_bad_ones_are_refused():
    ctl, api = controller(grid=132, threads=128, chunk=16384, hint="evict_normal")
    w = FakeTensor(0x10000000, 4 * MiB)
    ctl.add("attn", 0, [w], cap_bytes=MiB)
    ctl.add("attn", 1, [w], cap_bytes=MiB, grid=7)  # add(grid=) wins over the controller's
    ctl.fork("attn", 0)
    ctl.fork("attn", 1)
    launches = [e for e in api.log if e[0] == "launch"]
    opts = (("chunk", 16384), ("hint", "evict_normal"), ("threads", 128))
    assert [e[3] for e in launches] == [132, 7] and all(e[5:] == opts for e in launches)
    plain, api2 = controller()
    plain.add("attn", 0, [w], cap_bytes=MiB)
    plain.fork("attn", 0)
    assert [e for e in api2.log if e[0] == "launch"][0][5:] == ()  # no knobs: the library's defaults
    for bad in ({"grid": 0}, {"grid": 2.5}, {"threads": 40}, {"chunk": 10}, {"hint": "sticky"}):
        with pytest.raises(UsageError):
            controller(**bad)


def test_unknown_window_does_not_launch_and_tables_are_immutable():
    ctl, api = controller()
    assert ctl.fork("attn", 3) is False and api.log == []
    ctl.add("attn", 0, [FakeTensor(0x1000, 4096)])
    with pytest.raises(ValueError, match="already added"):
        ctl.add("attn", 0, [FakeTensor(0x1000, 4096)])
    ctl.join()
    assert api.log == []


def test_per_batch_caps_buckets_and_off():
    ctl, api = controller()
    w = FakeTensor(0x10000000, 64 * MiB)
    ctl.add("attn", 1, [w], batches={1: 32 * MiB, 2: 32 * MiB, 4: 8 * MiB, 8: 0})
    assert api.tables == [[(0x10000000, 32 * MiB)], [(0x10000000, 8 * MiB)]]  # one table per distinct cap
    assert ctl.table("attn", 1, 1) is ctl.table("attn", 1, 2)
    assert ctl.table("attn", 1, 3).bytes == 8 * MiB  # bucket: the smallest key >= 3
    for batch, launched in ((1, True), (3, True), (4, True), (5, False), (8, False), (16, False)):
        api.log.clear()
        assert ctl.fork("attn", 1, batch) is launched, batch
        assert any(e[0] == "launch" for e in api.log) is launched
    with pytest.raises(ValueError, match="pass batch="):
        ctl.fork("attn", 1)
    # an iterable of batches: the one cap for those, nothing above
    ctl.add("mlp", 1, [w], cap_bytes=MiB, batches=range(1, 5))
    assert ctl.table("mlp", 1, 4).bytes == MiB and ctl.table("mlp", 1, 5) is None
    # an "off" bucket between two others stays off (batch 3 does not fall through to 8)
    ctl.add("gap", 1, [w], batches={1: MiB, 4: 0, 8: 2 * MiB})
    assert [ctl.fork("gap", 1, b) for b in (1, 2, 3, 4, 5, 8, 9)] == [True, False, False, False, True, True, False]
    # cap 0 without batches: never launches
    ctl.add("off", 1, [w], batches={1: 0})
    assert ctl.fork("off", 1, 1) is False


def test_add_refuses_tensors_on_another_device():
    ctl, _ = controller()
    with pytest.raises(ValueError, match="cuda:1.*prefetches on cuda:0"):
        ctl.add("attn", 0, [FakeTensor(0x1000, 4096), FakeTensor(0x2000, 4096, "cuda:1")])
    with pytest.raises(ValueError, match="cpu"):
        ctl.add("attn", 0, [FakeTensor(0x1000, 4096, "cpu")])
    with pytest.raises(ValueError, match="positive"):
        ctl.add("attn", 0, [FakeTensor(0x1000, 4096)], cap_bytes=-1)


def test_tables_keep_their_tensors_alive():
    ctl, _ = controller()
    w = FakeTensor(0x1000, 4096)
    alive = weakref.ref(w)
    ctl.add("attn", 0, [w])
    del w
    gc.collect()
    assert alive() is not None and ctl.table("attn", 0).tensors[0] is alive()


def test_disabled_is_a_no_op_everywhere():
    api = FakeAPI()
    ctl = PrefetchController("cuda:0", enabled=False, library=FakeLibrary(api), api=api)
    ctl.add("attn", 0, [FakeTensor(0x1000, 4096, "cuda:7")])
    assert ctl.fork("attn", 0) is False and ctl.fork("attn", 0, 1) is False
    ctl.join()
    assert ctl.table("attn", 0) is None
    assert api.log == [] and api.tables == [] and ctl.stream is None


def test_priority_capability_and_one_event_per_window():
    api = FakeAPI()
    PrefetchController("cuda", library=FakeLibrary(api), api=api, priority="high")
    PrefetchController("cuda", library=FakeLibrary(api), api=api, priority="normal")
    PrefetchController("cuda", library=FakeLibrary(api), api=api, priority=-2)
    assert [e[2] for e in api.log if e[0] == "new_stream"] == [-(1 << 16), 0, -2]
    with pytest.raises(UsageError, match="priority"):
        PrefetchController("cuda", library=FakeLibrary(api), api=api, priority="urgent")


def test_a_priority_is_an_int_a_c_int_holds():
    """Before: any Python int passed (2**80 reached torch's stream, which takes a C int) and a numpy
    integer was refused where grids and counts take one. After: -2**31 .. 2**31-1, numpy integers
    too, one rule for the controller and the decode step's configuration."""
    np = pytest.importorskip("numpy")
    api = FakeAPI()
    PrefetchController("cuda", library=FakeLibrary(api), api=api, priority=np.int64(-3))
    PrefetchController("cuda", library=FakeLibrary(api), api=api, priority=-(2**31))
    assert [e[2] for e in api.log if e[0] == "new_stream"] == [-3, -(2**31)]
    for bad in (2**31, -(2**31) - 1, 2**80, True, 1.0, "1", None):
        with pytest.raises(UsageError, match=r"^priority must be 'high', 'normal' or an int from -2\*\*31"):
            PrefetchController("cuda", library=FakeLibrary(api), api=api, priority=bad)
        with pytest.raises(UsageError, match=r"^priority must be"):
            WeightPrefetch(priority=bad)
    assert len([e for e in api.log if e[0] == "new_stream"]) == 2
    with pytest.raises(UsageError, match="8.0 or newer.*7.5"):
        PrefetchController("cuda", library=FakeLibrary(api), api=FakeAPI((7, 5)))
    ctl, api = controller(capability=(8, 0))
    ctl.add("a", 0, [FakeTensor(0x1000, 4096)])
    ctl.add("a", 1, [FakeTensor(0x1000, 4096)])
    ctl.fork("a", 0), ctl.fork("a", 1), ctl.fork("a", 0)
    assert [e[1] for e in api.log if e[0] == "record"] == ["event0", "event1", "event0"]
    assert ctl.launches == 3
