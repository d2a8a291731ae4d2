"""kvpatch.gpu.timing and .flush: interleaved rounds in which every launcher follows every
launcher, chunks queued within a GPU-side lead, more launches for short kernels, and an L2
flush that leaves no dirty line behind."""

from __future__ import annotations

import time
import types

import pytest
from gpu_helpers import needs_torch

from kvpatch.gpu import timing as Tm
from kvpatch.gpu.flush import L2Flush


def test_adaptive_reps():
    assert Tm.adaptive_reps(50, 100.0) == 50
    assert Tm.adaptive_reps(50, 30.0) == 50
    assert Tm.adaptive_reps(50, 12.0) == 150
    assert Tm.adaptive_reps(50, 1.0) == 200  # capped at 4x
    assert Tm.adaptive_reps(50, float("nan")) == 50


@needs_torch
def test_l2_flush_reads_and_writes_twice_the_l2():
    f = L2Flush("cpu", l2_bytes=1 << 12)
    assert f.nbytes >= 2 * (1 << 12) and f.buf.numel() * 4 == f.nbytes
    f()
    f()
    assert bool((f.buf == 2.0).all())  # every element read and written each time
    assert float(f.sink) == 2.0 * f.buf.numel()  # and read again
    assert "add_" in f.method and "zero_" not in f.method
    with pytest.raises(ValueError, match="2x the L2"):
        L2Flush("cpu", l2_bytes=1 << 12, nbytes=1 << 12)


@pytest.mark.parametrize("n", range(1, 10))
def test_carryover_order_puts_every_launcher_after_every_launcher_once(n):
    order = Tm.carryover_order(n)
    assert len(order) == n * n and all(order.count(i) == n for i in range(n))
    pairs = {(order[k - 1], order[k]) for k in range(len(order))}  # cyclic: the last precedes the first
    assert pairs == {(a, b) for a in range(n) for b in range(n)}


def test_carryover_order_needs_a_launcher():
    with pytest.raises(ValueError):
        Tm.carryover_order(0)


@needs_torch
def test_time_interleaved_balances_predecessors_and_counts():
    order = []
    fns = [lambda i=i: (order.append(i), time.sleep(0.02 * i * i)) for i in range(3)]  # 0, 20, 80 ms
    flushes = []
    us = Tm.time_interleaved(fns, reps=3, warmup=1, timer=Tm.Timer("cpu"), flush=lambda: flushes.append(1))
    assert [len(u) for u in us] == [3, 3, 3]
    assert order[:3] == [0, 1, 2]  # warm-up
    assert order[3:] == Tm.carryover_order(3) == [0, 0, 1, 0, 2, 1, 1, 2, 2]
    assert len(flushes) == 12
    # each time (us) is its own launcher's: sleep never ends early, and the margins (20 ms,
    # 60 ms) outlast a loaded CI machine's stalls (the 2/4 ms of an earlier version did not)
    assert max(us[0]) < 20_000 <= min(us[1]) and max(us[1]) < 80_000 <= min(us[2])
    us = Tm.time_interleaved(fns, reps=4, warmup=0, timer=Tm.Timer("cpu"))
    assert [len(u) for u in us] == [6, 6, 6]  # reps rounded up to whole cycles


def test_time_interleaved_flushes_only_where_asked():
    """A flush per launcher: the cold variant's flush runs before each of its launches and
    never before the warm one's (bench's A/A and decode's arms mix them in one round)."""
    log = []
    fns = [lambda: log.append("warm"), lambda: log.append("cold")]
    timer = _LeadTimer()
    Tm.time_interleaved(fns, reps=2, warmup=0, timer=timer, flush=[None, lambda: log.append("flush")])
    launches = [x for x in log if x != "flush"]
    assert launches.count("cold") == 2 and all(log[i - 1] == "flush" for i, x in enumerate(log) if x == "cold")
    assert "flush" not in [log[i - 1] for i, x in enumerate(log) if x == "warm" and i > 0]
    with pytest.raises(ValueError, match="1 flushes for 2 launchers"):
        Tm.time_interleaved(fns, reps=1, warmup=0, timer=timer, flush=[None])


