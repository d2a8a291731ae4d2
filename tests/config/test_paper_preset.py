"""``--preset paper``: the paper's exact mechanism, which fixes the settings it names."""

from __future__ import annotations

import pytest

from kvpatch.config import PatchConfig, make_config
from kvpatch.errors import UsageError


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
        ({"cache_hint": "evict_last"}, "cache-hint"),
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
