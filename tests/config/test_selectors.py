"""Rule selectors (``dtype[/head[/block[/kv[/kernel]]]]``): their canonical form, what they
refuse, what they select, and the ``--rule SELECTOR=SETTINGS`` form."""

from __future__ import annotations

import pytest

from kvpatch.config import Selector, make_config, parse_rules
from kvpatch.errors import UsageError


@pytest.mark.parametrize(
    "text, canonical, specificity",
    [
        ("bf16", "bf16", 1),
        ("bf16/80/32", "bf16/80/32", 3),
        ("*/*/32", "*/*/32", 1),
        ("fp16/64/*/*", "fp16/64", 2),
        ("*/128/16/fp8", "*/128/16/fp8", 3),
        (" fp32 / 256 ", "fp32/256", 2),
        ("fp16/256/16/auto/v2", "fp16/256/16/auto/v2", 5),
        ("*/*/*/*/v1", "*/*/*/*/v1", 1),
        ("bf16/64/*/*/*", "bf16/64", 2),
    ],
)
def test_selector_canonical_form(text: str, canonical: str, specificity: int) -> None:
    sel = Selector.parse(text)
    assert str(sel) == canonical
    assert sel.specificity == specificity
    assert Selector.parse(str(sel)) == sel


@pytest.mark.parametrize(
    "text, message",
    [
        ("fp8", "dtype 'fp8' is not one of"),
        ("bf16/eighty", "head size 'eighty' is not a number"),
        ("bf16/80/0", "block size '0' is not a number"),
        ("bf16/81", "vLLM builds no kernel of head size 81"),
        ("bf16/80/24", "vLLM builds no kernel of block size 24"),
        ("bf16/80/32/fp4", "kv-cache 'fp4' is not one of"),
        ("bf16/80/32/auto/x", "kernel 'x' is not one of"),
        ("bf16/80/32/auto/v1/x", "use dtype"),
        ("bf16//32", "use dtype"),
        ("*", "selects everything"),
    ],
)
def test_bad_selectors(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        Selector.parse(text)


def test_matches() -> None:
    sel = Selector.parse("bf16/*/32")
    assert sel.matches("bf16", 80, 32)
    assert not sel.matches("bf16", 80, 16)
    assert not sel.matches("fp16", 80, 32)
    assert Selector.parse("*/*/*/fp8").matches("fp16", 128, 16, "fp8_e5m2")
    assert not Selector.parse("*/*/*/fp8").matches("fp16", 128, 16, "auto")


def test_intersect_is_what_both_select() -> None:
    a, b = Selector.parse("fp16/*/16"), Selector.parse("*/128/*/*/v2")
    assert str(a.intersect(b)) == "fp16/128/16/*/v2" and b.intersect(a) == a.intersect(b)
    assert Selector.parse("fp16").intersect(Selector.parse("bf16/128")) is None
    assert a.intersect(Selector.parse("fp16")) == a


def test_a_kernel_part_selects_one_of_the_two_kernels() -> None:
    sel = Selector.parse("fp16/256/16/auto/v2")
    assert sel.matches("fp16", 256, 16, "auto", "v2") and not sel.matches("fp16", 256, 16, "auto", "v1")
    assert not sel.matches("fp16", 256, 16, "auto")  # asked for both kernels: a v2-only rule does not answer
    cfg = make_config(inherit_rules=False, rules={"fp16/256/16/auto/v1": "off", "fp16/256/16": "issue=call,scope=cta"})
    assert cfg.resolve("fp16", 256, 16, "auto", "v1").off
    assert cfg.resolve("fp16", 256, 16, "auto", "v2").issue == "call"
    assert cfg.resolve("fp16", 256, 16).issue == "call"
    assert [sel for sel, _ in cfg.variants()][0] == "fp16/256/16/auto/v1"  # the most specific first


def test_cli_rule_form() -> None:
    assert parse_rules(["bf16/80/32=off", "fp16/64/*=issue=call,lookahead=2"]) == {
        "bf16/80/32": "off", "fp16/64": "issue=call,lookahead=2"}  # fmt: skip
    with pytest.raises(UsageError, match="use SELECTOR=SETTINGS"):
        parse_rules(["bf16/80/32"])
    with pytest.raises(UsageError, match="given twice"):
        parse_rules(["bf16/80/32=off", "bf16/80/32/*=off"])
