"""The method a win must survive, without a GPU: the arms (A/A twin, zero-byte arm, in-kernel
form and its zero-byte load), what each prefetches and with which hint, the predecessor
arithmetic of the carry-over check, the report's summary, and the sweep's picks."""

from __future__ import annotations

import pytest

from kvpatch.decode.arms import Arm, by_predecessor, carryover_check, check_arms, default_arms, sequence_of, zero_twin
from kvpatch.decode.kernels import best_configs, op_path
from kvpatch.decode.options import MiB, WeightPrefetch
from kvpatch.decode.picks import SMALL, control_arms, pick_launch, pick_windows, step_arms, step_windows
from kvpatch.decode.report import DecodeReport
from kvpatch.decode.windows import TailPrefetch, Window
from kvpatch.errors import UsageError
from kvpatch.gpu.stats import ratio_stats
from kvpatch.gpu.timing import carryover_order

LAST = WeightPrefetch(
    windows=(Window("oproj->gateup", {4: 12 * MiB}), Window("gateup->down", {8: 8 * MiB}, "evict_normal"))
)
TAIL = TailPrefetch({8: 32 * MiB}, "evict_normal")


def test_default_arms_hold_every_control_in_order():
    arms = default_arms(["stock", "patched", "tail", "tail0"], LAST, tail=TAIL)
    assert [a.name for a in arms] == [
        "stock",
        "stock-aa",
        "patched",
        "stock+zero",
        "stock+wpf",
        "tail",
        "tail+zero",
        "patched+wpf",
    ]
    by = {a.name: a for a in arms}
    assert by["stock-aa"].library == "stock" and by["stock-aa"].wpf is None  # its own capture of stock's step
    assert by["stock+zero"].zero and by["stock+zero"].wpf == by["stock+wpf"].wpf  # the same forks, no bytes
    assert by["tail"].tail == TAIL and by["tail+zero"].library == "tail0" and by["tail+zero"].tail is None
    assert by["tail"].baseline == "tail+zero"  # the in-kernel bytes alone: over the same build's empty table
    assert by["patched+wpf"].baseline == "patched"
    assert zero_twin(by["stock+wpf"], arms) == "stock+zero" and zero_twin(by["patched+wpf"], arms) is None
    assert [a.name for a in default_arms(["stock"], LAST, aa=False, zero=False)] == ["stock", "stock+wpf"]
    assert [a.name for a in default_arms(["stock", "patched"], WeightPrefetch.parse("cap=off"))] == [
        "stock",
        "stock-aa",
        "patched",
    ]
    with pytest.raises(UsageError, match="stock"):
        default_arms(["patched"], LAST)


def test_what_an_arm_prefetches_and_with_which_hint_per_batch():
    wpf, zero, tail = Arm("w", "stock", LAST), Arm("z", "stock", LAST, zero=True), Arm("t", "tail", tail=TAIL)
    assert wpf.prefetches(1) and wpf.hints(1) == {"evict_last", "evict_normal"}  # None -> the library's evict_last
    assert wpf.hints(8) == {"evict_normal"} and not wpf.prefetches(16) and wpf.hints(16) == set()
    assert not zero.prefetches(1) and zero.hints(1) == set()  # the zero-byte arm keeps no line
    assert tail.hints(4) == {"evict_normal"} and not Arm("s", "stock").prefetches(1)
    with pytest.raises(ValueError, match="zero-byte"):
        Arm("z", "stock", zero=True)
    with pytest.raises(ValueError, match="not both"):
        Arm("x", "tail", LAST, tail=TAIL)


def test_check_arms():
    with pytest.raises(UsageError, match="first arm"):
        check_arms([Arm("stock-aa", "stock")])
    with pytest.raises(UsageError, match="twice"):
        check_arms([Arm("stock", "stock"), Arm("a", "stock"), Arm("a", "patched")])
    with pytest.raises(UsageError, match="not measured"):
        check_arms([Arm("stock", "stock"), Arm("p+wpf", "patched", LAST, baseline="patched")])


