"""The marker: a configuration's one-line form, written into the generated code."""

from __future__ import annotations

import pytest

from kvpatch.config import make_config


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
        pytest.param({"preset": "paper"}, {"preset": "paper", "caches": "k"}),
    ],
)
def test_different_configs_have_different_markers(a: dict, b: dict) -> None:
    assert make_config(**a).marker() != make_config(**b).marker()
