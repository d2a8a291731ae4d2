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

from conftest import LOOP_NAMES

from kvpatch.config import make_config
from kvpatch.patch.plan import patch, unpatch
from kvpatch.source import releases
from kvpatch.source.releases import HEADER
from kvpatch.patch.sites import find_sites

pytestmark = pytest.mark.network

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



def _names(sites) -> dict:
    out = {k: getattr(sites, k) for k in ("cache_type", "lane_var", "head_var", "queries_per_kv_var", "head_size_param", "block_size_param")}
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


@pytest.mark.parametrize("options", [{}, {"preset": "paper"}], ids=["default", "paper"])
def test_patch_validates_and_round_trips(options: dict, release: tuple[str, str, str]) -> None:
    _, path, text = release
    cfg = make_config(**options)
    result = patch(text, path, cfg)  # raises unless the re-parse validates
    prefetch = "cp.async.bulk.prefetch.L2.global [%0], %1;"
    # the paper: one asm per site; a rule table: each inline or split rule's asm per site + the helper's
    inline_rules = sum(c.issue in ("inline", "split") and not c.off for _, c in cfg.variants())
    assert result.patched.count(prefetch) == (2 if cfg.preset == "paper" else 2 * inline_rules + 1)
    # One guarded region per site; the paper preset adds a guarded next-block
    # declaration per site, the default a guarded helper region and, with split rules
    # (the shipped table has them), the guarded branch before the key loop.
    guards = 4 if cfg.preset == "paper" else 3 + cfg.uses_split
    assert result.patched.count("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(USE_ROCM)\n") == guards
    assert unpatch(result.patched, path) == (text, (cfg.marker(),))


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
    from kvpatch.patch.plan import inspect

    _, path, text = release
    sites = find_sites(text, path)
    assert sites.alibi_var == "alibi_slope"
    assert sites.key.loop_text.startswith("for (int block_idx") and sites.key.loop_text.endswith("}")
    result = patch(text, path, make_config(inherit_rules=False, issue="split"))
    patched = result.patched
    assert patched.count("// kvpatch:begin key-split ") == 1 and patched.count(sites.key.loop_text) == 1  # the other holds the prefetch
    begin = patched.index("// kvpatch:begin key-split ")
    assert patched.index("&& alibi_slope != 0) {", begin) < patched.index(sites.key.loop_text, begin)
    assert unpatch(patched, path)[0] == text and inspect(patched, path).intact
    # without split anywhere, no region and no copy
    assert "key-split" not in patch(text, path, make_config(inherit_rules=False, issue="inline")).patched
