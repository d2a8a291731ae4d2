"""kvpatch.jit.plan and .flags: a spec planned into every file and nvcc command line of each
variant, keyed by their content; the header's include closure; vLLM's own compile flags."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from jit_helpers import ALL_DTYPES, needs_release, tree_0102, variants_0102  # noqa: F401  (fixtures)

from kvpatch.jit import HEADER, Arch, Toolchain, make_spec, plan, source_closure, stub_headers, vllm_nvcc_flags

#: A toolchain that is never run: planning reads only its version line.
NVCC_13 = Toolchain(Path("/opt/cuda/bin/nvcc"), "Cuda compilation tools, release 13.0, V13.0.88", ("compute_90",))


@pytest.fixture(scope="module")
def spec_9a(tree_0102, variants_0102):
    return make_spec(tree_0102, variants_0102, "9.0a", dtypes=ALL_DTYPES, head_sizes=[64])


@needs_release
def test_source_closure(tree_0102):
    files = source_closure(
        tree_0102 / "csrc", '// the variant\n#include "attention_dtypes.h"\n#include "../cuda_compat.h"\n'
    )
    assert files["attention/attention_kernels.cuh"].startswith("// the variant")
    assert {"attention/attention_dtypes.h", "attention/dtype_fp8.cuh", "cuda_compat.h"} <= set(files)
    assert "attention/paged_attention_v1.cu" not in files
    real = source_closure(tree_0102 / "csrc", (tree_0102 / HEADER).read_text())
    assert "quantization/fp8/nvidia/quant_utils.cuh" in real


@needs_release
def test_plan_is_content_keyed(spec_9a, tmp_path):
    a, b = plan(spec_9a, cache=tmp_path, tc=NVCC_13)
    assert a.key != b.key and a.dir.parent == tmp_path / "builds"
    assert [p.key for p in plan(spec_9a, cache=tmp_path, tc=NVCC_13)] == [a.key, b.key]
    other = plan(replace(spec_9a, archs=(Arch(8, 0),)), cache=tmp_path, tc=NVCC_13)
    assert other[0].key != a.key
    newer = replace(NVCC_13, version="Cuda compilation tools, release 13.1, V13.1.80")
    assert plan(spec_9a, cache=tmp_path, tc=newer)[0].key != a.key  # another nvcc builds another library
    assert "-Dvllm=kvpatch_stock" in a.compile_flags and "-Dvllm=kvpatch_patched" in b.compile_flags
    # one flag set whatever the configurations: vLLM's own, -DENABLE_FP8 included
    fp8 = plan(replace(spec_9a, kv_cache_dtypes=("fp8",)), cache=tmp_path, tc=NVCC_13)[0]
    assert fp8.key != a.key and a.compile_flags == fp8.compile_flags
    assert a.compile_flags[: len(vllm_nvcc_flags())] == vllm_nvcc_flags()
    assert dict(a.files)["stubs/torch/all.h"] == dict(fp8.files)["stubs/torch/all.h"]
    assert not tmp_path.joinpath("builds").exists()  # planning writes nothing


def test_vllm_nvcc_flags_are_vllms():
    flags = vllm_nvcc_flags()
    assert flags == ("-std=c++17", "-O2", "-g", "-DNDEBUG", "--expt-relaxed-constexpr", "-DENABLE_FP8")
    assert not any(f.startswith("-D__CUDA_NO_") for f in flags) and "--use_fast_math" not in flags
    assert "Float8_e4m3fn" in stub_headers()["torch/all.h"]
