"""The base settings: their defaults, the values each accepts and refuses (one-line errors,
exit 2), and their upper bounds."""

from __future__ import annotations

import pytest

from kvpatch.config import PatchConfig, make_config
from kvpatch.errors import UsageError


def test_defaults() -> None:
    cfg = make_config()
    assert cfg == PatchConfig()
    assert (cfg.preset, cfg.lookahead, cfg.size, cfg.align) == ("default", 1, None, 16)
    assert (cfg.caches, cfg.cache_hint, cfg.placement, cfg.scope, cfg.control) == ("kv", "none", "start", "cta", False)
    assert (cfg.k, cfg.v) == (True, True)


def test_none_means_not_given() -> None:
    assert make_config(lookahead=None, size=None, align=None, caches=None, preset=None) == PatchConfig()


@pytest.mark.parametrize(
    "options, field, value",
    [
        ({"size": "auto"}, "size", None),
        ({"size": 16}, "size", 16),
        ({"size": "4096"}, "size", 4096),  # as the CLI passes it
        ({"size": 8192}, "size", 8192),
        ({"align": 16}, "align", 16),
        ({"align": "128"}, "align", 128),
        ({"align": 4096}, "align", 4096),
        ({"lookahead": 1}, "lookahead", 1),
        ({"lookahead": "3"}, "lookahead", 3),
        ({"caches": "k"}, "caches", "k"),
        ({"caches": "v"}, "caches", "v"),
        ({"cache_hint": "evict_last"}, "cache_hint", "evict_last"),
        ({"cache_hint": "evict_first"}, "cache_hint", "evict_first"),
        ({"cache_hint": "evict_normal"}, "cache_hint", "evict_normal"),
        ({"placement": "end"}, "placement", "end"),
        ({"scope": "kv-head"}, "scope", "kv-head"),
        ({"control": True}, "control", True),
        ({"control": False}, "control", False),
        # spaces around a value are dropped, a word's as a number's (a quoted shell variable)
        ({"lookahead": " 3 "}, "lookahead", 3),
        ({"group_v_loads": "ahead "}, "group_v_loads", "ahead"),
        ({"placement": " end"}, "placement", "end"),
        ({"size": " auto "}, "size", None),
    ],
)
def test_accepted(options: dict, field: str, value) -> None:
    assert getattr(make_config(**options), field) == value


@pytest.mark.parametrize("caches, k, v", [("k", True, False), ("v", False, True), ("kv", True, True)])
def test_caches_select_the_loops(caches: str, k: bool, v: bool) -> None:
    cfg = make_config(caches=caches)
    assert (cfg.k, cfg.v) == (k, v)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"size": 100}, "invalid size 100: must be a positive multiple of 16 bytes"),
        ({"size": 8}, "invalid size 8: must be a positive multiple of 16 bytes"),
        ({"size": 0}, "invalid size 0: must be a positive multiple of 16 bytes"),
        ({"size": -16}, "invalid size -16: must be a positive multiple of 16 bytes"),
        ({"size": "big"}, "invalid size 'big': use 'auto' or a number of bytes"),
        ({"size": True}, "invalid size True: use 'auto' or a number of bytes"),
        ({"align": 8}, "invalid align 8: must be a power of two >= 16"),
        ({"align": 24}, "invalid align 24: must be a power of two >= 16"),
        ({"align": 0}, "invalid align 0: must be a power of two >= 16"),
        ({"align": "x"}, "invalid align 'x': expected an integer"),
        ({"lookahead": 0}, "invalid lookahead 0: must be >= 1"),
        ({"lookahead": -2}, "invalid lookahead -2: must be >= 1"),
        ({"lookahead": "two"}, "invalid lookahead 'two': expected an integer"),
        ({"lookahead": True}, "invalid lookahead True: expected an integer"),
        ({"caches": "q"}, "invalid caches 'q': choose one of k, v, kv"),
        ({"caches": "vk"}, "invalid caches 'vk': choose one of k, v, kv"),
        (
            {"cache_hint": "evict_sometimes"},
            "invalid cache-hint 'evict_sometimes': choose one of none, evict_last, evict_first, evict_normal",
        ),
        ({"placement": "middle"}, "invalid placement 'middle': choose one of start, end"),
        ({"scope": "warp"}, "invalid scope 'warp': choose one of cta, kv-head, kv-head-rotate"),
        ({"preset": "fast"}, "invalid preset 'fast': choose one of default, paper"),
        ({"control": "yes"}, "invalid control 'yes': expected true or false"),
        ({"lookahaed": 2}, "unknown configuration key(s): lookahaed"),
        ({"zeta": 1, "alpha": 2}, "unknown configuration key(s): alpha, zeta"),
    ],
)
def test_refused(options: dict, message: str) -> None:
    with pytest.raises(UsageError) as info:
        make_config(**options)
    assert str(info.value) == message
    assert info.value.exit_code == 2


@pytest.mark.parametrize("options", [{"lookahead": 2.5}, {"align": 32.7}])
def test_non_integral_numbers_are_refused(options: dict) -> None:
    with pytest.raises(UsageError, match="expected an integer"):
        make_config(**options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"lookahead": 1025},
            "invalid lookahead 1025: at most 1024 (block_idx + lookahead * NUM_WARPS must stay within int)",
        ),
        ({"lookahead": 2**29}, "invalid lookahead 536870912: at most 1024"),
        ({"lookahead": 2**70}, "invalid lookahead 118059162071... (22 digits): at most 1024"),
        ({"lookahead": "9" * 5000}, "at most 1024"),
        (
            {"align": 2**64},
            "invalid align 184467440737... (20 digits): at most 4096 (the address is rounded down to it)",
        ),
        ({"align": 8192}, "invalid align 8192: at most 4096"),
        ({"size": 1_048_576}, "invalid size 1048576: at most 1048560 bytes (cp.async.bulk.prefetch's limit)"),
        ({"size": "9" * 5000}, "at most 1048560 bytes"),
        ({"size": 64, "align": 128}, "invalid align 128: larger than size 64"),
        ({"fp16": {"lookahead": 4096}}, "invalid lookahead 4096: at most 1024"),
    ],
)
def test_upper_bounds(options: dict, message: str) -> None:
    with pytest.raises(UsageError) as info:
        make_config(**options)
    assert message in str(info.value)
    assert len(str(info.value)) < 200 and "\n" not in str(info.value)


def test_the_bounds_themselves_are_accepted() -> None:
    cfg = make_config(lookahead=1024, align=4096, size=1_048_560)
    assert (cfg.lookahead, cfg.align, cfg.size) == (1024, 4096, 1_048_560)
