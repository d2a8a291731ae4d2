"""Per-dtype settings (``--fp16``, ``[kvpatch.bf16]``): the settings of that dtype's kernels no other rule names."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpatch.config import dump_config, load_config_file, make_config
from kvpatch.errors import UsageError


def test_per_dtype_settings_apply_to_their_dtype_only() -> None:
    cfg = make_config(bf16="lookahead=2,issue=inline,cache-hint=evict_last")
    assert cfg.for_dtype("bf16").lookahead == 2 and cfg.for_dtype("bf16").cache_hint == "evict_last"
    assert cfg.for_dtype("fp32").lookahead == 1 and cfg.for_dtype("fp32").cache_hint == "none"
    assert cfg.for_dtype("fp16").off  # the default fp16 rule (off: fp16 kernels tune did not measure) stays


def test_none_clears_a_dtypes_settings() -> None:
    cfg = make_config(fp16="none", bf16="none", fp32="none", rules="none", issue="inline")
    assert cfg.overrides == ()
    assert (
        cfg.marker()
        == "lookahead=1 size=auto align=16 caches=kv hint=none placement=start scope=cta issue=inline quantized=skip"
    )


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
