"""kvpatch.config: validation, the marker text, and kvpatch.toml."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpatch.config import PatchConfig, dump_config, load_config_file, make_config
from kvpatch.errors import UsageError


def test_defaults() -> None:
    cfg = make_config()
    assert cfg == PatchConfig()
    assert (cfg.preset, cfg.lookahead, cfg.size, cfg.align) == ("default", 1, None, 16)
    assert (cfg.caches, cfg.cache_hint, cfg.placement, cfg.scope, cfg.control) == ("kv", "none", "start", "cta", False)
    assert (cfg.k, cfg.v) == (True, True)


def test_none_means_not_given() -> None:
    assert make_config(lookahead=None, size=None, align=None, caches=None, preset=None) == PatchConfig()


# --------------------------------------------------------------------------- accepted values


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
    ],
)
def test_accepted(options: dict, field: str, value) -> None:
    assert getattr(make_config(**options), field) == value


@pytest.mark.parametrize("caches, k, v", [("k", True, False), ("v", False, True), ("kv", True, True)])
def test_caches_select_the_loops(caches: str, k: bool, v: bool) -> None:
    cfg = make_config(caches=caches)
    assert (cfg.k, cfg.v) == (k, v)


# --------------------------------------------------------------------------- refused values


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
        ({"cache_hint": "evict_sometimes"}, "invalid cache-hint 'evict_sometimes': choose one of none, evict_last, evict_first, evict_normal"),
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


# --------------------------------------------------------------------------- the paper preset


def test_paper_preset_fixes_the_papers_values() -> None:
    cfg = make_config(preset="paper")
    assert cfg == PatchConfig(preset="paper", size=4096, issue="inline", quantized="prefetch", overrides=())
    assert (cfg.lookahead, cfg.size, cfg.align, cfg.placement, cfg.scope) == (1, 4096, 16, "start", "cta")


def test_paper_preset_combines_with_caches_and_control() -> None:
    assert make_config(preset="paper", caches="k", control=True) == PatchConfig(
        preset="paper", size=4096, caches="k", control=True, issue="inline", quantized="prefetch", overrides=()
    )


@pytest.mark.parametrize(
    "options, clash",
    [
        ({"lookahead": 2}, "lookahead"),
        ({"size": 8192}, "size"),
        ({"align": 32}, "align"),
        ({"cache_hint": "evict_last"}, "cache_hint"),
        ({"placement": "end"}, "placement"),
        ({"scope": "kv-head"}, "scope"),
        ({"scope": "kv-head", "lookahead": 3}, "lookahead, scope"),
    ],
)
def test_paper_preset_refuses_options_it_fixes(options: dict, clash: str) -> None:
    with pytest.raises(UsageError) as info:
        make_config(preset="paper", **options)
    assert str(info.value) == f"--preset paper fixes {clash}; drop those options"


def test_paper_preset_accepts_its_own_size() -> None:
    assert make_config(preset="paper", size=4096) == make_config(preset="paper")


def test_paper_preset_refuses_size_auto() -> None:
    with pytest.raises(UsageError, match="--preset paper fixes size"):
        make_config(preset="paper", size="auto")


# --------------------------------------------------------------------------- the marker


@pytest.mark.parametrize(
    "options, marker",
    [
        ({"inherit_rules": False}, "lookahead=1 size=auto align=16 caches=kv hint=none placement=start scope=cta issue=call quantized=skip"),
        (
            {"lookahead": 2, "size": 8192, "align": 128, "caches": "v", "cache_hint": "evict_first",
             "placement": "end", "scope": "kv-head", "control": True, "inherit_rules": False,
             "fp16": "scope=kv-head,issue=inline", "rules": {"bf16/80/32": "off"}},
            "lookahead=2 size=8192 align=128 caches=v hint=evict_first placement=end scope=kv-head issue=call quantized=skip control bf16/80/32:off fp16:scope=kv-head,issue=inline",
        ),
        ({"preset": "paper"}, "preset=paper caches=kv"),
        ({"preset": "paper", "control": True}, "preset=paper caches=kv control"),
    ],
)  # fmt: skip
def test_marker(options: dict, marker: str) -> None:
    assert make_config(**options).marker() == marker


@pytest.mark.parametrize(
    "a, b",
    [
        ({}, {"caches": "k"}),
        ({}, {"control": True}),
        ({}, {"issue": "inline"}),
        ({}, {"preset": "paper"}),
        pytest.param(
            {"preset": "paper"},
            {"preset": "paper", "caches": "k"}
        ),
    ],
)
def test_different_configs_have_different_markers(a: dict, b: dict) -> None:
    assert make_config(**a).marker() != make_config(**b).marker()


# --------------------------------------------------------------------------- kvpatch.toml


def test_dump_config_writes_a_complete_table() -> None:
    cfg = make_config(inherit_rules=False, fp16="scope=kv-head,issue=inline", rules={"bf16/80/32": "off", "fp16/64/16/auto/v2": "lookahead=2"})
    assert dump_config(cfg) == (
        "[kvpatch]\n"
        'preset = "default"\n'
        "lookahead = 1\n"
        'size = "auto"\n'
        "align = 16\n"
        'caches = "kv"\n'
        'cache-hint = "none"\n'
        'placement = "start"\n'
        'scope = "cta"\n'
        "min-group = 1\n"
        "min-ctas = 1\n"
        "min-kv-mib = 0\n"
        'issue = "call"\n'
        'read = "lane"\n'
        "control = false\n"
        'quantized = "skip"\n'
        "inherit-rules = false\n"
        'bf16 = "none"\n'
        'fp32 = "none"\n'
        "\n"
        "[kvpatch.fp16]\n"
        'scope = "kv-head"\n'
        'issue = "inline"\n'
        "\n"
        "[kvpatch.rules]\n"
        '"bf16/80/32" = { off = true }\n'
        '"fp16/64/16/auto/v2" = { lookahead = 2 }\n'
    )


def test_a_dumped_file_reads_back_the_same_whatever_the_default_rules(tmp_path, monkeypatch) -> None:
    """inherit-rules = false: a written file is complete, so a later kvpatch with other default rules
    reads it back unchanged (and the shipped default round-trips too)."""
    import kvpatch.config as C

    path = tmp_path / "kvpatch.toml"
    for cfg in (make_config(), make_config(inherit_rules=False, issue="inline")):
        path.write_text(dump_config(cfg))
        monkeypatch.setattr(C, "DEFAULT_OVERRIDES", (("fp32", (("lookahead", 3),)), ("*/*/8", (("off", True),))))
        assert make_config(**load_config_file(path)) == cfg
        monkeypatch.undo()
    assert make_config(**load_config_file(path)) == make_config(inherit_rules=False, issue="inline")
    with pytest.raises(UsageError, match="invalid inherit-rules"):
        make_config(inherit_rules="no")


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"lookahead": 3, "size": 8192, "align": 256, "caches": "k", "cache_hint": "evict_last",
         "placement": "end", "scope": "kv-head", "control": True},
        pytest.param(
            {"preset": "paper"}
        ),
    ],
    ids=["default", "everything-set", "paper"],
)  # fmt: skip
def test_toml_round_trip(options: dict, tmp_path: Path) -> None:
    cfg = make_config(**options)
    path = tmp_path / "kvpatch.toml"
    path.write_text(dump_config(cfg), encoding="utf-8")
    assert make_config(**load_config_file(path)) == cfg


@pytest.mark.parametrize(
    "text",
    [
        'lookahead = 2\ncache-hint = "evict_last"\nsize = 8192\n',
        '[kvpatch]\nlookahead = 2\ncache_hint = "evict_last"\nsize = 8192\n',
        '# a comment\n[kvpatch]\nlookahead = 2\ncache-hint = "evict_last"\nsize = 8192\n',
    ],
    ids=["top-level-dashes", "table-underscores", "table-dashes"],
)
def test_load_config_file(text: str, tmp_path: Path) -> None:
    path = tmp_path / "kvpatch.toml"
    path.write_text(text, encoding="utf-8")
    assert load_config_file(path) == {"lookahead": 2, "cache_hint": "evict_last", "size": 8192}
    assert make_config(**load_config_file(path)) == PatchConfig(lookahead=2, cache_hint="evict_last", size=8192)


def test_unknown_key_in_a_config_file(tmp_path: Path) -> None:
    path = tmp_path / "kvpatch.toml"
    path.write_text("[kvpatch]\nlook-ahead = 2\ncaches = 'k'\n", encoding="utf-8")
    with pytest.raises(UsageError, match=r"^unknown configuration key\(s\): look_ahead$"):
        make_config(**load_config_file(path))


@pytest.mark.parametrize(
    "text, message",
    [
        ("lookahead = ", r"^invalid TOML in .*kvpatch\.toml: "),
        ("kvpatch = 3\n", r"^invalid config file .*kvpatch\.toml: \[kvpatch\] must be a table$"),
    ],
)
def test_bad_config_files(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "kvpatch.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UsageError, match=message):
        load_config_file(path)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^config file not found: .*nope\.toml$"):
        load_config_file(tmp_path / "nope.toml")


# --------------------------------------------------------------------------- per-dtype settings


def test_per_dtype_settings_apply_to_their_dtype_only() -> None:
    cfg = make_config(bf16="lookahead=2,issue=inline,cache-hint=evict_last")
    assert cfg.for_dtype("bf16").lookahead == 2 and cfg.for_dtype("bf16").cache_hint == "evict_last"
    assert cfg.for_dtype("fp32").lookahead == 1 and cfg.for_dtype("fp32").cache_hint == "none"
    assert cfg.for_dtype("fp16").off  # the default fp16 rule (off: fp16 kernels tune did not measure) stays


def test_none_clears_a_dtypes_settings() -> None:
    cfg = make_config(fp16="none", bf16="none", fp32="none", rules="none", issue="inline")
    assert cfg.overrides == ()
    assert cfg.marker() == "lookahead=1 size=auto align=16 caches=kv hint=none placement=start scope=cta issue=inline quantized=skip"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"fp16": "placement=end"}, "fp16 cannot override placement"),
        ({"bf16": "lookahead=0"}, "invalid lookahead 0"),
        ({"bf16": "lookahead"}, "use key=value"),
        ({"preset": "paper", "fp16": "none"}, "takes no per-dtype settings"),
        ({"fp32": 3}, "invalid fp32 settings"),
        ({"bf16": "issue=call,align=32", "fp32": "issue=call"}, "share one helper"),
    ],
)
def test_bad_per_dtype_settings(options: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        make_config(**options)


@pytest.mark.parametrize(
    "options",
    [{}, {"fp16": "none"}, {"bf16": "lookahead=2,control=true", "fp32": "issue=inline"}, {"preset": "paper"}],
)
def test_per_dtype_settings_round_trip_through_toml(options: dict, tmp_path: Path) -> None:
    cfg = make_config(**options)
    path = tmp_path / "kvpatch.toml"
    path.write_text(dump_config(cfg))
    assert make_config(**load_config_file(path)) == cfg


# --------------------------------------------------------------------------- upper bounds (issue 7, item 8)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lookahead": 1025}, "invalid lookahead 1025: at most 1024 (block_idx + lookahead * NUM_WARPS must stay within int)"),
        ({"lookahead": 2**29}, "invalid lookahead 536870912: at most 1024"),
        ({"lookahead": 2**70}, "invalid lookahead 118059162071... (22 digits): at most 1024"),
        ({"lookahead": "9" * 5000}, "at most 1024"),
        ({"align": 2**64}, "invalid align 184467440737... (20 digits): at most 4096 (the address is rounded down to it)"),
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


@pytest.mark.parametrize("value", [0, -1, 1025, "x", 2.0])
def test_min_group_bounds(value) -> None:
    with pytest.raises(UsageError, match="min-group|min_group"):
        make_config(min_group=value)


def test_min_group_is_in_the_marker_only_when_set() -> None:
    from kvpatch.config_io import config_from_marker

    assert "min-group" not in make_config().marker()
    cfg = make_config(min_group=2, fp16="min-group=8")
    assert " min-group=2 " in cfg.marker() and "fp16:min_group=8" in cfg.marker()
    assert config_from_marker(cfg.marker()) == cfg and cfg.for_dtype("fp16").min_group == 8


@pytest.mark.parametrize("value", ["", "Warp", "lanes", "thread", "warp ", 1, True])
def test_read_takes_lane_or_warp_only(value) -> None:
    with pytest.raises(UsageError, match="invalid read"):
        make_config(read=value)


def test_read_is_in_the_marker_only_when_warp_and_round_trips(tmp_path) -> None:
    from kvpatch.config_io import config_from_marker, dump_config, load_config_file

    assert "read=" not in make_config(rules="none").marker() and make_config(read="lane").marker() == make_config().marker()
    assert " read=" not in make_config().marker()  # the default's base settings read with lane 0; its rules may say warp
    cfg = make_config(read="warp", rules={"fp16/128/16/auto/v2": "read=lane,scope=kv-head", "bf16/64": "read=warp,issue=inline"})
    assert " issue=call read=warp quantized=" in cfg.marker() and "fp16/128/16/auto/v2:scope=kv-head,read=lane" in cfg.marker()
    assert config_from_marker(cfg.marker()) == cfg
    assert cfg.resolve("fp16", 128, 16, "auto", "v2").read == "lane" and cfg.resolve("fp16", 128, 16, "auto", "v1").read == "warp"
    (tmp_path / "k.toml").write_text(dump_config(cfg))
    assert make_config(**load_config_file(tmp_path / "k.toml")) == cfg
    with pytest.raises(UsageError, match="--preset paper fixes read"):
        make_config(preset="paper", read="warp")
    assert make_config(preset="paper", read="lane").preset == "paper"


@pytest.mark.parametrize("value", [0, -1, (1 << 24) + 1, "x", 2.0, True])
def test_min_ctas_bounds(value) -> None:
    with pytest.raises(UsageError, match="min-ctas|min_ctas"):
        make_config(min_ctas=value)


def test_min_ctas_is_in_the_marker_only_when_set_and_round_trips(tmp_path) -> None:
    from kvpatch.config_io import config_from_marker, dump_config, load_config_file

    assert "min-ctas" not in make_config().marker() and make_config(min_ctas=1 << 24).min_ctas == 1 << 24
    cfg = make_config(min_ctas=1024, rules={"fp16/128/32/auto/v2": "min-ctas=4096,min-group=2"})
    assert " min-ctas=1024 " in cfg.marker() and "min_ctas=4096" in cfg.marker()
    assert config_from_marker(cfg.marker()) == cfg
    assert cfg.resolve("fp16", 128, 32, "auto", "v2").min_ctas == 4096
    (tmp_path / "k.toml").write_text(dump_config(cfg))
    assert make_config(**load_config_file(tmp_path / "k.toml")) == cfg
    with pytest.raises(UsageError, match="--preset paper fixes min_ctas"):
        make_config(preset="paper", min_ctas=2)


@pytest.mark.parametrize("value", [-1, (1 << 20) + 1, "x", 2.0, True])
def test_min_kv_mib_bounds(value) -> None:
    with pytest.raises(UsageError, match="min-kv-mib|min_kv_mib"):
        make_config(min_kv_mib=value, inherit_rules=False)


def test_min_kv_mib_is_call_only_in_the_marker_when_set_and_round_trips(tmp_path) -> None:
    """min-kv-mib is tested inside the call helper: a configuration (base or rule) that gives it
    to another issue form, or lets non-call rules inherit it, is refused in one line."""
    from kvpatch.config_io import config_from_marker, dump_config, load_config_file

    assert "min-kv-mib" not in make_config().marker() and make_config().min_kv_mib == 0
    cfg = make_config(rules={"fp16/128/16/auto/v2": "scope=kv-head,min-group=2,read=warp,min-kv-mib=64"})
    assert "min_kv_mib=64" in cfg.marker() and cfg.resolve("fp16", 128, 16, "auto", "v2").min_kv_mib == 64
    assert cfg.resolve("fp16", 128, 16, "auto", "v1").min_kv_mib == 0
    assert config_from_marker(cfg.marker()) == cfg
    (tmp_path / "k.toml").write_text(dump_config(cfg))
    assert make_config(**load_config_file(tmp_path / "k.toml")) == cfg
    base = make_config(min_kv_mib=64, inherit_rules=False)
    assert " min-kv-mib=64 " in base.marker() and config_from_marker(base.marker()) == base
    for bad, match in [({"min_kv_mib": 64, "issue": "inline", "inherit_rules": False}, "needs issue=call"),
                       ({"rules": {"fp16/128/16/auto/v2": "issue=split,min-kv-mib=64"}}, "needs issue=call"),
                       ({"min_kv_mib": 64}, r"bf16/128/16/auto/v1 \(issue=split\).* would inherit it"),
                       ({"preset": "paper", "min_kv_mib": 64}, "--preset paper fixes min_kv_mib")]:  # fmt: skip
        with pytest.raises(UsageError, match=match) as e:
            make_config(**bad)
        assert "\n" not in str(e.value)
