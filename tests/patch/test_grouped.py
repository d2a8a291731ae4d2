"""``group`` > 1: the grouped form of the kernel (templates/inject/grouped.cuh.j2), for kvpatch's own
launchers: what goes into the header, what each instantiation is told, what the launcher does with
it, that vLLM's own kernels compile exactly as before, and (with nvcc) that it compiles for every
arch a vLLM build targets."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import pytest
from conftest import fixture_text

from kvpatch.config import make_config
from kvpatch.patch import patch, unpatch
from kvpatch.patch.plan import branch_condition, group_values
from kvpatch.source.releases import HEADER

HEADER_PATH = "/tmp/vllm/" + HEADER
BF16_128 = "kvpatch_is_same<scalar_t, __nv_bfloat16>::value && HEAD_SIZE == 128"


@pytest.fixture(scope="module")
def sites():
    from kvpatch.patch.sites import find_sites

    return find_sites(fixture_text(), HEADER_PATH)


def _values(cfg, sites) -> dict[str, str]:
    branches = [(None if sel is None else branch_condition(sel, sites), c) for sel, c in cfg.variants()]
    return group_values(branches, cfg)


def test_each_instantiation_is_told_its_group_by_the_rules_first_match(sites) -> None:
    base = dict(inherit_rules=False, quantized="prefetch")
    assert _values(make_config(**base), sites) == {"heads": "1", "min_ctas": "1", "ctas_per_sm": "0", "half_below": "2",
                                                   "fit_ctas": "0", "logits": "0", "v_loads": "0",
                                                   "k_loads": "0", "lookahead": "1"}  # fmt: skip
    assert _values(
        make_config(
            **base,
            group=4,
            group_min_ctas=264,
            group_ctas_per_sm=4,
            group_half_below=4,
            group_fit_ctas=6,
            group_logits="auto",
            group_v_loads="ahead",
            group_k_loads="ahead",
        ),
        sites,
    ) == {
        "heads": "4",
        "min_ctas": "264",
        "ctas_per_sm": "4",
        "half_below": "4",
        "fit_ctas": "6",
        "logits": "2",
        "v_loads": "1",
        "k_loads": "1",
        "lookahead": "1",
    }
    # a rule: bf16 head 128 groups by 2, every other kernel keeps one CTA per head
    got = _values(make_config(**base, rules={"bf16/128": "group=2"}), sites)
    assert got["heads"] == f"({BF16_128}) ? 2 : 1"
    # the more specific rule wins; a rule that gives what the rest gives adds nothing
    got = _values(make_config(**base, group=4, rules={"bf16": "group=2", "bf16/128": "group=4"}), sites)
    assert got["heads"] == f"({BF16_128}) ? 4 : (kvpatch_is_same<scalar_t, __nv_bfloat16>::value) ? 2 : 4"
    # off turns the prefetch off, not the grouping: the grouped form then does not prefetch
    got = _values(make_config(**base, group=2, rules={"bf16/128": "off"}), sites)
    assert got == {"heads": "2", "min_ctas": "1", "ctas_per_sm": "0", "half_below": "2", "fit_ctas": "0",
                   "logits": "0", "v_loads": "0", "k_loads": "0", "lookahead": f"({BF16_128}) ? 0 : 1"}  # fmt: skip
    # an off rule may give the grouping itself, its launch bounds, half-group, fit, logits, K and V loads included
    got = _values(make_config(**base, rules={"bf16/128": "off,group=4,group-min-ctas=256,group-ctas-per-sm=4,"
                                                          "group-half-below=0,group-fit-ctas=6,group-logits=global,"
                                                          "group-v-loads=ahead,group-k-loads=ahead"}),
                  sites)  # fmt: skip
    assert got == {"heads": f"({BF16_128}) ? 4 : 1", "min_ctas": f"({BF16_128}) ? 256 : 1",
                   "ctas_per_sm": f"({BF16_128}) ? 4 : 0", "half_below": f"({BF16_128}) ? 0 : 2",
                   "fit_ctas": f"({BF16_128}) ? 6 : 0", "logits": f"({BF16_128}) ? 1 : 0",
                   "v_loads": f"({BF16_128}) ? 1 : 0", "k_loads": f"({BF16_128}) ? 1 : 0",
                   "lookahead": f"({BF16_128}) ? 0 : 1"}  # fmt: skip


@pytest.mark.network
def test_the_grouped_form_goes_into_the_header_only_when_a_kernel_groups(release) -> None:
    """(A real release: the grouped form names vLLM's helpers, which the fixture's includes lack.)"""
    path = str(release / HEADER)
    stock = (release / HEADER).read_text(encoding="utf-8")
    assert patch(stock, path, make_config()).patched.count("__device__ void kvpatch_grouped_attention(") == 1
    plain = patch(stock, path, make_config(group=1, group_min_ctas=1)).patched  # the shipped table, ungrouped
    assert "kvpatch_grouped_attention" not in plain and "kvpatch_group" not in plain
    grouped = patch(stock, path, make_config(group=4)).patched
    assert grouped.count("__device__ void kvpatch_grouped_attention(") == 1
    assert grouped.count("__global__ void kvpatch_grouped_v1_kernel(") == 1
    assert grouped.count("__global__ void kvpatch_grouped_v2_kernel(") == 1
    assert "static constexpr int heads() { return plain ? (4) : 1; }" in grouped
    # only a rule's kernels group: the form is there, and the other kernels are told 1
    ruled = patch(stock, path, make_config(rules={"fp16/64/16": "group=2"})).patched
    assert "kvpatch_grouped_attention" in ruled and ": 1) : 1; }" in ruled
    # an off rule that keeps the grouping: no prefetch there, and the form is still in the header
    off = patch(stock, path, make_config(inherit_rules=False, rules={"fp16/64/16": "off,group=2"})).patched
    assert "kvpatch_grouped_attention" in off and ": 1) : 1; }" in off
    # it is all inside kvpatch's regions: removing them gives the stock header back
    assert unpatch(grouped, path)[0] == stock
    assert "group=4" in grouped and "group=4" not in plain


@pytest.mark.network
def test_the_launcher_launches_the_grouped_form_only_for_a_grouped_header(release) -> None:
    from kvpatch.jit.plan import GROUPED_SYMBOL, launcher_sources
    from kvpatch.jit.signatures import kernel_signatures
    from kvpatch.jit.spec import KernelConfig, Variant

    stock = (release / HEADER).read_text(encoding="utf-8")
    configs = [KernelConfig("bf16", "auto", 128, 16)]
    for cfg, grouped in ((make_config(group=1), False), (make_config(group=4), True), (make_config(), True)):
        header = patch(stock, str(release / HEADER), cfg).patched
        assert (GROUPED_SYMBOL in header) is grouped
        form, *apart = launcher_sources(Variant("v", header), kernel_signatures(header, str(release / HEADER)), configs)
        # vLLM's form asks the grouped form's own unit first; its unit never instantiates it
        assert len(apart) == (1 if grouped else 0) and "launch_grouped<" not in form
        assert ("grouped0_v1(a, dtype, kv_cache_dtype)" in form) is grouped
        assert ("grouped0_v2(a, dtype, kv_cache_dtype, max_num_partitions)" in form) is grouped
        src = "".join(apart)
        assert ("launch_grouped<__nv_bfloat16, __nv_bfloat16, 128, 16, 0>(a, 1)" in src) is grouped
        assert ("launch_grouped<__nv_bfloat16, __nv_bfloat16, 128, 16, kPartitionSize>" in src) is grouped
        # what falls back to the stock form: ALiBi, a group that is not a multiple, too few CTAs
        assert ("a.alibi_slopes != nullptr" in src) is grouped
        assert ("ctas < Group::min_ctas()" in src) is grouped


def test_a_header_without_what_the_grouped_form_calls_gets_no_grouped_form(tmp_path: Path) -> None:
    """Before: a header that lacks vLLM's helpers (the fixture: no Vec, mul, block_sum, shuffles).
    After ``group = 4``: the prefetch as always, no grouped form (its calls would not compile),
    the injection intact and stripped back to stock; apply says so where the user asked for
    grouping, and says nothing of it with the shipped table (which groups where it can)."""
    from cli.cli_helpers import run_cli
    from conftest import make_tree

    from kvpatch.patch import find_sites, inspect
    from kvpatch.patch.sites import GROUP_NEEDS

    stock = fixture_text()
    missing = find_sites(stock, HEADER_PATH).group_missing
    assert "mul" in missing and "block_sum" in missing and "WARP_SIZE" not in missing
    assert set(missing) <= set(GROUP_NEEDS)
    cfg = make_config(group=4)
    assert cfg.uses_group
    patched = patch(stock, HEADER_PATH, cfg).patched
    assert "kvpatch_grouped_attention" not in patched and "kvpatch_group" not in patched
    assert "// kvpatch:begin key " in patched and "group=4" in patched
    assert inspect(patched, HEADER_PATH).intact and unpatch(patched, HEADER_PATH)[0] == stock
    tree = make_tree(tmp_path / "vllm", stock)
    work = tmp_path / "work"
    work.mkdir()
    asked = run_cli("apply", "--tree", str(tree), "--group", "4", cwd=work)
    assert asked.returncode == 0, asked.stderr
    assert asked.stderr.startswith("note: the header lacks what the grouped form calls (Vec, FloatVec, Qk_dot")
    shipped = run_cli("apply", "--tree", str(tree), cwd=work)
    assert shipped.returncode == 0 and shipped.stderr == "", shipped.stderr


@pytest.fixture
def release(vllm_release: Callable[[str], Path]) -> Path:
    """vLLM 0.10.2's tree (fetched into the release cache once): the fixture header has no
    kernels to launch, and lacks the includes that define the helpers the grouped form calls."""
    return vllm_release("0.10.2")


# --------------------------------------------------------------------------- nvcc


def nvcc_on_a_release(test: Callable) -> Callable:
    for mark in (pytest.mark.slow, pytest.mark.nvcc, pytest.mark.network,
                 pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")):  # fmt: skip
        test = mark(test)
    return test


STOCK_TU = """\
#include <cstdint>
#include "attention_kernels.cuh"
void* kvpatch_test_kernels[] = {
  (void*)&vllm::paged_attention_v1_kernel<uint16_t, uint16_t, 128, 16, 128, vllm::Fp8KVCacheDataType::kAuto, false>,
  (void*)&vllm::paged_attention_v2_kernel<__nv_bfloat16, __nv_bfloat16, 64, 32, 128,
                                          vllm::Fp8KVCacheDataType::kAuto, false, 512>,
};
"""

GROUPED_TU = """\
#include <cstdint>
#include "attention_kernels.cuh"
void* kvpatch_test_kernels[] = {
  (void*)&vllm::kvpatch_grouped_v1_kernel<__nv_bfloat16, __nv_bfloat16, 128, 16, 128, 4, 1>,
  (void*)&vllm::kvpatch_grouped_v2_kernel<uint16_t, uint16_t, 256, 32, 128, 2, 1, 512>,
  (void*)&vllm::kvpatch_grouped_v1_kernel<float, float, 64, 8, 128, 8, 0>,
  (void*)&vllm::kvpatch_grouped_v1_bounded_kernel<__nv_bfloat16, __nv_bfloat16, 128, 16, 128, 4, 1, 4>,
  (void*)&vllm::kvpatch_grouped_v2_bounded_kernel<uint16_t, uint16_t, 128, 32, 128, 4, 1, 512, 3>,
};
static_assert(vllm::kvpatch_group<__nv_bfloat16, __nv_bfloat16, 128, 16, 0>::heads() == 4, "");
static_assert(vllm::kvpatch_group<__nv_bfloat16, uint8_t, 128, 16, 0>::heads() == 1, "fp8 caches never group");
"""


def _compile(tmp: Path, csrc: Path, header: str, tu: str, targets: list[str], what: str = "-ptx") -> str:
    from kvpatch.jit import stub_headers, vllm_nvcc_flags

    tmp.mkdir(parents=True)
    for name, text in stub_headers().items():
        (tmp / "stubs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "stubs" / name).write_text(text)
    (tmp / "attention_kernels.cuh").write_text(header, encoding="utf-8")
    (tmp / "tu.cu").write_text(tu)
    out = tmp / ("tu.ptx" if what == "-ptx" else "tu.o")
    cmd = [shutil.which("nvcc"), *vllm_nvcc_flags(), what, *targets, f"-I{tmp}", f"-I{csrc / 'attention'}",
           f"-I{csrc}", f"-I{tmp / 'stubs'}", str(tmp / "tu.cu"), "-o", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out.read_text() if what == "-ptx" else ""


@nvcc_on_a_release
def test_grouping_leaves_vllms_kernels_exactly_as_they_compile_without_it(
    vllm_release: Callable[[str], Path], tmp_path: Path
) -> None:
    tree = vllm_release("0.10.2")
    stock = (tree / HEADER).read_text(encoding="utf-8")
    csrc, sm90 = tree / "csrc", ["-gencode=arch=compute_90a,code=sm_90a"]
    without = patch(stock, str(tree / HEADER), make_config()).patched
    with_group = patch(stock, str(tree / HEADER), make_config(group=4)).patched
    assert without != with_group
    assert _compile(tmp_path / "a", csrc, with_group, STOCK_TU, sm90) == _compile(
        tmp_path / "b", csrc, without, STOCK_TU, sm90
    )


@nvcc_on_a_release
def test_the_grouped_form_compiles_for_every_arch_vllm_builds(
    vllm_release: Callable[[str], Path], tmp_path: Path
) -> None:
    """Every arch nvcc 13 still compiles of those vLLM's CUDA builds target (7.5 up), as PTX, and
    sm_90a through ptxas; fp8 caches are told not to group (a static_assert)."""
    tree = vllm_release("0.10.2")
    stock = (tree / HEADER).read_text(encoding="utf-8")
    header = patch(stock, str(tree / HEADER), make_config(group=4)).patched
    archs = ("75", "80", "86", "89", "90", "100", "120")
    targets = [f"-gencode=arch=compute_{a},code=compute_{a}" for a in archs]
    targets.append("-gencode=arch=compute_90a,code=sm_90a")
    _compile(tmp_path / "g", tree / "csrc", header, GROUPED_TU, targets, what="-c")


LOADS_TU = """\
#include <cstdint>
#include "attention_kernels.cuh"
void* kvpatch_test_kernels[] = {
  (void*)&vllm::kvpatch_grouped_v2_kernel<__nv_bfloat16, __nv_bfloat16, 128, 16, 128, 4, 1, 512>,
  (void*)&vllm::kvpatch_grouped_v2_kernel<uint16_t, uint16_t, 128, 16, 128, 4, 1, 512>,
};
"""


def _global_loads(ptx: str) -> dict[str, list[str]]:
    """Per kernel of a PTX file (by its dtype's mangled name), its global loads' widths, in order."""
    out: dict[str, list[str]] = {}
    for body in ptx.split(".entry ")[1:]:
        name = "bf16" if "__nv_bfloat16" in body.split("(", 1)[0] else "fp16"
        out[name] = re.findall(r"ld\.global(?:\.nc)?((?:\.v[24])?\.[busf](?:8|16|32|64))", body)
    return out


@nvcc_on_a_release
def test_the_grouped_form_loads_bf16_as_wide_as_fp16(vllm_release: Callable[[str], Path], tmp_path: Path) -> None:
    """Before: the cache vectors of bf16 (structs of bf16 pairs, aligned to 4 bytes) were loaded 4
    bytes at a time, where fp16's (uint2, uint4) load whole. After: both dtypes' grouped kernels
    make the same global loads, vector for vector."""
    tree = vllm_release("0.10.2")
    stock = (tree / HEADER).read_text(encoding="utf-8")
    header = patch(stock, str(tree / HEADER), make_config(group=4)).patched
    loads = _global_loads(
        _compile(tmp_path / "l", tree / "csrc", header, LOADS_TU, ["-gencode=arch=compute_90a,code=sm_90a"])
    )
    assert loads["bf16"] == loads["fp16"]
    assert ".v4.u32" in loads["bf16"] and ".v2.u32" in loads["bf16"]
