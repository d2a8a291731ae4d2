"""The decode bench's weight-prefetch options (kvpatch.decode.options, the caps' text forms in
kvpatch.decode.windows): the first form's text (``cap=...;fork=...``) and its knobs round trip,
bad values are refused, the default configuration's text, what counts as off, and the caps'
per-batch buckets. Pure Python."""

from __future__ import annotations

import pytest

from kvpatch.decode.options import MiB, WeightPrefetch, cap_for_batch, caps_text, parse_caps, parse_ints
from kvpatch.decode.windows import Window
from kvpatch.errors import UsageError


def test_the_first_form_round_trips_with_every_knob_and_refuses_bad_values():
    w = WeightPrefetch.parse(
        "cap=1:32,4:16,8:0;grid=132;threads=128;chunk=16384;hint=evict_normal;fork=qkv;join=oproj;priority=normal"
    )
    assert w.caps == {1: 32 * MiB, 4: 16 * MiB, 8: 0} and (w.grid, w.threads, w.chunk, w.hint) == (
        132,
        128,
        16384,
        "evict_normal",
    )
    assert (w.fork, w.join, w.priority) == ("qkv", "oproj", "normal") and [w.cap(b) for b in (1, 3, 8, 9)] == [
        32 * MiB,
        16 * MiB,
        0,
        0,
    ]
    assert WeightPrefetch.parse(w.label()) == w
    assert WeightPrefetch.parse("grid=auto", w).grid is None and WeightPrefetch.parse("grid=auto", w).threads == 128
    assert w.controller_options() == {
        "priority": "normal",
        "grid": 132,
        "threads": 128,
        "chunk": 16384,
        "hint": "evict_normal",
    }
    assert WeightPrefetch.parse("priority=-3").priority == -3
    for bad in ("cap=x", "grid=0", "grid=x", "threads=33", "chunk=8", "hint=last", "fork=mlp", "join=never", "size=3", "cap",
                "cap=1:x", "cap=0:8", "cap=-1", "priority=urgent", "oproj->down=8"):  # fmt: skip
        with pytest.raises(UsageError):
            WeightPrefetch.parse(bad)


def test_the_default_is_the_windows_form_and_prints_as_it():
    """``WeightPrefetch()`` is the three default windows (no longer the first form's caps): its
    text is what ``--wpf`` takes and what reports label it with."""
    d = WeightPrefetch()
    assert d.label() == "oproj->gateup=8:12;gateup->down=8:8;down->qkv=8:12"
    assert WeightPrefetch.parse(d.label()) == d and not d.off()
    assert WeightPrefetch.parse("hint=evict_normal").label() == d.label() + ";hint=evict_normal"  # only what differs
    assert d.to_dict()["label"] == d.label() and [x["text"] for x in d.to_dict()["windows"]] == d.label().split(";")


def test_what_counts_as_off():
    assert WeightPrefetch(windows=()).off() and WeightPrefetch(windows=(), caps={1: 0}).off()
    assert WeightPrefetch.parse("cap=off").off() and WeightPrefetch.parse("cap=0").effective_windows() == ()
    assert WeightPrefetch(windows=(Window("oproj->gateup", {1: 0, 8: 0}),)).off()
    # a zero cap of the first form leaves the default windows in place: not off
    assert not WeightPrefetch(caps=0).off() and not WeightPrefetch(caps={1: 0}).off()
    assert (
        WeightPrefetch(windows=(), caps={8: 4 * MiB}).cap(16) == 0
        and not WeightPrefetch(windows=(), caps={8: 4 * MiB}).off()
    )


def test_caps_text_forms_and_batch_buckets():
    assert parse_caps("1:32,4:32,8:16") == {1: 32 * MiB, 4: 32 * MiB, 8: 16 * MiB}
    assert parse_caps("24") == 24 * MiB and parse_caps("off") == parse_caps("0") == parse_caps("none") == 0
    assert parse_caps("0.5") == MiB // 2 and parse_caps("0.0001") == 96  # bytes, a multiple of 16
    with pytest.raises(UsageError, match="under 16 bytes"):  # 10 bytes: none, said rather than done
        parse_caps("0.00001")
    default = parse_caps("default")
    assert isinstance(default, dict) and max(default) == 8 and all(default.values())  # per batch up to 8, then off
    for text in ("1:32,4:32,8:16", "24", "off", "1:0.5,2:12"):
        assert parse_caps(caps_text(parse_caps(text))) == parse_caps(text)
    for bad in ("x:3", "0:3", "4:-1", "abc", "1:inf", "1:nan", ",", "1:", "1e3", "+3", "1_0", "\u0663", "1:2,1:3"):
        with pytest.raises(UsageError, match="invalid cap"):
            parse_caps(bad)
    caps = {1: 32, 4: 16, 8: 0}
    assert [cap_for_batch(caps, b) for b in (1, 2, 4, 5, 8, 16)] == [
        32,
        16,
        16,
        0,
        0,
        0,
    ]  # the smallest bucket >= batch
    assert cap_for_batch(7, 64) == 7


def test_integer_lists():
    assert parse_ints("1, 4,16") == [1, 4, 16]
    for bad in ("", "0", "1,x", "-4", "+5", "1_000", "\u0663"):  # int() alone reads the last three
        with pytest.raises(UsageError, match="invalid"):
            parse_ints(bad)
