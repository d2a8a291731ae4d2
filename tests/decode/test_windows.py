"""Window planning (kvpatch.decode.windows) and its configuration (kvpatch.decode.options):
which forks a step makes, where, pulling which tensors, with which cap and hint, per batch
bucket; the text forms; what the step registers on a controller (a fake)."""

from __future__ import annotations

import pytest

from kvpatch.decode.options import DEFAULT_WINDOWS, MiB, WeightPrefetch
from kvpatch.decode.windows import (
    KINDS,
    LAYER_OPS,
    STEP_WINDOWS,
    TailPrefetch,
    Window,
    cap_for,
    forks_by_op,
    parse_windows,
    plan_forks,
    prefetch_bytes,
    windows_text,
)  # fmt: skip
from kvpatch.errors import UsageError


def test_each_window_forks_before_its_op_and_warms_the_next_gemm():
    want = {
        "norm->qkv": ("norm1", ("qkv",), False, "qkv"),
        "attn->oproj": ("attn", ("o_proj",), False, "oproj"),
        "oproj->gateup": ("add1", ("gate_up",), False, "gateup"),
        "norm->gateup": ("norm2", ("gate_up",), False, "gateup"),
        "gateup->down": ("act", ("down",), False, "down"),
        "down->qkv": ("add2", ("qkv",), True, "qkv"),
    }
    assert STEP_WINDOWS == tuple(want)
    for name, (before, weights, nxt, target) in want.items():
        k = KINDS[name]
        assert (k.before, k.weights, k.next_layer, k.target) == (before, weights, nxt, target)
        # the fork comes after the previous GEMM and before the target: only small kernels between
        i, j = LAYER_OPS.index(k.before), LAYER_OPS.index(k.target)
        between = LAYER_OPS[i:] + LAYER_OPS[:j] if nxt else LAYER_OPS[i:j]
        assert not {"qkv", "oproj", "gateup", "down"} & set(between), (name, between)
    assert KINDS["attn"].weights == KINDS["layer"].weights == ("o_proj", "gate_up", "down")


def test_plan_forks_per_layer_in_step_order_without_a_next_layer_after_the_last():
    windows = [
        Window("down->qkv", 12 * MiB),
        Window("oproj->gateup", 12 * MiB, "evict_normal"),
        Window("gateup->down", 8 * MiB),
    ]
    forks = plan_forks(windows, layers=3, batch=1)
    assert [(f.layer, f.before, f.window, f.target_layer) for f in forks] == [
        (0, "add1", "oproj->gateup", 0),
        (0, "act", "gateup->down", 0),
        (0, "add2", "down->qkv", 1),
        (1, "add1", "oproj->gateup", 1),
        (1, "act", "gateup->down", 1),
        (1, "add2", "down->qkv", 2),
        (2, "add1", "oproj->gateup", 2),
        (2, "act", "gateup->down", 2),  # no down->qkv into a 4th layer
    ]
    assert [f.cap for f in forks][:3] == [12 * MiB, 8 * MiB, 12 * MiB]
    assert [f.hint for f in forks][:3] == ["evict_normal", None, None]
    by_op = forks_by_op(forks)
    assert [f.window for f in by_op[(1, "act")]] == ["gateup->down"] and (2, "add2") not in by_op


def test_caps_follow_the_batch_buckets_and_zero_makes_no_fork():
    w = Window("gateup->down", {1: 8 * MiB, 4: 4 * MiB, 8: 0})
    assert [w.cap(b) for b in (1, 2, 4, 5, 8, 9, 64)] == [8 * MiB, 4 * MiB, 4 * MiB, 0, 0, 0, 0]
    assert cap_for(16, 1000) == 16 and cap_for({2: 5}, 3) == 0
    assert len(plan_forks([w], layers=2, batch=4)) == 2 and plan_forks([w], layers=2, batch=8) == []
    forks = plan_forks([w, Window("norm->qkv", {8: 64 * MiB})], layers=1, batch=1)
    # the cap counts, or the weight where it is smaller
    assert prefetch_bytes(forks, {"down": 6 * MiB, "qkv": 48 * MiB}) == 6 * MiB + 48 * MiB


def test_windows_are_checked():
    with pytest.raises(UsageError, match="unknown prefetch window"):
        Window("oproj->down", 8)
    with pytest.raises(UsageError, match="hint"):
        Window("oproj->gateup", 8, "evict_sometimes")
    with pytest.raises(UsageError, match="cap"):
        Window("oproj->gateup", -1)
    with pytest.raises(UsageError, match="caps"):
        Window("oproj->gateup", {0: 8})
    with pytest.raises(UsageError, match="twice"):
        plan_forks([Window("attn", 8), Window("attn", 16)], 2, 1)


def test_window_text_round_trips():
    ws = (Window("oproj->gateup", {1: 12 * MiB, 8: 8 * MiB}, "evict_normal"), Window("gateup->down", 8 * MiB))
    text = windows_text(ws)
    assert text == "oproj->gateup=1:12,8:8@evict_normal;gateup->down=8"
    assert parse_windows(text) == ws
    with pytest.raises(UsageError, match="NAME=CAPS"):
        parse_windows("oproj->gateup")


