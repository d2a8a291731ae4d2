"""kvpatch.jit.signatures and the launchers: each release's kernel parameters read from its
header with libclang, and launchers that call the kernels as that release wants."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from jit_helpers import needs_release, tree_0102, tree_064  # noqa: F401  (fixtures)

from kvpatch.errors import BuildError
from kvpatch.jit import (
    HEADER,
    KernelConfig,
    KernelSignature,
    Param,
    Variant,
    call_arguments,
    kernel_signatures,
    launcher_sources,
    scale_by_value,
    template_arguments,
)


@needs_release
def test_kernel_parameters_differ_between_releases(tree_064, tree_0102):
    old = kernel_signatures((tree_064 / HEADER).read_text(), tree_064 / HEADER)
    new = kernel_signatures((tree_0102 / HEADER).read_text(), tree_0102 / HEADER)
    for sigs in (old, new):
        assert sorted(sigs) == ["reduce", "v1", "v2"]
        assert sigs["v2"].template_params[-1] == "PARTITION_SIZE"
    assert old["v1"].param("k_scale") == Param("k_scale", "const float", False)
    assert new["v1"].param("k_scale") == Param("k_scale", "const float *", True)
    assert "a.k_scale" in call_arguments(old["v2"]) and "a.v_scale" in call_arguments(old["v2"])
    assert "a.k_scale_ptr" in call_arguments(new["v2"]) and "a.v_scale_ptr" in call_arguments(new["v2"])
    assert scale_by_value(old) and not scale_by_value(new)


def test_unknown_kernel_parameter_is_refused():
    sig = KernelSignature(
        "paged_attention_v1_kernel",
        ("scalar_t",),
        (Param("out", "scalar_t *", True), Param("sinks", "const float *", True)),
    )
    with pytest.raises(BuildError, match="does not know: const float \\* sinks"):
        call_arguments(sig)
    with pytest.raises(BuildError, match="cannot fill: NEW_PARAM"):
        template_arguments(replace(sig, template_params=("scalar_t", "NEW_PARAM")))


@needs_release
def test_launcher_calls_the_kernel_as_the_release_wants(tree_0102):
    header = (tree_0102 / HEADER).read_text()
    sigs = kernel_signatures(header, tree_0102 / HEADER)
    (src,) = launcher_sources(Variant("stock", header), sigs, [KernelConfig("fp16", "auto", 128, 16)])
    assert (
        "auto kernel = vllm::paged_attention_v1_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, kNumThreads, KV_DTYPE, false>;"
        in src
    )
    assert (
        """\
  kernel<<<grid, block, shared_mem_size, a.stream>>>(
      reinterpret_cast<T*>(a.out),
      reinterpret_cast<const T*>(a.query),
      reinterpret_cast<const CACHE_T*>(a.key_cache),
      reinterpret_cast<const CACHE_T*>(a.value_cache),
      a.num_kv_heads,
      a.scale,
      a.block_tables,
      a.seq_lens,
      a.max_num_blocks_per_seq,
      a.alibi_slopes,
      a.q_stride,
      a.kv_block_stride,
      a.kv_head_stride,
      a.k_scale_ptr,
      a.v_scale_ptr,
      /* tp_rank */ 0,
      /* blocksparse_local_blocks */ 0,
      /* blocksparse_vert_stride */ 0,
      /* blocksparse_block_size */ 64,
      /* blocksparse_head_sliding_step */ 0);
"""
        in src
    )
    assert (
        """\
  if (dtype == 0 && kv_cache_dtype == 0 && a.head_size == 128 && a.block_size == 16)
    return launch_v2<uint16_t, uint16_t, 128, 16, vllm::Fp8KVCacheDataType::kAuto>(a, dtype, kv_cache_dtype);
  return kNotBuilt;
"""
        in src
    )
    assert 'KVPATCH_API const char* kvpatch_stock_configs() {\n  return "fp16/auto/128/16";' in src


def test_launcher_shards():
    sigs = {
        "v1": KernelSignature("paged_attention_v1_kernel", ("scalar_t",), (Param("out", "", True),)),
        "v2": KernelSignature("paged_attention_v2_kernel", ("scalar_t",), (Param("out", "", True),)),
        "reduce": KernelSignature("paged_attention_v2_reduce_kernel", ("scalar_t",), (Param("out", "", True),)),
    }
    configs = [KernelConfig("fp16", "auto", h, 16) for h in range(16, 16 * 20, 16)]
    sources = launcher_sources(Variant("x", ""), sigs, configs)
    assert len(sources) == 3  # 19 configurations, at most 8 a shard
    assert "KVPATCH_API int kvpatch_x_paged_attention_v1(" in sources[0]
    assert all("KVPATCH_API" not in s.split("#define KVPATCH_API")[1] for s in sources[1:])
    assert sum(s.count("return launch_v1<") for s in sources) == 19


def _kernels_after_a_deep_chain(depth: int) -> str:
    """The three kernels, after a function template whose ``if constexpr`` chain nests ``depth``
    deep in the AST (the dispatch a thousand rules render)."""
    chain = "\n  else ".join(f"if constexpr (N == {i}) {{ return {i}; }}" for i in range(depth))
    kernels = "".join(
        f"template <typename scalar_t, int HEAD_SIZE>\n__global__ void {name}(scalar_t* out, const float* k_scale) {{}}\n"
        for name in ("paged_attention_v1_kernel", "paged_attention_v2_kernel", "paged_attention_v2_reduce_kernel")
    )
    return f"template <int N> __device__ int kvpatch_deep() {{\n  {chain}\n  return -1;\n}}\n{kernels}"


def test_kernels_after_a_thousand_rules_deep_dispatch_are_found(header_path, monkeypatch):
    printed: list = []
    monkeypatch.setattr(sys, "unraisablehook", printed.append)
    sigs = kernel_signatures(_kernels_after_a_deep_chain(1500), header_path)
    assert sorted(sigs) == ["reduce", "v1", "v2"]
    assert sigs["v1"].template_params == ("scalar_t", "HEAD_SIZE")
    assert sigs["reduce"].param("k_scale") == Param("k_scale", "const float *", True)
    assert printed == [], printed[0].exc_value if printed else None
