"""The patched vLLM 0.10.2 header compiled with nvcc: the prefetch reaches Hopper's PTX,
and nothing of it reaches sm_80's (the guard), which therefore still builds, nor Blackwell's,
which is stock's.

Each compile is a small TU taking the address of one v1 and one v2 instantiation per
query dtype (fp16 as uint16_t, bf16, fp32; head 128, block 16, 128 threads), compiled
with vLLM's flags to a cubin so ptxas checks the PTX too; a few seconds each. A kernel
counts a prefetch whether it sits in its own body (inline asm) or in a function it
calls (the ``kvpatch_prefetch_l2`` helper of ``issue=call``).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Callable

import pytest
from conftest import REFORMAT_RELEASE, CompileError

from kvpatch.config import make_config
from kvpatch.patch import patch
from kvpatch.source.releases import HEADER

pytestmark = [
    pytest.mark.slow,
    pytest.mark.nvcc,
    pytest.mark.network,
    pytest.mark.skipif(
        shutil.which("nvcc") is None, reason="nvcc is not on PATH: the PTX checks need the CUDA toolkit"
    ),
]

PREFETCH = re.compile(
    r"^\s*cp\.async\.bulk\.prefetch\.L2\.global(\.L2::cache_hint)? \[%rd\d+\], (\d+)(, %rd\d+)?;$", re.M
)


_FUNCTION = re.compile(r"^(?:\.visible |\.weak )*\.(entry|func)\s+(?:\([^)]*\)\s*)?([\w$]+)")
_CALL = re.compile(r"^\s*call(?:\.uni)?\s+(?:\([^)]*\),\s*)?([\w$]+)", re.M)
#: The mangled scalar_t of a kernel name, after "kernelI": uint16_t, __nv_bfloat16, float.
_DTYPES = {"t": "fp16", "13__nv_bfloat16": "bf16", "f": "fp32"}
DTYPES = ("fp16", "bf16", "fp32")
#: What size=auto gives at head 128, block 16: BLOCK_SIZE * HEAD_SIZE * sizeof(cache_t).
AUTO = {"fp16": "4096", "bf16": "4096", "fp32": "8192"}


def functions(ptx: str) -> dict[str, tuple[str, str]]:
    """Every function defined in the PTX: name -> (kind 'entry' | 'func', body)."""
    out: dict[str, tuple[str, str]] = {}
    current: str | None = None
    kind, body = "", []
    for line in ptx.splitlines():
        m = _FUNCTION.match(line)
        if m and not line.rstrip().endswith(";"):
            current, kind, body = m.group(2), m.group(1), []
        elif current is not None:
            if line == "}":
                out[current] = (kind, "\n".join(body))
                current = None
            else:
                body.append(line)
    return out


def entries(ptx: str) -> dict[tuple[str, str], str]:
    """The PTX of each kernel entry with the bodies of the functions it calls, keyed
    ('v1' | 'v2', dtype)."""
    funcs = functions(ptx)
    out = {}
    for name, (kind, body) in funcs.items():
        if kind != "entry":
            continue
        kernel = "v2" if "paged_attention_v2_kernel" in name else "v1"
        args = name.split("_kernelI", 1)[1]
        dtype = next(d for code, d in _DTYPES.items() if args.startswith(code))
        called = [funcs[c][1] for c in _CALL.findall(body) if c in funcs]
        out[(kernel, dtype)] = "\n".join([body, *called])
    assert sorted(out) == sorted((k, d) for k in ("v1", "v2") for d in DTYPES), sorted(out)
    return out


def prefetches(ptx: str) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """Per kernel, the bulk prefetches it issues (its own or its callees') as (cache-hint suffix, size)."""
    return {k: [(m.group(1) or "", m.group(2)) for m in PREFETCH.finditer(body)] for k, body in entries(ptx).items()}


def each(expected) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """``expected(dtype)`` (or ``expected(dtype, kernel)``) for both kernels of every dtype."""
    import inspect

    per_kernel = len(inspect.signature(expected).parameters) == 2
    return {(k, d): expected(d, k) if per_kernel else expected(d) for k in ("v1", "v2") for d in DTYPES}


def distinct(found: dict[tuple[str, str], list[tuple[str, str]]]) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """Each kernel's prefetches without repeats: nvcc may duplicate a call site (loop
    unswitching keeps the helper call in each copy), so only inline sites can be counted."""
    return {k: sorted(set(v)) for k, v in found.items()}


NONE = each(lambda d: [])


def default_expected(dtype: str, kernel: str) -> list[tuple[str, str]]:
    """The shipped configuration at head 128 block 16: a tile-sized prefetch in exactly the
    kernels it turns on (compared without repeats: the table mixes call and inline forms)."""
    return [("", AUTO[dtype])] if make_config().prefetches(dtype, 128, 16, "auto", kernel) else []


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
    assert prefetches(ptx) == NONE
    assert "cp.async.bulk" not in ptx


#: uniform settings with fp16 inline (no shipped rule table): every dtype prefetches
_U = {"inherit_rules": False, "fp16": "scope=kv-head,issue=inline"}


@pytest.mark.parametrize(
    "options, expected",
    [
        # one K and one V tile: 16 * 128 * sizeof(cache_t); the shipped table: where it turns the
        # prefetch on (issue=split: inline asm in the loop; issue=call: one instruction in the helper)
        ({}, default_expected),
        ({"preset": "paper"}, lambda d: [("", "4096")] * 2),
        ({"caches": "k", **_U}, lambda d: [("", AUTO[d])]),
        ({"lookahead": 2, "size": 8192, "align": 128, **_U}, lambda d: [("", "8192")] * 2),
        ({"cache_hint": "evict_last", **_U}, lambda d: [(".L2::cache_hint", AUTO[d])] * 2),
        ({"placement": "end", "scope": "kv-head", **_U}, lambda d: [("", AUTO[d])] * 2),
        ({"control": True, **_U}, lambda d: [("", AUTO[d])] * 2),  # compiled in, never executed
        ({"read": "warp", "min_group": 2, "min_ctas": 64, **_U}, lambda d: [("", AUTO[d])] * 2),
        ({"read": "warp", "scope": "kv-head", "min_kv_mib": 64, **_U, "fp16": "none"}, lambda d: [("", AUTO[d])] * 2),
        ({"scope": "kv-head-rotate", "min_group": 2, **_U}, lambda d: [("", AUTO[d])] * 2),
    ],
    ids=[
        "default",
        "paper",
        "caches-k",
        "lookahead2-size8192-align128",
        "evict-last",
        "end-kv-head",
        "control",
        "read-warp-gates",
        "min-kv-mib",
        "kv-head-rotate",
    ],
)
def test_sm90a_ptx_has_the_prefetch(options: dict, expected, tree: Path, stock: str, nvcc_ptx) -> None:
    ptx = nvcc_ptx(tree / "csrc", patched(tree, stock, **options), "sm_90a")
    found = prefetches(ptx)
    assert distinct(found) == distinct(each(expected)) != NONE
    if options:  # fp16 issues its prefetches inline in these (and in the paper's): one per loop
        assert found[("v1", "fp16")] == found[("v2", "fp16")] == expected("fp16")
    if options.get("cache_hint"):
        policies = re.findall(r"createpolicy\.fractional\.L2::evict_last\.b64 %rd\d+, 1\.0;", ptx)
        assert len(policies) == ptx.count("cp.async.bulk.prefetch.L2.global.L2::cache_hint") > 0


@pytest.mark.parametrize("options", [{}, {"preset": "paper"}, {"read": "warp", **_U}, {"scope": "kv-head-rotate", **_U}],
                         ids=["default", "paper", "read-warp", "kv-head-rotate"])  # fmt: skip
def test_sm80_builds_without_the_prefetch(options: dict, tree: Path, stock: str, nvcc_ptx) -> None:
    ptx = nvcc_ptx(tree / "csrc", patched(tree, stock, **options), "sm_80")
    assert prefetches(ptx) == NONE
    assert "cp.async.bulk" not in ptx


@pytest.mark.parametrize("arch", ["sm_100", "sm_120"])
def test_blackwell_compiles_stocks_code(arch: str, tree: Path, stock: str, nvcc_ptx) -> None:
    """The prefetch (and the key loop's split) is Hopper device code: on the Blackwell archs vLLM
    builds, the shipped configuration's kernels are stock's PTX, character for character."""
    assert nvcc_ptx(tree / "csrc", patched(tree, stock), arch) == nvcc_ptx(tree / "csrc", stock, arch)


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
    found = prefetches(ptx)
    assert distinct(found) == distinct(each(default_expected))
    # the paper preset issues fp16's prefetches inline: one per loop, on the reformatted text too
    ptx = nvcc_ptx(tree / "csrc", patch(reformatted, str(tree / HEADER), make_config(preset="paper")).patched, "sm_90a")
    assert prefetches(ptx)[("v1", "fp16")] == prefetches(ptx)[("v2", "fp16")] == [("", "4096")] * 2
