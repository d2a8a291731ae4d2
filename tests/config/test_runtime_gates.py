"""The runtime gates (min-group, min-ctas, min-kv-mib) and ``read``: their bounds, when the marker
names them, and their round trips through the marker and kvpatch.toml."""

from __future__ import annotations

import pytest

from kvpatch.config import config_from_marker, dump_config, load_config_file, make_config
from kvpatch.errors import UsageError


@pytest.mark.parametrize("value", [0, -1, 1025, "x", 2.0])
def test_min_group_bounds(value) -> None:
    with pytest.raises(UsageError, match="min-group|min_group"):
        make_config(min_group=value)


def test_min_group_is_in_the_marker_only_when_set() -> None:
    assert "min-group" not in make_config().marker()
    cfg = make_config(min_group=2, fp16="min-group=8")
    assert " min-group=2 " in cfg.marker() and "fp16:min_group=8" in cfg.marker()
    assert config_from_marker(cfg.marker()) == cfg and cfg.for_dtype("fp16").min_group == 8


@pytest.mark.parametrize("value", ["", " ", "Warp", "lanes", "thread", "war p", 1, True])
def test_read_takes_lane_or_warp_only(value) -> None:
    with pytest.raises(UsageError, match="invalid read"):
        make_config(read=value)


def test_read_is_in_the_marker_only_when_warp_and_round_trips(tmp_path) -> None:
    assert "read=" not in make_config(rules="none").marker()
    assert (
        " read=" not in make_config().marker()
    )  # the default's base settings read with lane 0; its rules may say warp
    assert any(c.read == "warp" for _, _, c in make_config().kernel_variants() if not c.off)
    lane = make_config(read="lane")  # given, it replaces the table's warp reads (a base setting the user gives)
    assert " read=" not in lane.marker() and all(c.read == "lane" for _, _, c in lane.kernel_variants())
    cfg = make_config(
        read="warp", rules={"fp16/128/16/auto/v2": "read=lane,scope=kv-head", "bf16/64": "read=warp,issue=inline"}
    )
    assert " issue=call read=warp quantized=" in cfg.marker()
    # the rule is laid on the table's rule of its selector: the tuned settings, with the rule's over them
    assert "fp16/128/16/auto/v2:lookahead=1,scope=kv-head,min_group=2,issue=call,read=lane" in cfg.marker()
    assert config_from_marker(cfg.marker()) == cfg
    assert (
        cfg.resolve("fp16", 128, 16, "auto", "v2").read == "lane"
        and cfg.resolve("fp16", 128, 16, "auto", "v1").read == "warp"
    )
    assert (
        cfg.resolve("bf16", 64, 16, "auto", "v1").issue == "inline"
        and cfg.resolve("fp16", 64, 32, "auto", "v1").read == "warp"
    )
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
    assert "min-ctas" not in make_config().marker() and make_config(min_ctas=1 << 24).min_ctas == 1 << 24
    cfg = make_config(min_ctas=1024, rules={"fp16/128/32/auto/v2": "min-ctas=4096,min-group=2"})
    assert " min-ctas=1024 " in cfg.marker() and "min_ctas=4096" in cfg.marker()
    assert config_from_marker(cfg.marker()) == cfg
    assert cfg.resolve("fp16", 128, 32, "auto", "v2").min_ctas == 4096
    (tmp_path / "k.toml").write_text(dump_config(cfg))
    assert make_config(**load_config_file(tmp_path / "k.toml")) == cfg
    with pytest.raises(UsageError, match="--preset paper fixes min-ctas"):
        make_config(preset="paper", min_ctas=2)


@pytest.mark.parametrize("value", [-1, (1 << 20) + 1, "x", 2.0, True])
def test_min_kv_mib_bounds(value) -> None:
    with pytest.raises(UsageError, match="min-kv-mib|min_kv_mib"):
        make_config(min_kv_mib=value, inherit_rules=False)


def test_min_kv_mib_is_call_only_in_the_marker_when_set_and_round_trips(tmp_path) -> None:
    """min-kv-mib is tested inside the call helper: a configuration (base or rule) that gives it
    to another issue form, or lets non-call rules inherit it, is refused in one line."""
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
                       ({"preset": "paper", "min_kv_mib": 64}, "--preset paper fixes min-kv-mib")]:  # fmt: skip
        with pytest.raises(UsageError, match=match) as e:
            make_config(**bad)
        assert "\n" not in str(e.value)