def test_weight_prefetch_windows_and_the_first_form():
    d = WeightPrefetch()
    assert d.windows == DEFAULT_WINDOWS and [w.name for w in d.windows] == [
        "oproj->gateup",
        "gateup->down",
        "down->qkv",
    ]
    assert d.cap(1) == d.cap(8) == 32 * MiB and d.cap(9) == 0 and d.hints() == {"evict_last"}
    assert WeightPrefetch.parse(d.label()) == d
    w = WeightPrefetch.parse("norm->qkv=1:8,8:4@evict_first;gateup->down=8;grid=16;join=oproj")
    assert [x.name for x in w.windows] == ["norm->qkv", "gateup->down"] and w.grid == 16 and w.join == "oproj"
    assert WeightPrefetch.parse(w.label()) == w and w.hints() == {"evict_first", "evict_last"}
    first = WeightPrefetch.parse("cap=24;fork=qkv")
    assert first.windows == () and first.effective_windows() == (Window("layer", 24 * MiB),)
    assert WeightPrefetch.parse("fork=attn").effective_windows()[0].caps == {
        1: 32 * MiB,
        2: 32 * MiB,
        4: 32 * MiB,
        8: 16 * MiB,
    }
    assert WeightPrefetch.parse("cap=off").off() and WeightPrefetch.parse("cap=off").effective_windows() == ()
    assert WeightPrefetch(windows=(Window("attn->oproj", 0),)).off()
    with pytest.raises(UsageError, match="either windows"):
        WeightPrefetch.parse("cap=8;oproj->gateup=8")
    assert WeightPrefetch(caps=8 * MiB).effective_windows() == (Window("attn", 8 * MiB),)  # the first form, as before
    with pytest.raises(UsageError, match="either windows"):
        WeightPrefetch(windows=(Window("norm->qkv", 8),), caps=8)
    with pytest.raises(UsageError, match="twice"):
        WeightPrefetch(windows=(Window("attn", 8), Window("attn", 8)))


def test_tail_prefetch_is_checked_and_has_a_text():
    t = TailPrefetch({8: 32 * MiB}, "evict_normal")
    assert t.cap(1) == 32 * MiB and t.cap(16) == 0 and t.text() == "tail=8:32@evict_normal"
    with pytest.raises(UsageError):
        TailPrefetch(8, "evict_never")
    with pytest.raises(UsageError, match="chunk"):
        TailPrefetch(8, chunk=24)


# --------------------------------------------------------------------------- the step's registration


class FakeCtl:
    def __init__(self):
        self.added = []

    def add(self, point, layer, tensors, cap_bytes=None, batches=None, *, hint=None, **kw):
        self.added.append((point, layer, [t.name for t in tensors], cap_bytes, batches, hint))


class T:
    def __init__(self, name):
        self.name = name


def fake_step(layers):
    from kvpatch.decode.step import DecodeStep, DecodeWeights

    w = object.__new__(DecodeWeights)
    w.layers = layers
    w.per_layer = [{k: T(f"{k}{i}") for k in ("qkv", "o_proj", "gate_up", "down")} for i in range(layers)]
    s = object.__new__(DecodeStep)
    s.w = w
    return s


def test_add_prefetch_registers_the_target_layers_weights_with_caps_and_hints():
    step, ctl = fake_step(2), FakeCtl()
    step.add_prefetch(ctl, [Window("down->qkv", {1: 12 * MiB, 8: 4 * MiB}, "evict_last"), Window("oproj->gateup", 8 * MiB),
                            Window("attn", 0)])  # fmt: skip
    assert ctl.added == [
        (
            "down->qkv",
            0,
            ["qkv1"],
            None,
            {1: 12 * MiB, 8: 4 * MiB},
            "evict_last",
        ),  # the next layer's QKV; none after layer 1
        ("oproj->gateup", 0, ["gate_up0"], 8 * MiB, None, None),
        ("oproj->gateup", 1, ["gate_up1"], 8 * MiB, None, None),
        ("attn", 0, ["o_proj0", "gate_up0", "down0"], None, {1: 0}, None),  # cap 0: registered, no table
        ("attn", 1, ["o_proj1", "gate_up1", "down1"], None, {1: 0}, None),
    ]
    assert step.w.prefetch_tensors(1, "down->qkv") == [] and [
        t.name for t in step.w.prefetch_tensors(0, "norm->qkv")
    ] == ["qkv0"]


def test_the_step_forks_each_window_right_before_its_op(monkeypatch):
    from kvpatch.decode import step as S

    step = fake_step(2)
    step.batch = 4
    step.out = type("Out", (), {"copy_": lambda self, x: None})()
    step.x0 = "x0"
    order = []
    monkeypatch.setattr(S.DecodeStep, "run_op", lambda self, op, lib, layer, st: order.append(("op", layer, op)))

    class Ctl:
        def fork(self, window, layer, batch):
            order.append(("fork", layer, window, batch))

        def join(self):
            order.append(("join",))

    forks = plan_forks([Window("gateup->down", 8 * MiB), Window("down->qkv", 8 * MiB), Window("attn->oproj", 8)], 2, 4)
    step.step("lib", Ctl(), forks=forks, join="oproj")
    i = order.index(("fork", 0, "gateup->down", 4))
    assert order[i - 1] == ("op", 0, "gateup") and order[i + 1] == ("op", 0, "act")
    i = order.index(("fork", 0, "down->qkv", 4))
    assert order[i - 1] == ("op", 0, "down") and order[i + 1] == ("op", 0, "add2")
    assert ("fork", 1, "down->qkv", 4) not in order
    i = order.index(("fork", 1, "attn->oproj", 4))
    assert order[i - 1] == ("op", 1, "kv") and order[i + 1] == ("op", 1, "attn")
    assert order[order.index(("op", 0, "oproj")) - 1] == ("join",) and order[-1] == ("join",)
    assert [o for o in order if o[0] == "op"] == [("op", i, op) for i in range(2) for op in LAYER_OPS]
    plain = []
    monkeypatch.setattr(S.DecodeStep, "run_op", lambda self, op, lib, layer, st: plain.append(op))
    step.step("lib")  # no controller: the same ops, no fork
    assert plain == list(LAYER_OPS) * 2
