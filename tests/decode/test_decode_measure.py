"""How a decode point is timed (kvpatch.decode.measure) on the CPU: the interleaved rounds on
kvpatch.gpu's one timer (host events stand in for CUDA events), and the controllers a point's
graphs launch from staying alive while those graphs replay."""

from __future__ import annotations

import gc
import time
import weakref
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from decode_helpers import TINY, Flush, cpu_bench, one_thread  # noqa: E402

from kvpatch.decode import measure as MEASURE  # noqa: E402
from kvpatch.decode.arms import Arm, default_arms  # noqa: E402
from kvpatch.decode.options import WeightPrefetch  # noqa: E402
from kvpatch.decode.step import DecodeStep, DecodeWeights  # noqa: E402
from kvpatch.gpu.timing import Timer  # noqa: E402
from kvpatch.prefetch.controller import PrefetchController  # noqa: E402


def test_rounds_follow_every_launcher_with_every_launcher_and_keep_each_ones_times():
    """Each round: one warm-up launch each, then every launcher right after every launcher (itself
    included) exactly once per cycle; the next round starts the order one slot later; a launcher's
    flush precedes each of its launches; each median is its own launcher's."""
    order: list[str] = []
    launchers = {
        name: (lambda name=name, s=s: (order.append(name), time.sleep(s))) for name, s in zip("abc", (0, 0.005, 0.02))
    }
    flushed: list[str] = []
    medians, raw = MEASURE.time_rounds(launchers, rounds=2, cycles=1, timer=Timer("cpu"),
                                       flush={"c": lambda: flushed.append(order[-1] if order else None)})  # fmt: skip
    assert len(order) == 2 * (3 + 9)
    for r in range(2):
        warm, timed = order[12 * r : 12 * r + 3], order[12 * r + 3 : 12 * r + 12]
        assert warm == raw[r]["order"]
        pairs = Counter(zip([warm[-1], *timed[:-1]], timed))
        assert pairs == Counter({(x, y): 1 for x in "abc" for y in "abc"}), pairs
    assert raw[0]["order"] == ["a", "b", "c"] and raw[1]["order"] == ["b", "c", "a"]
    assert order[3:12] != order[15:24]  # the second round's order starts elsewhere
    assert len(flushed) == 2 * (1 + 3)  # before c's warm-up launch and each timed one, every round
    for r in raw:
        assert r["cycles"] == 1 and {k: len(v) for k, v in r["samples_us"].items()} == {"a": 3, "b": 3, "c": 3}
        assert r["t0"] <= r["t1"]
    # medians (us) of 0, 5 and 20 ms sleeps, with margins a loaded machine's stalls stay inside
    assert all(len(m) == 2 for m in medians.values())
    assert max(medians["a"]) < 5_000 <= min(medians["b"]) and max(medians["b"]) < 20_000 <= min(medians["c"])


def test_every_controller_stays_alive_while_its_graph_replays(monkeypatch) -> None:
    """A CUDA graph holds no Python reference to the controller whose forks it captured (nor to
    the range tables they read). Each arm's controller must outlive the capture: dropped, its
    graph replays prefetches from freed device tables (what the weight-prefetch sweep's first
    stage once did, for every arm but the last)."""
    with one_thread():
        libs, pf, _ = cpu_bench(monkeypatch)

        class Graph:  # what capture returns: no reference to what the captured work used
            def __init__(self, fn):
                fn()
                ctl = next((d for d in fn.__defaults__ or () if isinstance(d, PrefetchController)), None)
                self.ctl = weakref.ref(ctl) if ctl is not None else None

            def replay(self):
                if self.ctl is not None:
                    replays.append(self.ctl() is not None)

        replays: list[bool] = []

        def time_rounds(launchers, *, rounds, cycles, timer, flush):
            gc.collect()
            for replay in launchers.values():
                replay()
            names = list(launchers)
            raw = [{"order": names, "cycles": cycles, "samples_us": {n: [1.0] * len(names) * cycles for n in names},
                    "t0": 0.0, "t1": 0.0}]  # fmt: skip
            return {n: [1.0] for n in launchers}, raw

        monkeypatch.setattr(MEASURE, "capture", lambda fn, device: Graph(fn))
        monkeypatch.setattr(MEASURE, "time_rounds", time_rounds)
        wpf = WeightPrefetch()
        arms = default_arms(["stock"], wpf) + [
            Arm("grid7+wpf", "stock", wpf.with_(grid=7)),
            Arm("none+wpf", "stock", wpf.with_(hint="none")),
        ]
        step = DecodeStep(DecodeWeights(TINY, "bf16", 2, "cpu"), 1, 16)
        point = MEASURE.measure_point(step, arms, {"stock": libs["stock"]}, pf, "cpu", rounds=1, cycles=1,
                                      round_seconds=0.1, flush=Flush("cpu", 0), cold=False, timer=Timer("cpu"),
                                      guard="off")  # fmt: skip
    assert [a.name for a in arms if a.wpf is not None] == ["stock+zero", "stock+wpf", "grid7+wpf", "none+wpf"]
    assert len(replays) == 2 * 4 and all(replays), replays  # the identity check, then the rounds after a gc
    assert point["variants"]["grid7+wpf"]["grids"] == [7]
