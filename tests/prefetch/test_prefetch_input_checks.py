"""The weight-prefetch API's input: counts are ints (never coerced: '16' is not buckets 1 and
6), tensors come as a list (a tensor is not iterated row by row), launch options are checked
before ctypes sees them, and a machine without a GPU is said in one line."""

from __future__ import annotations

import pytest
from prefetch_helpers import FakeAPI, FakeLibrary, FakeTensor

from kvpatch.errors import UsageError


def _controller():
    from kvpatch.prefetch.controller import PrefetchController

    api = FakeAPI()
    return PrefetchController("cuda:0", api=api, library=FakeLibrary(api)), api


def test_prefetch_controller_checks_grid_and_batch_where_given() -> None:
    ctl, _ = _controller()
    w = FakeTensor(1 << 20, 1 << 16)
    for bad in (-3, 0, "8", True, 2.0):
        with pytest.raises(UsageError, match="prefetch grid"):
            ctl.add("p", 0, [w], grid=bad)
    ctl.add("p", 0, [w], batches={4: None, 16: None}, grid=5)
    assert ctl.table("p", 0, 3).grid == 5
    for bad in (0, -5, 1.5, "2", True):
        with pytest.raises(ValueError, match="batch must be"):
            ctl.fork("p", 0, bad)


def test_prefetch_controller_add_takes_counts_as_ints_only() -> None:
    """add() coerced with int(): batches='16' became buckets 1 and 6, a cap of 0.9 turned a
    batch off, {2.7: cap} became bucket 2; a tensor for the list gave one row per element."""
    from kvpatch.prefetch.controller import PrefetchController

    ctl, api = _controller()
    w = FakeTensor(1 << 20, 1 << 16)
    bad = [({"batches": "16"}, "batches must be"), ({"batches": 8}, "batches must be"),
           ({"batches": {2.7: 1 << 20}}, "batch must be an int"), ({"batches": {"4": 1 << 20}}, "batch must be an int"),
           ({"batches": {True: 1 << 20}}, "batch must be an int"), ({"batches": {1: 0.9}}, "must be an int"),
           ({"batches": {1: "32"}}, "must be an int"), ({"batches": {1: float("nan")}}, "must be an int"),
           ({"cap_bytes": 0}, "cap_bytes must be positive"), ({"cap_bytes": 1.5e6}, "cap_bytes must be an int")]  # fmt: skip
    for i, (kw, message) in enumerate(bad):
        with pytest.raises(ValueError, match=message):
            ctl.add("p", i, [w], **kw)
    with pytest.raises(ValueError, match="not a tensor"):
        ctl.add("p", 100, w)
    with pytest.raises(ValueError, match="expected tensors, got str"):
        ctl.add("p", 101, [w, "w"])
    ctl.add("p", 0, [w])  # nothing above was registered
    for batch in (0, -3, 2.5, "1", True):
        with pytest.raises(ValueError, match="batch must be"):
            ctl.fork("p", 0, batch)  # a window without buckets checks batch= too
    assert ctl.fork("p", 0, 7)
    for kw in ({"enabled": "false"}, {"enabled": 0}, {"grid": 2**31}, {"library": object()}):
        with pytest.raises(UsageError):
            PrefetchController("cuda:0", api=api, **({"library": FakeLibrary(api)} | kw))


def test_weight_ranges_refuses_a_tensor_for_a_list_and_odd_caps() -> None:
    from kvpatch.prefetch import weight_ranges

    w = FakeTensor(1 << 20, 4096)
    with pytest.raises(ValueError, match="not a tensor"):
        weight_ranges(w)
    with pytest.raises(ValueError, match="expected tensors, got str"):
        weight_ranges([w, "weight"])
    for cap in ("4096", 4096.0, float("nan"), True):
        with pytest.raises(ValueError, match="cap_bytes must be an int"):
            weight_ranges([w], cap)
    assert weight_ranges([w], 1024) == [(1 << 20, 1024)]


def test_prefetch_launch_options_are_checked_before_ctypes() -> None:
    from kvpatch.prefetch.kernel import check_launch

    with pytest.raises(UsageError, match="threads must be an int"):
        check_launch(threads="64")


@pytest.mark.slow  # imports torch
def test_a_range_at_address_0_is_refused() -> None:
    pytest.importorskip("torch")
    from kvpatch.prefetch.ranges import range_table

    with pytest.raises(ValueError, match="address 0"):
        range_table([(0, 4096)])


@pytest.mark.slow  # imports torch
def test_prefetch_controller_without_a_gpu_says_so() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("checks the machine without a GPU")
    from kvpatch.prefetch import PrefetchController

    with pytest.raises(UsageError, match="no CUDA GPU visible.*enabled=False"):
        PrefetchController("cuda")
    assert PrefetchController("cuda", enabled=False).fork("p", 0) is False
