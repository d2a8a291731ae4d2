"""Per-kernel rules: which rule a kernel gets, dropping the shipped rules, what a rule may
say, and their TOML and marker forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpatch.config import DEFAULT_OVERRIDES, dump_config, load_config_file, make_config
from kvpatch.errors import UsageError


def test_the_most_specific_rule_wins_whatever_the_order() -> None:
    cfg = make_config(rules={"fp16/64": "issue=call", "*/64/16": "off", "fp16/64/16": "lookahead=3"})
    assert cfg.resolve("fp16", 64, 16).lookahead == 3  # three parts beat two
    assert cfg.resolve("fp16", 64, 32).issue == "call"
    assert cfg.resolve("bf16", 64, 16).off
    selectors = [sel for sel, _ in cfg.variants()]
    assert selectors.index("fp16/64/16") < selectors.index("fp16/64") < selectors.index("fp16")
    assert selectors[-1] is None  # the base settings come last
    same = make_config(
        rules=dict(reversed(list({"fp16/64": "issue=call", "*/64/16": "off", "fp16/64/16": "lookahead=3"}.items())))
    )
    assert same == cfg


def test_rules_none_drops_the_default_rules_but_not_the_dtype_tables() -> None:
    """``rules = "none"``: every kernel takes its dtype's rule (the shipped ones are all off)."""
    cfg = make_config(rules="none")
    assert [sel for sel, _ in cfg.overrides] == ["bf16", "fp16", "fp32"]
    assert cfg.resolve("bf16", 128, 16).off and cfg.resolve("fp16", 64, 16, "auto", "v1").off
    assert not any(not c.off for _, _, c in cfg.kernel_variants())
    assert any(not c.off for _, _, c in make_config().kernel_variants())


def test_a_rule_set_to_none_removes_that_rule() -> None:
    cfg = make_config(rules={"bf16/256/32/auto": "none"})
    assert "bf16/256/32/auto" in dict(DEFAULT_OVERRIDES) and "bf16/256/32/auto" not in dict(cfg.overrides)
    assert cfg.resolve("bf16", 256, 32).off  # the bf16 rule (off) takes over
    cfg = make_config(bf16="none", rules={"bf16/256/32/auto": "none"})
    assert not cfg.resolve("bf16", 256, 32).off and cfg.resolve("bf16", 128, 32).off  # its own rule


def test_an_off_rule_may_keep_the_grouped_form_and_reads_back_from_its_marker() -> None:
    from kvpatch.config.marker import config_from_marker

    cfg = make_config(inherit_rules=False, rules={"bf16/128/32": "off,group=4,group-min-ctas=256"})
    k = cfg.resolve("bf16", 128, 32, "auto", "v1")
    assert k.off and (k.group, k.group_min_ctas) == (4, 256)  # no prefetch, grouped in large launches
    assert cfg.resolve("bf16", 128, 16, "auto", "v1").group == 1  # the other kernels as before
    assert "bf16/128/32:group=4,group_min_ctas=256,off" in cfg.marker()
    assert config_from_marker(cfg.marker()) == cfg
    assert cfg.to_toml_dict()["rules"]["bf16/128/32"] == {"group": 4, "group_min_ctas": 256, "off": True}
    plain_off = make_config(inherit_rules=False, rules={"bf16/128/32": "off"})
    assert plain_off.resolve("bf16", 128, 32, "auto", "v1").group == 1
    # the grouped form's code goes into the header for it, though that kernel prefetches nothing
    assert cfg.uses_group and not plain_off.uses_group


def test_a_base_group_reaches_an_off_rule_of_the_shipped_table_that_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the shipped table has an off rule that groups. After: the user's base ``group``
    and ``group-min-ctas`` replace its grouping (``--group 1`` ungroups it); it stays off
    whatever else the user gives, and a rule of the user's own keeps its grouping."""
    import kvpatch.config.make as make

    grouping_off = ("bf16/128/32/auto/v2", (("group", 4), ("group_min_ctas", 256), ("off", True)))
    monkeypatch.setattr(make, "DEFAULT_OVERRIDES", (*DEFAULT_OVERRIDES, grouping_off))

    def v2(**options) -> tuple:
        k = make_config(**options).resolve("bf16", 128, 32, "auto", "v2")
        return k.off, k.group, k.group_min_ctas

    assert v2() == (True, 4, 256)
    assert v2(group=1) == (True, 1, 256)
    assert v2(group=2, group_min_ctas=64) == (True, 2, 64)
    assert v2(lookahead=2, scope="kv-head") == (True, 4, 256)  # the prefetch settings do not turn it on
    assert v2(group=1, rules={"bf16/128/32/auto/v2": "off,group=8"}) == (True, 8, 1)
    assert make_config(group=1).resolve("bf16", 128, 32, "auto", "v1").off  # its v1 twin as before


@pytest.mark.parametrize(
    "rules, message",
    [
        ({"bf16/80/32": "off,lookahead=2"}, "'off' takes no other settings but the grouped form's \\(group, group-min"),
        ({"bf16/80/32": "off,group=3"}, "invalid group 3"),
        ({"bf16/80/32": "placement=end"}, "cannot override placement \\(only lookahead, size, align, cache-hint"),
        ({"bf16/80/32": {"min_kv-mib": 1, "grup": 4}}, "cannot override grup \\(only .*, min-kv-mib, "),
        ({"bf16/80/32": {"off": "yes"}}, "expected true"),
        ({"bf16/80/32": {"off": False}}, "'off = false' alone changes nothing"),
        ({"bf16/80/32": "lookahead=0"}, "invalid lookahead 0"),
        ({"bf16/80": "issue=call,align=64", "fp32/80": "issue=call"}, "share one helper"),
        ({"bf16/80/32": "off", "bf16/80/32/*": "off"}, "given twice"),
        ("everything", "invalid rules"),
    ],
)
def test_bad_rules(rules, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        make_config(rules=rules)


def test_off_false_with_settings_turns_a_kernel_on() -> None:
    cfg = make_config(rules={"fp16/64/16/auto/v2": {"off": False, "issue": "inline"}})
    c = cfg.resolve("fp16", 64, 16, "auto", "v2")
    assert not c.off and c.issue == "inline"


def test_rules_round_trip_through_toml(tmp_path: Path) -> None:
    cfg = make_config(rules={"fp16/64": "issue=call,lookahead=2", "*/*/8": "off"}, bf16="lookahead=2")
    path = tmp_path / "kvpatch.toml"
    path.write_text(dump_config(cfg))
    assert '"fp16/64" = { lookahead = 2, issue = "call" }' in path.read_text()
    assert make_config(**load_config_file(path)) == cfg


def test_marker_names_every_rule() -> None:
    cfg = make_config(rules={"*/*/8": "off"}, inherit_rules=False, fp16="scope=kv-head", bf16="off")
    assert cfg.marker().endswith("quantized=skip */*/8:off bf16:off fp16:scope=kv-head")
    default = make_config()
    assert all(f" {sel}:" in default.marker() for sel, _ in default.overrides)
