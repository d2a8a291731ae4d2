"""Real vLLM releases, one per distinct revision of the attention header (``source/releases.py``):
the sites are where they were measured to be, and the patch validates and round-trips.

Fetched once into a cache that survives between runs ($KVPATCH_CACHE, else pytest's
cache dir); deselect with ``-m "not network"``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

import pytest
from conftest import LOOP_NAMES, fixture_text, golden_text
from patch_helpers import injected_regions

from kvpatch.config import make_config
from kvpatch.patch import find_sites, inspect, patch, unpatch
from kvpatch.source import releases
from kvpatch.source.releases import HEADER

pytestmark = [pytest.mark.network, pytest.mark.slow]

#: md5 prefix of each representative release's header (kvpatch's own table).
MD5 = {release: md5 for release, _, md5 in releases.REVISIONS}
#: release -> (key loop line, value loop line, block-number lines), read off each release's header.
REVISIONS = {
    "0.6.4": (227, 380, (257, 394)),
    "0.8.5": (227, 380, (257, 394)),
    "0.9.2": (227, 380, (257, 394)),
    "0.10.0": (222, 375, (252, 389)),
    "0.10.2": (222, 375, (252, 389)),
    "0.11.2": (222, 375, (252, 389)),
}


def test_every_revision_kvpatch_knows_is_checked_here() -> None:
    assert sorted(REVISIONS) == sorted(MD5)


def _names(sites) -> dict:
    out = {
        k: getattr(sites, k)
        for k in ("cache_type", "lane_var", "head_var", "queries_per_kv_var", "head_size_param", "block_size_param")
    }
    for site in sites:
        out[site.kind] = {k: getattr(site, k) for k in (*LOOP_NAMES, "cache_param", "inner_var")}
    return out


@pytest.fixture(scope="module", params=sorted(REVISIONS, key=lambda v: tuple(map(int, v.split(".")))))
def release(request: pytest.FixtureRequest, vllm_release: Callable[[str], Path]) -> tuple[str, str, str]:
    """(version, header path, header text) of one cached release."""
    tree = vllm_release(request.param)
    header = tree / HEADER
    return request.param, str(header), header.read_text(encoding="utf-8")


def test_header_revision(release: tuple[str, str, str]) -> None:
    version, _, text = release
    assert hashlib.md5(text.encode()).hexdigest().startswith(MD5[version])


def test_sites(release: tuple[str, str, str]) -> None:
    version, path, text = release
    key_line, value_line, (key_number, value_number) = REVISIONS[version]
    sites = find_sites(text, path)
    assert (sites.key.line, sites.value.line) == (key_line, value_line)
    assert (sites.key.block_number_line, sites.value.block_number_line) == (key_number, value_number)
    assert _names(sites) == {
        "cache_type": "cache_t", "lane_var": "lane", "head_var": "head_idx", "queries_per_kv_var": "num_queries_per_kv",
        "head_size_param": "HEAD_SIZE", "block_size_param": "BLOCK_SIZE",
        "key": {**LOOP_NAMES, "cache_param": "k_cache", "inner_var": "j"},
        "value": {**LOOP_NAMES, "cache_param": "v_cache", "inner_var": "i"},
    }  # fmt: skip
    data = text.encode()
    for site in sites:
        assert data[: site.after_block_number].endswith(b"static_cast<int64_t>(block_table[block_idx]);")


@pytest.mark.parametrize("golden, options", [("default", {}), ("paper", {"preset": "paper"})], ids=["default", "paper"])
def test_patch_is_the_golden_injection_and_round_trips(golden: str, options: dict, release: tuple[str, str, str],
                                                       header_path: str) -> None:  # fmt: skip
    """Every revision gets what the golden file shows for the fixture header, line for line
    (issue=split's copy of the key loop is the release's own loop), the re-parse validates it,
    and stripping gives the release's header back byte for byte."""
    _, path, text = release
    cfg = make_config(**options)
    result = patch(text, path, cfg)  # raises unless the re-parse validates
    fixture_loop = find_sites(fixture_text(), header_path).key.loop_text
    golden_regions = injected_regions(golden_text(golden), fixture_loop)
    regions = injected_regions(result.patched, result.sites.key.loop_text)
    if cfg.uses_group:  # the release's helper region also holds the grouped form, which the fixture cannot take
        assert find_sites(fixture_text(), header_path).group_missing and not result.sites.group_missing
        regions = [(label, _without_grouped_form(text) if label == "helper" else text) for label, text in regions]
    assert regions == golden_regions
    assert unpatch(result.patched, path) == (text, (cfg.marker(),))


def _without_grouped_form(helper: str) -> str:
    """The helper region less the grouped form (templates/inject/grouped.cuh.j2): its own
    ``#if !defined(USE_ROCM)`` block, the region's last before the end line."""
    lines = helper.splitlines()
    start, end = lines.index("#if !defined(USE_ROCM)"), len(lines) - 1
    assert lines[end - 1] == "#endif" and "__device__ void kvpatch_grouped_attention(" in lines[start:end]
    return "\n".join(lines[:start] + lines[end:])


def test_reformatted_header_gives_the_same_names(reformatted_header: tuple[Path, str, str]) -> None:
    tree, stock, reformatted = reformatted_header
    path = str(tree / HEADER)
    assert reformatted != stock
    assert "// kvpatch-tests: a comment between statements" in reformatted
    before, after = find_sites(stock, path), find_sites(reformatted, path)
    assert _names(after) == _names(before)
    assert after.key.line != before.key.line
    patched = patch(reformatted, path, make_config()).patched
    assert unpatch(patched, path)[0] == reformatted


def test_split_copies_stocks_key_loop_and_round_trips(release: tuple[str, str, str]) -> None:
    """issue=split on every revision: one region before the key loop whose copy is stock's
    loop text byte for byte, behind the head's ALiBi slope; stripped back to stock exactly."""
    _, path, text = release
    sites = find_sites(text, path)
    assert sites.alibi_var == "alibi_slope"
    assert sites.key.loop_text.startswith("for (int block_idx") and sites.key.loop_text.endswith("}")
    result = patch(text, path, make_config(inherit_rules=False, issue="split"))
    patched = result.patched
    assert (
        patched.count("// kvpatch:begin key-split ") == 1 and patched.count(sites.key.loop_text) == 1
    )  # the other holds the prefetch
    begin = patched.index("// kvpatch:begin key-split ")
    assert patched.index("&& alibi_slope != 0) {", begin) < patched.index(sites.key.loop_text, begin)
    assert unpatch(patched, path)[0] == text and inspect(patched, path).intact
    # without split anywhere, no region and no copy
    assert "key-split" not in patch(text, path, make_config(inherit_rules=False, issue="inline")).patched