def test_predecessors_follow_the_timers_order():
    order = ["a", "b", "c"]
    seq = sequence_of(3, 2)
    assert seq == carryover_order(3) * 2 == [0, 0, 1, 0, 2, 1, 1, 2, 2] * 2
    samples = [[], [], []]
    for pos, i in enumerate(seq):  # a sample's value says where it ran
        samples[i].append(float(pos))
    preds = by_predecessor(order, 2, samples)
    assert preds["a"] == {"c": [0.0, 9.0], "a": [1.0, 10.0], "b": [3.0, 12.0]}  # the first after the warm-up's last, c
    assert preds["b"] == {"a": [2.0, 11.0], "c": [5.0, 14.0], "b": [6.0, 15.0]}
    assert sum(len(v) for p in preds.values() for v in p.values()) == 18


def test_carryover_check_compares_after_hinted_arms_with_after_the_rest():
    order = ["stock", "wpf", "aa"]
    seq = sequence_of(3, 1)
    samples = {n: [] for n in order}
    for pos, i in enumerate(seq):
        prev = order[seq[pos - 1] if pos else 2]
        samples[order[i]].append(9.0 if prev == "wpf" and order[i] != "wpf" else 10.0)  # faster right after wpf
    check = carryover_check([{"order": order, "cycles": 1, "samples_us": samples}], {"wpf"}, order)
    assert check["stock"]["ratio"] == pytest.approx(0.9) and check["aa"]["ratio"] == pytest.approx(0.9)
    assert "wpf" not in check or check["wpf"]["n_hinted"] == 0 or check["wpf"]["ratio"] == 1.0
    assert ratio_stats([10, 12], [5, 6]) == {"median": 2.0, "min": 2.0, "max": 2.0, "rounds": [2.0, 2.0]}


def _point(batch, ratios, aa=1.0):
    v = {"stock": {"step_us": {"median": 100.0}, "speedup": {"median": 1, "min": 1, "max": 1}}}
    for n, (med, lo, hi) in ratios.items():
        v[n] = {"step_us": {"median": 100 / med}, "speedup": {"median": med, "min": lo, "max": hi}}
    v["stock-aa"] = {"step_us": {"median": 100 / aa}, "speedup": {"median": aa, "min": aa - 0.001, "max": aa + 0.001}}
    return {"model": "m", "batch": batch, "context": 1024, "variants": v, "all_identical": True,
            "aa": {"median": aa, "min": aa, "max": aa, "within": abs(aa - 1) <= 0.003}}  # fmt: skip


def test_report_summary_reads_the_goal_numbers():
    pts = [
        _point(1, {"stock+wpf": (1.03, 1.01, 1.05)}, aa=1.001),
        _point(4, {"stock+wpf": (1.01, 0.995, 1.02)}, aa=0.995),
    ]
    s = DecodeReport(variants=["stock", "stock-aa", "stock+wpf"], layers=8, rounds=7, mode="warm", caps_bytes=0, env={},
                     points=pts).summary()  # fmt: skip
    assert s["stock+wpf"]["geomean"] == pytest.approx((1.03 * 1.01) ** 0.5)
    assert s["stock+wpf"]["worst_round_min"] == 0.995 and s["stock+wpf"]["faster"] == 1 and s["stock+wpf"]["noise"] == 1
    assert s["aa"] == {"worst": pytest.approx(0.005), "within": 1, "of": 2}


