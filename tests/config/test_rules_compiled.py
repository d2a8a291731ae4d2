"""How rules compile: the condition each rule's block is chosen by (the kernel's own template
parameters), the ``issue=split`` branch, and (with nvcc) that an ``off`` kernel compiles to
stock's exact PTX while the rules that select a kernel change only that kernel."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from kvpatch.config import make_config
from kvpatch.patch import patch
from kvpatch.patch.plan import branch_condition
from kvpatch.source.releases import HEADER


def nvcc_on_a_release(test: Callable) -> Callable:
    """Compiled with nvcc, against a real release (fetched into the cache)."""
    for mark in (pytest.mark.slow, pytest.mark.nvcc, pytest.mark.network,
                 pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")):  # fmt: skip
        test = mark(test)
    return test


def test_branch_conditions_use_the_kernels_template_parameters(stock_sites) -> None:
    assert branch_condition("bf16/80/32", stock_sites) == (
        "kvpatch_is_same<scalar_t, __nv_bfloat16>::value && HEAD_SIZE == 80 && BLOCK_SIZE == 32"
    )
    assert (
        branch_condition("*/*/16/fp8", stock_sites) == "BLOCK_SIZE == 16 && !kvpatch_is_same<cache_t, scalar_t>::value"
    )
    assert branch_condition("fp32/*/*/auto", stock_sites) == (
        "kvpatch_is_same<scalar_t, float>::value && kvpatch_is_same<cache_t, scalar_t>::value"
    )
    assert branch_condition("*/*/*/*/v1", stock_sites) == "PARTITION_SIZE == 0"
    assert branch_condition("fp16/256/16/*/v2", stock_sites) == (
        "kvpatch_is_same<scalar_t, uint16_t>::value && HEAD_SIZE == 256 && BLOCK_SIZE == 16 && PARTITION_SIZE != 0"
    )


@pytest.fixture(scope="module")
def stock_sites():
    from conftest import fixture_text

    from kvpatch.patch.sites import find_sites

    return find_sites(fixture_text(), "/tmp/vllm/" + HEADER)


# --------------------------------------------------------------------------- nvcc: off means stock


TU = """\
#include <cstdint>
#include "attention_kernels.cuh"
void* kvpatch_test_kernels[] = {
  (void*)&vllm::paged_attention_v1_kernel<__nv_bfloat16, __nv_bfloat16, HEAD, BLOCK, 128,
                                          vllm::Fp8KVCacheDataType::kAuto, false>,
  (void*)&vllm::paged_attention_v2_kernel<__nv_bfloat16, __nv_bfloat16, HEAD, BLOCK, 128,
                                          vllm::Fp8KVCacheDataType::kAuto, false, 512>,
};
"""


def _ptx(tmp: Path, csrc: Path, header: str, head: int, block: int) -> str:
    tmp.mkdir(parents=True)
    from kvpatch.jit import stub_headers, vllm_nvcc_flags

    for name, text in stub_headers().items():
        (tmp / "stubs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "stubs" / name).write_text(text)
    (tmp / "attention_kernels.cuh").write_text(header, encoding="utf-8")
    (tmp / "tu.cu").write_text(TU.replace("HEAD", str(head)).replace("BLOCK", str(block)))
    cmd = [shutil.which("nvcc"), *vllm_nvcc_flags(), "-ptx", "-gencode=arch=compute_90a,code=sm_90a",
           f"-I{tmp}", f"-I{csrc / 'attention'}", f"-I{csrc}", f"-I{tmp / 'stubs'}", str(tmp / "tu.cu"),
           "-o", str(tmp / "tu.ptx")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return (tmp / "tu.ptx").read_text()


@nvcc_on_a_release
def test_an_off_instantiation_compiles_to_stocks_exact_ptx(vllm_release: Callable[[str], Path], tmp_path: Path) -> None:
    tree = vllm_release("0.10.2")
    stock = (tree / HEADER).read_text(encoding="utf-8")
    patched = patch(stock, str(tree / HEADER), make_config(bf16="none", rules={"bf16/80/32": "off"})).patched
    csrc = tree / "csrc"
    off_stock = _ptx(tmp_path / "s80", csrc, stock, 80, 32)
    off_patched = _ptx(tmp_path / "p80", csrc, patched, 80, 32)
    assert "cp.async.bulk.prefetch" not in off_patched
    assert off_patched == off_stock  # bf16/80/32 is off: not one instruction differs
    on_patched = _ptx(tmp_path / "p16", csrc, patched, 80, 16)  # the same dtype and head, block 16: prefetches
    assert (
        re.search(r"call\.uni[^;]*kvpatch_prefetch_l2", on_patched.replace("\n", " "))
        or "cp.async.bulk.prefetch" in on_patched
    )


def _entries(ptx: str) -> dict[str, str]:
    """PTX text per kernel entry: ``{'v1': ..., 'v2': ...}`` (the mangled names hold the kernel's name)."""
    out = {}
    for chunk in ptx.split(".entry ")[1:]:
        name = chunk.split("(", 1)[0]
        out["v1" if "paged_attention_v1_kernel" in name else "v2"] = chunk
    return out


@nvcc_on_a_release
def test_a_kernel_rule_prefetches_in_one_kernel_only(vllm_release: Callable[[str], Path], tmp_path: Path) -> None:
    """``bf16/128/16/auto/v1=off`` with bf16 on: v1 compiles as stock's v1, v2 prefetches (inline asm, so the
    instruction sits in the v2 entry itself)."""
    tree = vllm_release("0.10.2")
    stock = (tree / HEADER).read_text(encoding="utf-8")
    cfg = make_config(bf16="issue=inline", rules={"bf16/128/16/auto/v1": "off"})
    patched = patch(stock, str(tree / HEADER), cfg).patched
    csrc = tree / "csrc"
    got = _entries(_ptx(tmp_path / "p", csrc, patched, 128, 16))
    want = _entries(_ptx(tmp_path / "s", csrc, stock, 128, 16))
    assert "cp.async.bulk.prefetch" not in got["v1"] and got["v1"] == want["v1"]
    assert "cp.async.bulk.prefetch" in got["v2"]


def test_split_condition_follows_the_rules_first_match(stock_sites) -> None:
    from kvpatch.patch.plan import split_condition

    def cond(cfg):
        branches = [(None if sel is None else branch_condition(sel, stock_sites), c) for sel, c in cfg.variants()]
        return split_condition(branches, cfg, stock_sites)

    bf16_128 = "kvpatch_is_same<scalar_t, __nv_bfloat16>::value && HEAD_SIZE == 128 && BLOCK_SIZE == 16"
    assert cond(make_config(inherit_rules=False, issue="split", quantized="prefetch")) == "true"
    assert (
        cond(make_config(inherit_rules=False, issue="split")) == "kvpatch_is_same<cache_t, scalar_t>::value && (true)"
    )
    assert cond(make_config(inherit_rules=False, quantized="prefetch", rules={"bf16/128/16": "issue=split"})) == (
        f"({bf16_128}) ? true : false"
    )
    # a more specific rule that turns it off wins over a less specific split
    assert cond(
        make_config(inherit_rules=False, quantized="prefetch", rules={"bf16": "issue=split", "bf16/128/16": "off"})
    ) == (f"({bf16_128}) ? false : (kvpatch_is_same<scalar_t, __nv_bfloat16>::value) ? true : false")
    # the shipped table: bf16 block 16, every head size it tuned, v1 and v2, unquantized cache
    shipped = cond(make_config())
    assert shipped.startswith("kvpatch_is_same<cache_t, scalar_t>::value && (") and shipped.endswith("? true : false)")
    assert shipped.count("? true") == 6 and "fp16" not in shipped.replace("__nv_bfloat16", "")
    assert cond(make_config(bf16="off", rules="none")) == "kvpatch_is_same<cache_t, scalar_t>::value && (false)"


def test_split_needs_the_alibi_slope(stock_sites) -> None:
    """A kernel without ALiBi (the fixture with its slope taken out): issue=split, which the
    shipped table uses, refuses it in one line that says what to do; the other forms patch."""
    from conftest import fixture_text

    from kvpatch.errors import PatchError

    assert stock_sites.alibi_var == "alibi_slope"
    text = fixture_text()
    decl = "  const float alibi_slope =\n      alibi_slopes == nullptr ? 0.f : alibi_slopes[head_idx];\n"
    use = "      qk += (alibi_slope != 0)\n"
    assert text.count(decl) == 1 and text.count(use) == 1
    no_alibi = text.replace(decl, "").replace(use, "      qk += (head_idx != 0)\n").replace("alibi_slope *", "1.f *")
    assert "alibi_slope " not in no_alibi
    for cfg in (make_config(inherit_rules=False, issue="split"), make_config()):
        with pytest.raises(
            PatchError, match="issue=split: no variable initialised from the kernel's alibi_slopes"
        ) as e:
            patch(no_alibi, "/tmp/vllm/" + HEADER, cfg)
        assert "\n" not in str(e.value) and "--rule 'bf16/128/16/auto/v1=issue=call'" in str(e.value)
    patch(no_alibi, "/tmp/vllm/" + HEADER, make_config(inherit_rules=False, issue="inline"))


@pytest.mark.slow
@pytest.mark.network
def test_a_split_copy_that_is_not_stocks_loop_is_refused(vllm_release: Callable[[str], Path]) -> None:
    from kvpatch.errors import PatchError
    from kvpatch.patch.header import verify
    from kvpatch.patch.parse import parse_header

    tree = vllm_release("0.10.2")
    stock = (tree / HEADER).read_text(encoding="utf-8")
    cfg = make_config(inherit_rules=False, issue="split")
    good = patch(stock, str(tree / HEADER), cfg).patched
    parsed = parse_header(stock, str(tree / HEADER))
    verify(parsed, good, cfg)
    at = good.index("// ALiBi: stock's loop, no prefetch")
    at = good.index("static_cast<int64_t>(block_table[block_idx]);", at) + len(
        "static_cast<int64_t>(block_table[block_idx]);"
    )
    tampered = good[:at] + ' asm volatile("");' + good[at:]
    with pytest.raises(PatchError, match="copy of the key loop is not stock's loop"):
        verify(parsed, tampered, cfg)
    with pytest.raises(PatchError, match="split copy is missing"):
        verify(parsed, patch(stock, str(tree / HEADER), make_config(inherit_rules=False, issue="inline")).patched, cfg)


def _ffma(tmp: Path, csrc: Path, header: str, head: int = 128, block: int = 16) -> dict[str, int]:
    """FFMA instructions per kernel in the SASS (ptxas, not the PTX: they differ by one)."""
    from kvpatch.jit.toolchain import find_cuda_tool

    nvcc = Path(shutil.which("nvcc") or "nvcc")
    ptxas, cuobjdump = find_cuda_tool("ptxas", nvcc), find_cuda_tool("cuobjdump", nvcc)
    if ptxas is None or cuobjdump is None:
        pytest.skip("ptxas or cuobjdump not found beside nvcc")
    _ptx(tmp, csrc, header, head, block)
    cubin = tmp / "tu.cubin"
    subprocess.run([str(ptxas), "-arch=sm_90a", "-O3", str(tmp / "tu.ptx"), "-o", str(cubin)], check=True)
    sass = subprocess.run([str(cuobjdump), "--dump-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip
    out = {}
    for chunk in sass.split("Function : ")[1:]:
        name = chunk.split("\n", 1)[0]
        out["v1" if "paged_attention_v1_kernel" in name else "v2"] = len(re.findall(r"\bFFMA\b", chunk))
    assert set(out) == {"v1", "v2"}, sorted(out)
    return out


@nvcc_on_a_release
def test_split_keeps_stocks_unswitched_loop_and_folds_away_where_off(vllm_release: Callable[[str], Path],
                                                                       tmp_path: Path) -> None:  # fmt: skip
    """bf16 head 128 block 16: stock's key loop is unswitched on the ALiBi slope (two copies
    of its fma); inline asm in the loop stops that (and rounds the ALiBi term differently);
    issue=split compiles to stock's fma again with the prefetch in both kernels. Where no
    rule says split, the branch folds away: the PTX is exactly what it is without it."""
    tree = vllm_release("0.10.2")
    stock = (tree / HEADER).read_text(encoding="utf-8")
    csrc = tree / "csrc"

    def text(cfg) -> str:
        return patch(stock, str(tree / HEADER), cfg).patched if cfg else stock

    def ptx(name: str, cfg, head: int = 128, block: int = 16) -> str:
        return _ptx(tmp_path / name, csrc, text(cfg), head, block)

    split_cfg = make_config(inherit_rules=False, issue="split")
    want = _ffma(tmp_path / "s-stock", csrc, text(None))
    assert _ffma(tmp_path / "s-split", csrc, text(split_cfg)) == want
    assert _ffma(tmp_path / "s-inline", csrc, text(make_config(inherit_rules=False, issue="inline"))) != want
    assert all("cp.async.bulk.prefetch" in body for body in _entries(ptx("split", split_cfg)).values())
    base = make_config(bf16="none", inherit_rules=False)
    folded = ptx("folded", make_config(bf16="none", inherit_rules=False, rules={"bf16/80/32": "issue=split"}))

    def same(text: str) -> str:  # the TU-content hash in internal symbol names
        return re.sub(r"_INTERNAL_[0-9a-f]{8}_", "_INTERNAL_", text)

    assert same(folded) == same(ptx("base", base))
