"""What ``apply`` warns changes no kernel: the options and rules a configuration does not reach."""

from __future__ import annotations

from kvpatch.commands.configuration import ConfigOptions, configure
from kvpatch.config import make_config, unreached


def _warned(rules: list[str], **settings) -> list[str]:
    return configure(ConfigOptions(rules=rules, settings=settings))[1]


def test_a_rule_the_tables_rules_take_up_is_reached() -> None:
    """``bf16/128/16=issue=inline``: the table's two bf16 128/16 rules decide those kernels and
    take the rule's issue, so the rule changes them and nothing is said."""
    cfg = make_config(rules={"bf16/128/16": "issue=inline"})
    assert (
        cfg.resolve("bf16", 128, 16, "auto", "v1").issue
        == "inline"
        != make_config().resolve("bf16", 128, 16, "auto", "v1").issue
    )
    assert _warned(["bf16/128/16=issue=inline"]) == []
    assert _warned(["fp16/64/16=lookahead=3"]) == [] and _warned(["*/*/16=issue=inline"]) == []
    assert _warned(["fp16/64=issue=call,lookahead=2", "*/*/8=off"]) == []


def test_a_rule_whose_kernels_more_specific_rules_of_the_users_decide_is_unreached() -> None:
    (line,) = _warned(["fp16/64/16=lookahead=3", "fp16/64/16/*/v1=off", "fp16/64/16/*/v2=lookahead=2"])
    assert line.startswith("rule fp16/64/16 changes no kernel: more specific rules decide every kernel it selects")
    (line,) = _warned(["fp16/64/16/fp8/v1=lookahead=2"])
    assert line.endswith("only fp8-cache kernels, which stay stock under quantized=skip (add --quantized prefetch)")
    # a rule that only groups them: no --quantized makes an fp8-cache kernel group
    (line,) = _warned(["fp16/128/16/fp8/v1=group=4,group-min-ctas=1"])
    assert line.endswith("only fp8-cache kernels, which never take the grouped form")


def test_a_base_setting_every_prefetching_kernel_takes_from_a_users_rule_is_unreached() -> None:
    """``--lookahead 3`` with rules that set lookahead wherever a kernel prefetches (also where
    they meet the table's rules): no kernel takes the base value."""
    (line,) = _warned(["*/*/16=lookahead=2", "*/*/32=off"], lookahead=3)
    assert line.startswith("--lookahead changes no kernel: every kernel that prefetches takes lookahead from a rule")
    assert _warned(["*/*/16=scope=cta", "*/*/32=off"], lookahead=3) == []


def test_unreached_without_user_rules_treats_every_rule_as_given() -> None:
    cfg = make_config(inherit_rules=False, lookahead=2, rules={"fp16": "lookahead=3", "bf16": "off", "fp32": "off"})
    assert unreached(cfg, ["lookahead"]) == [
        "--lookahead changes no kernel: every kernel that prefetches takes lookahead from a rule of its own "
        "(set it there, e.g. --rule 'fp16/64/16/auto/v1=lookahead=...')"]  # fmt: skip
    assert unreached(make_config(rules="none"), ["scope"]) == [
        "--scope changes no kernel: no kernel prefetches under these rules"
    ]


def test_a_setting_of_the_grouped_form_where_no_kernel_groups_is_unreached() -> None:
    """Before: ``--group-v-loads ahead`` with no kernel grouped (``rules = none`` drops the table's
    grouping) was taken as reaching every prefetching kernel and nothing was said; so were the
    other settings only the grouped form reads. After: each is said, and a v1-only one also
    where only v2 kernels group."""
    assert unreached(make_config(rules="none"), ["group_v_loads"]) == [
        "--group-v-loads changes no kernel: no kernel takes the grouped form under these rules, or every one that "
        "does takes group-v-loads from a rule of its own (--group 4 groups every kernel)"]  # fmt: skip
    assert unreached(make_config(rules="none", group=4), ["group_v_loads", "group_logits"]) == []
    only_v2 = make_config(rules="none", fp16="group=4", bf16="off", fp32="off")
    v2 = make_config(inherit_rules=False, rules={"*/*/*/*/v2": "group=4", "*/*/*/*/v1": "lookahead=1"})
    assert unreached(only_v2, ["group_logits"]) == []
    (line,) = unreached(v2, ["group_logits", "group_v_loads"])
    assert line.startswith("--group-logits changes no kernel: no v1 kernel takes the grouped form")
    # the shipped table groups: every such base setting reaches its grouped kernels
    assert _warned([], group_v_loads="ahead", group_logits="global", group_min_ctas=5) == []