class _LeadTimer:
    """A host-clock timer whose GPU-side leads are recorded; the lead's end event says
    'already passed' for the leads listed in ``late`` (by index)."""

    def __init__(self, late=()):
        self.leads, self.late, self.log = [], set(late), []
        self.chunks = self.retried = self.host_bound = 0

    def events(self, n):
        return [Tm.HostEvent() for _ in range(n)]

    def sync(self):
        pass

    def lead(self, seconds):
        self.leads.append(seconds)
        self.log.append("lead")
        passed = len(self.leads) - 1 in self.late
        return types.SimpleNamespace(query=lambda: passed)


def test_time_interleaved_queues_each_chunk_within_its_lead_and_retimes_a_late_one(monkeypatch):
    """Each chunk starts with a lead that covers 1.3x the host's time to queue it; chunks are
    whole cycles where a cycle fits in MAX_CHUNK; a chunk whose lead had ended is timed again
    with twice the lead, its first samples dropped; one late every time is counted."""
    monkeypatch.setattr(Tm, "CHUNK_LEAD_S", 10.0)
    monkeypatch.setattr(Tm, "MAX_CHUNK", 10)  # one 9-launch cycle per chunk
    fns = [lambda i=i: timer.log.append(i) for i in range(3)]
    timer = _LeadTimer(late={1})
    us = Tm.time_interleaved(fns, reps=6, warmup=1, timer=timer)
    cycle = Tm.carryover_order(3)
    assert [len(u) for u in us] == [6, 6, 6]
    # warm-up, then chunk 1, chunk 2 (late: timed again), chunk 2 again
    assert timer.log == [0, 1, 2] + ["lead", *cycle] * 3
    assert timer.chunks == 3 and timer.retried == 1 and timer.host_bound == 0
    first, late, again = timer.leads
    assert first == pytest.approx(late) and again == pytest.approx(2 * late) and first >= 1.3 * 9 * Tm.EVENT_COST_S
    timer = _LeadTimer(late=set(range(100)))
    Tm.time_interleaved(fns, reps=3, warmup=0, timer=timer)
    assert timer.chunks == Tm.LEAD_ATTEMPTS and timer.host_bound == 1
    # a cycle longer than MAX_CHUNK: chunks of MAX_CHUNK launches, the sequence unchanged
    monkeypatch.setattr(Tm, "MAX_CHUNK", 4)
    timer = _LeadTimer()
    us = Tm.time_interleaved(fns, reps=6, warmup=0, timer=timer)
    seq = cycle * 2
    assert timer.log == [x for k in range(0, 18, 4) for x in ["lead", *seq[k : k + 4]]]
    assert [len(u) for u in us] == [6, 6, 6] and timer.chunks == 5
    # the chunk is what the host queues in about CHUNK_LEAD_S: a tiny one, one launch each
    monkeypatch.setattr(Tm, "CHUNK_LEAD_S", 0.0)
    timer = _LeadTimer()
    Tm.time_interleaved(fns, reps=3, warmup=0, timer=timer)
    assert timer.log == [x for i in cycle for x in ["lead", i]]


@needs_torch
def test_cpu_timer_has_no_lead_and_the_l2_size_defaults_off_the_gpu():
    timer = Tm.Timer("cpu")
    assert timer.lead(1.0) is None and not timer.cuda
    assert Tm.l2_bytes_of("cpu") == 50 * 2**20
    bw = Tm.measure_copy_bandwidth("cpu", 1 << 16, reps=3, timer=timer)
    assert bw["bytes_moved"] == 2 << 16 and len(bw["samples_us"]) == 3
    assert bw["bytes_per_s"] == pytest.approx(bw["bytes_moved"] / (bw["median_us"] * 1e-6))