def test_sweep_picks_a_window_per_batch_only_where_it_beat_stock():
    best = {("oproj->gateup", 1): {"cap_bytes": 12 * MiB, "hint": "evict_normal", "net_us": 2.0},
            ("oproj->gateup", 4): {"cap_bytes": 8 * MiB, "hint": "evict_normal", "net_us": 1.0},
            ("oproj->gateup", 8): {"cap_bytes": 16 * MiB, "hint": "evict_last", "net_us": 0.5},
            ("down->qkv", 1): {"cap_bytes": 4 * MiB, "hint": "evict_last", "net_us": -1.0}}  # fmt: skip
    windows = step_windows(best)
    assert windows["oproj->gateup"] == Window("oproj->gateup", {1: 12 * MiB, 4: 8 * MiB, 8: 16 * MiB}, "evict_normal")
    assert windows["down->qkv"] == Window("down->qkv", {1: 4 * MiB}, "evict_last")
    arms = step_arms(windows, ["oproj->gateup", "down->qkv"])
    assert [a.name for a in arms] == [
        "stock",
        "stock-aa",
        "w:oproj->gateup",
        "w:down->qkv",
        "all+zero",
        "all",
        "all:small",
    ]
    small = arms[-1].wpf
    assert (small.grid, small.chunk) == (SMALL["grid"], SMALL["chunk"]) and small.windows == arms[-2].wpf.windows
    one = step_arms(windows, ["down->qkv"])
    assert [a.name for a in one][-1] == "all:small" and "all" not in [a.name for a in one]
    points = [_point(1, {"w:oproj->gateup": (1.01, 1.0, 1.02), "w:down->qkv": (0.99, 0.98, 1.0)}),
              _point(4, {"w:oproj->gateup": (1.001, 0.99, 1.01), "w:down->qkv": (1.0, 0.99, 1.01)}),
              _point(8, {"w:oproj->gateup": (1.02, 1.01, 1.03)})]  # fmt: skip
    pick, why = pick_windows(points, windows)
    assert pick == WeightPrefetch(windows=(Window("oproj->gateup", {1: 12 * MiB, 4: 0, 8: 16 * MiB}, "evict_normal"),))
    assert why["windows"]["oproj->gateup"]["4"]["kept"] is False  # 1.001: within MIN_GAIN
    assert pick_windows([_point(1, {"w:down->qkv": (0.99, 0.98, 1.0)})], {"down->qkv": windows["down->qkv"]})[0] is None
    assert best_configs([{"window": "w", "batch": 1, "cap_bytes": 8, "hint": "h", "net_us": -0.1}]) == {}


def test_the_small_launch_knobs_are_taken_only_where_they_beat_the_default_ones():
    w = {"windows": [{"text": "oproj->gateup=12"}]}

    def pts(small, default, name="all"):
        out = []
        for b in (1, 4):
            p = _point(b, {"all:small": (small, small, small), name: (default, default, default)})
            p["variants"]["all:small"]["weight_prefetch"] = w
            p["variants"][name]["weight_prefetch"] = w
            out.append(p)
        return out

    assert pick_launch(pts(1.02, 1.01)) == SMALL
    assert pick_launch(pts(1.011, 1.01)) == {}  # within MIN_GAIN
    assert pick_launch(pts(1.02, 1.01, name="w:oproj->gateup")) == SMALL  # one window: its own arm is the twin
    assert pick_launch([_point(1, {"all": (1.0, 1.0, 1.0)})]) == {}


def test_control_arms_pair_the_in_kernel_form_with_its_side_stream_twin():
    arms = control_arms(["stock", "patched", "tail", "tail0"], LAST, tail=TAIL)
    names = [a.name for a in arms]
    assert names == [
        "stock",
        "stock-aa",
        "stock+zero",
        "stock+wpf",
        "stock+attn",
        "tail",
        "tail+zero",
        "patched",
        "patched+wpf",
    ]
    assert arms[names.index("tail")].baseline == "tail+zero"
    assert control_arms(["stock", "tail"], LAST, tail=TAIL)[-1].baseline == "stock"
    twin = arms[names.index("stock+attn")].wpf
    assert twin.windows == (Window("attn->oproj", TAIL.caps, TAIL.hint),)
    assert [a.name for a in control_arms(["stock"], LAST, tail=None)] == [
        "stock",
        "stock-aa",
        "stock+zero",
        "stock+wpf",
    ]


def test_the_kernel_stage_times_the_ops_between_fork_and_gemm():
    pre, between, target = op_path("oproj->gateup")
    assert [op for _, op in pre][-1] == "oproj" and between == [(0, "add1"), (0, "norm2")] and target == (0, "gateup")
    assert op_path("down->qkv")[1:] == ([(0, "add2"), (1, "norm1")], (1, "qkv"))
    assert op_path("norm->qkv") == ([], [(0, "norm1")], (0, "qkv"))
    assert op_path("attn->oproj")[1:] == ([(0, "attn")], (0, "oproj"))
