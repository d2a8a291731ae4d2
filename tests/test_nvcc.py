"""The patched vLLM 0.10.2 header compiled with nvcc: the prefetch reaches Hopper's PTX,
and nothing of it reaches sm_80's (the guard), which therefore still builds.

Each compile is a small TU taking the address of one v1 and one v2 instantiation
(fp16 storage as uint16_t, head 128, block 16, 128 threads), built to a cubin so ptxas
checks the PTX too; about a second each.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Callable

import pytest

from conftest import CompileError, REFORMAT_RELEASE
from kvpatch.config import make_config
from kvpatch.patch.plan import patch
from kvpatch.source.fetch import HEADER

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.network,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH: the PTX checks need the CUDA toolkit"),
]

PREFETCH = re.compile(r"^\s*cp\.async\.bulk\.prefetch\.L2\.global(\.L2::cache_hint)? \[%rd\d+\], (\d+)(, %rd\d+)?;$", re.M)


def entries(ptx: str) -> dict[str, str]:
    """The PTX of each kernel entry, keyed 'v1' / 'v2'."""
    out = {}
    for chunk in ptx.split(".entry ")[1:]:
        name = chunk.split("(", 1)[0]
        out["v2" if "paged_attention_v2_kernel" in name else "v1"] = chunk
    assert sorted(out) == ["v1", "v2"], "expected one v1 and one v2 kernel entry"
    return out


def prefetches(ptx: str) -> dict[str, list[tuple[str, str]]]:
    """Per kernel, the bulk prefetches as (cache-hint suffix, size)."""
    return {k: [(m.group(1) or "", m.group(2)) for m in PREFETCH.finditer(body)] for k, body in entries(ptx).items()}


@pytest.fixture(scope="module")
def tree(vllm_release: Callable[[str], Path]) -> Path:
    return vllm_release("0.10.2")


@pytest.fixture(scope="module")
def stock(tree: Path) -> str:
    return (tree / HEADER).read_text(encoding="utf-8")


def patched(tree: Path, stock: str, **options) -> str:
    return patch(stock, str(tree / HEADER), make_config(**options)).patched


def test_stock_header_has_no_prefetch(tree: Path, stock: str, nvcc_ptx) -> None:
    ptx = nvcc_ptx(tree / "csrc", stock, "sm_90a")
    assert prefetches(ptx) == {"v1": [], "v2": []}
    assert "cp.async.bulk" not in ptx


@pytest.mark.parametrize(
    "options, expected",
    [
        ({}, [("", "4096"), ("", "4096")]),  # one K and one V tile: 16 * 128 * sizeof(uint16_t)
        ({"preset": "paper"}, [("", "4096"), ("", "4096")]),
        ({"caches": "k"}, [("", "4096")]),
        ({"lookahead": 2, "size": 8192, "align": 128}, [("", "8192"), ("", "8192")]),
        ({"cache_hint": "evict_last"}, [(".L2::cache_hint", "4096"), (".L2::cache_hint", "4096")]),
        ({"placement": "end", "scope": "kv-head"}, [("", "4096"), ("", "4096")]),
        ({"control": True}, [("", "4096"), ("", "4096")]),  # compiled in, never executed
    ],
    ids=["default", "paper", "caches-k", "lookahead2-size8192-align128", "evict-last", "end-kv-head", "control"],
)
def test_sm90a_ptx_has_the_prefetch(options: dict, expected: list, tree: Path, stock: str, nvcc_ptx) -> None:
    ptx = nvcc_ptx(tree / "csrc", patched(tree, stock, **options), "sm_90a")
    assert prefetches(ptx) == {"v1": expected, "v2": expected}
    if options.get("cache_hint"):
        assert len(re.findall(r"createpolicy\.fractional\.L2::evict_last\.b64 %rd\d+, 1\.0;", ptx)) == 4


@pytest.mark.parametrize("options", [{}, {"preset": "paper"}], ids=["default", "paper"])
def test_sm80_builds_without_the_prefetch(options: dict, tree: Path, stock: str, nvcc_ptx) -> None:
    ptx = nvcc_ptx(tree / "csrc", patched(tree, stock, **options), "sm_80")
    assert prefetches(ptx) == {"v1": [], "v2": []}
    assert "cp.async.bulk" not in ptx


def test_without_the_guard_sm80_does_not_build(tree: Path, stock: str, nvcc_ptx) -> None:
    """What the guard is for: the bare instruction is refused by ptxas for sm_80."""
    guard = "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(USE_ROCM)\n"
    text = patched(tree, stock, preset="paper")
    unguarded = re.sub(re.escape(guard) + r"(.*?)#endif\n", r"\1", text, flags=re.S)
    assert unguarded.count(guard) == 0 and unguarded.count("cp.async.bulk.prefetch") == 2
    with pytest.raises(CompileError, match="sm_90"):
        nvcc_ptx(tree / "csrc", unguarded, "sm_80")


def test_reformatted_header_still_compiles_with_the_prefetch(reformatted_header, nvcc_ptx) -> None:
    tree, _, reformatted = reformatted_header
    assert tree.name == f"v{REFORMAT_RELEASE}"
    text = patch(reformatted, str(tree / HEADER), make_config()).patched
    ptx = nvcc_ptx(tree / "csrc", text, "sm_90a")
    assert prefetches(ptx) == {"v1": [("", "4096")] * 2, "v2": [("", "4096")] * 2}
