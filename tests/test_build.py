"""Tests for kvpatch.jit (and kvpatch.gpu.launch's loading): planning is pure, nvcc at the edge.

The tests that compile need nvcc (they are skipped without it) and the SASS tools
(``nvidia-cuda-cuobjdump``, ``nvidia-cuda-nvdisasm``). They build small specs (one
dtype, head size 128, block size 16: about 3 s a variant on 2 cores) into a cache
shared by the session.
"""

from __future__ import annotations

import importlib
import io
import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from kvpatch import build as B
from kvpatch.jit import (
    Arch,
    BuildSpec,
    KernelConfig,
    KernelInfo,
    KernelSignature,
    Param,
    Toolchain,
    Variant,
    VariantResult,
    call_arguments,
    full_build_command,
    kernel_signatures,
    make_spec,
    parse_arch_list,
    patched_variants,
    validate_archs,
    vllm_kernel_set,
)
from kvpatch.config import make_config
from kvpatch.errors import BuildError, UsageError
from kvpatch.gpu.launch import Kernels
from kvpatch.patch.markers import unpatch
from kvpatch.render import build_table

# kvpatch.jit re-exports functions named like two of its modules (toolchain, plan)
TOOLCHAIN = importlib.import_module("kvpatch.jit.toolchain")
COMPILE = importlib.import_module("kvpatch.jit.compile")


def _have_nvcc() -> bool:
    try:
        B.find_nvcc()
    except BuildError:
        return False
    return True


_skip_without_nvcc = pytest.mark.skipif(not _have_nvcc(), reason="nvcc not found on PATH (set CUDA_HOME or PATH)")


def needs_nvcc(test):
    """Compiles with nvcc (skipped without it) against a fetched release tree."""
    return pytest.mark.network(pytest.mark.nvcc(_skip_without_nvcc(test)))


def network(test):
    return pytest.mark.network(test)


def _quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


def stock_and_patched(tree: Path) -> tuple[Variant, Variant]:
    """The tree's header without and with the default configuration."""
    path = str(tree / B.HEADER)
    stock, _ = unpatch(Path(path).read_text(encoding="utf-8"), path)
    first, second = patched_variants(stock, path, {"patched": make_config()})
    return first, second


#: Every query dtype: the SASS check must see the prefetch in each (fp16 is inline asm
#: by default, bf16 and fp32 call the kvpatch_prefetch_l2 helper).
ALL_DTYPES = ["fp16", "bf16", "fp32"]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def tree_0102(vllm_release) -> Path:
    return vllm_release("0.10.2")


@pytest.fixture(scope="session")
def tree_064(vllm_release) -> Path:
    return vllm_release("0.6.4")


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kvpatch-cache")


@pytest.fixture(scope="session")
def variants_0102(tree_0102) -> tuple[Variant, Variant]:
    return stock_and_patched(tree_0102)


@pytest.fixture(scope="session")
def spec_9a(tree_0102, variants_0102) -> BuildSpec:
    # head 64 block 16: the default has all three forms there (fp16 v1 inline asm, bf16 a call
    # to the helper, fp16 v2 and fp32 off)
    return make_spec(tree_0102, variants_0102, "9.0a", dtypes=ALL_DTYPES, head_sizes=[64])


@pytest.fixture(scope="session")
def built_9a(spec_9a, build_cache) -> B.BuildResult:
    return B.build(spec_9a, cache=build_cache, console=_quiet())


# --------------------------------------------------------------------------- archs


@pytest.mark.parametrize(
    "text, expected",
    [
        ("9.0a", [Arch(9, 0, "a")]),
        ("9.0", [Arch(9, 0)]),
        ("8.0;9.0a", [Arch(8, 0), Arch(9, 0, "a")]),
        ("8.0 9.0", [Arch(8, 0), Arch(9, 0)]),
        ("9.0+PTX", [Arch(9, 0, ptx=True)]),
        (" 8.6 ; 8.6;10.0a ", [Arch(8, 6), Arch(10, 0, "a")]),
    ],
)
def test_parse_arch_list(text, expected):
    assert parse_arch_list(text) == expected


@pytest.mark.parametrize("text", ["", " ; ", "sm_90", "90a", "9", "9.0b", "8.0a", "9.0+SASS", "nine"])
def test_parse_arch_list_rejects(text):
    with pytest.raises(UsageError) as e:
        parse_arch_list(text)
    assert "\n" not in str(e.value)


def test_gencode_flags():
    assert Arch(9, 0, "a").gencode_flags() == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert Arch(8, 0).gencode_flags() == ["-gencode=arch=compute_80,code=sm_80"]
    assert Arch(9, 0, ptx=True).gencode_flags() == [
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90",
    ]
    assert [str(a) for a in parse_arch_list("8.0;9.0a;9.0+PTX")] == ["8.0", "9.0a", "9.0+PTX"]


def test_validate_archs_names_supported_ones():
    tc = Toolchain(Path("nvcc"), "Cuda compilation tools, release 13.0, V13.0.88", ("compute_75", "compute_80", "compute_90"))
    validate_archs(parse_arch_list("8.0;9.0a"), tc)
    with pytest.raises(BuildError, match=r"nvcc 13.0 cannot compile for 7.0; it supports 7.5 8.0 9.0"):
        validate_archs(parse_arch_list("7.0;9.0a"), tc)


def test_missing_nvcc(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BuildError, match=r"^nvcc not found on PATH \(set CUDA_HOME or PATH\)$"):
        B.find_nvcc()


def test_missing_sass_tools(monkeypatch):
    monkeypatch.setattr(TOOLCHAIN, "find_cuda_tool", lambda name, nvcc=None: None)
    with pytest.raises(BuildError, match="pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"):
        B.find_inspector()


@needs_nvcc
def test_unsupported_arch_is_a_clear_error(spec_9a, build_cache):
    spec = replace(spec_9a, archs=tuple(parse_arch_list("7.0")))
    with pytest.raises(BuildError, match=r"cannot compile for 7.0; it supports .*7\.5"):
        B.build(spec, cache=build_cache, console=_quiet())


# --------------------------------------------------------------------------- kernel signatures


@network
def test_kernel_parameters_differ_between_releases(tree_064, tree_0102):
    old = kernel_signatures((tree_064 / B.HEADER).read_text(), tree_064 / B.HEADER)
    new = kernel_signatures((tree_0102 / B.HEADER).read_text(), tree_0102 / B.HEADER)
    for sigs in (old, new):
        assert sorted(sigs) == ["reduce", "v1", "v2"]
        assert sigs["v2"].template_params[-1] == "PARTITION_SIZE"
    assert old["v1"].param("k_scale") == Param("k_scale", "const float", False)
    assert new["v1"].param("k_scale") == Param("k_scale", "const float *", True)
    assert "a.k_scale" in call_arguments(old["v2"]) and "a.v_scale" in call_arguments(old["v2"])
    assert "a.k_scale_ptr" in call_arguments(new["v2"]) and "a.v_scale_ptr" in call_arguments(new["v2"])
    assert B.scale_by_value(old) and not B.scale_by_value(new)


def test_unknown_kernel_parameter_is_refused():
    sig = KernelSignature("paged_attention_v1_kernel", ("scalar_t",), (Param("out", "scalar_t *", True), Param("sinks", "const float *", True)))
    with pytest.raises(BuildError, match="does not know: const float \\* sinks"):
        call_arguments(sig)
    with pytest.raises(BuildError, match="cannot fill: NEW_PARAM"):
        B.template_arguments(replace(sig, template_params=("scalar_t", "NEW_PARAM")))


@network
def test_launcher_calls_the_kernel_as_the_release_wants(tree_0102):
    header = (tree_0102 / B.HEADER).read_text()
    sigs = kernel_signatures(header, tree_0102 / B.HEADER)
    (src,) = B.launcher_sources(Variant("stock", header), sigs, [KernelConfig("fp16", "auto", 128, 16)])
    assert "auto kernel = vllm::paged_attention_v1_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, kNumThreads, KV_DTYPE, false>;" in src
    assert """\
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
""" in src
    assert """\
  if (dtype == 0 && kv_cache_dtype == 0 && a.head_size == 128 && a.block_size == 16)
    return launch_v2<uint16_t, uint16_t, 128, 16, vllm::Fp8KVCacheDataType::kAuto>(a);
  return kNotBuilt;
""" in src
    assert 'KVPATCH_API const char* kvpatch_stock_configs() {\n  return "fp16/auto/128/16";' in src


def test_launcher_shards():
    sigs = {
        "v1": KernelSignature("paged_attention_v1_kernel", ("scalar_t",), (Param("out", "", True),)),
        "v2": KernelSignature("paged_attention_v2_kernel", ("scalar_t",), (Param("out", "", True),)),
        "reduce": KernelSignature("paged_attention_v2_reduce_kernel", ("scalar_t",), (Param("out", "", True),)),
    }
    configs = [KernelConfig("fp16", "auto", h, 16) for h in range(16, 16 * 20, 16)]
    sources = B.launcher_sources(Variant("x", ""), sigs, configs)
    assert len(sources) == 3  # 19 configurations, at most 8 a shard
    assert "KVPATCH_API int kvpatch_x_paged_attention_v1(" in sources[0]
    assert all("KVPATCH_API" not in s.split("#define KVPATCH_API")[1] for s in sources[1:])
    assert sum(s.count("return launch_v1<") for s in sources) == 19


# --------------------------------------------------------------------------- spec and plan


@network
def test_make_spec_defaults_and_all(tree_0102, variants_0102):
    spec = make_spec(tree_0102, variants_0102)
    assert spec.archs == (Arch(9, 0, "a"),)
    assert [c.label for c in spec.configs] == ["fp16/auto/128/16", "bf16/auto/128/16"]
    full = make_spec(tree_0102, variants_0102, "8.0;9.0a", all_kernels=True)
    assert full.head_sizes == (32, 64, 80, 96, 112, 120, 128, 192, 256)
    assert full.block_sizes == (8, 16, 32)
    assert full.dtypes == ("fp16", "bf16", "fp32")
    assert full.kv_cache_dtypes == ("auto", "fp8", "fp8_e5m2")
    assert len(full.configs) == 243
    assert make_spec(tree_0102, variants_0102, kv_cache_dtypes=["fp8_e4m3"]).kv_cache_dtypes == ("fp8",)
    assert vllm_kernel_set(tree_0102) == ((32, 64, 80, 96, 112, 120, 128, 192, 256), (8, 16, 32))


#: A launcher in vLLM's shape that instantiates another set than any release does.
OTHER_LAUNCHER = """\
#define LAUNCH_PAGED_ATTENTION_V1(HEAD_SIZE) \\
  paged_attention_v1_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, KV_DTYPE, IS_BLOCK_SPARSE>
  switch (head_size) {
    case 48:
      LAUNCH_PAGED_ATTENTION_V1(48);
      break;
    case 160:
      LAUNCH_PAGED_ATTENTION_V1( 160 );
      break;
  }
#define CALL_V1_LAUNCHER_SPARSITY(T, CACHE_T, BLOCK_SIZE, IS_FP8_KV_CACHE) \\
  switch (block_size) {
    case 64:
      CALL_V1_LAUNCHER_SPARSITY(T, CACHE_T, 64, KV_DTYPE);
      break;
    case 24:
      CALL_V1_LAUNCHER_SPARSITY( T,CACHE_T,  24, KV_DTYPE);
      break;
  }
"""


def _fake_tree(root: Path, launcher: str | None) -> Path:
    (root / B.HEADER).parent.mkdir(parents=True)
    (root / B.HEADER).write_text("// not parsed by make_spec\n")
    if launcher is not None:
        (root / "csrc/attention/paged_attention_v1.cu").write_text(launcher)
    return root


def test_vllm_kernel_set_reads_the_trees_launcher(tmp_path):
    tree = _fake_tree(tmp_path / "other", OTHER_LAUNCHER)
    assert vllm_kernel_set(tree) == ((48, 160), (64, 24))
    full = make_spec(tree, [Variant("stock", "")], all_kernels=True)
    assert (full.head_sizes, full.block_sizes) == ((48, 160), (64, 24))
    assert make_spec(tree, [Variant("stock", "")], head_sizes=[160], block_sizes=[24]).configs[0].label == "fp16/auto/160/24"
    with pytest.raises(UsageError, match=r"^invalid head size 128: vLLM's kernels are instantiated for 48, 160$"):
        make_spec(tree, [Variant("stock", "")], head_sizes=[128])
    # no launcher file (or none of its dispatch found): the set vLLM 0.6.4-0.22 instantiate
    bare = _fake_tree(tmp_path / "bare", None)
    assert vllm_kernel_set(bare) == ((32, 64, 80, 96, 112, 120, 128, 192, 256), (8, 16, 32))
    assert vllm_kernel_set(_fake_tree(tmp_path / "empty", "// nothing\n")) == vllm_kernel_set(bare)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(head_sizes=[7]), r"^invalid head size 7: vLLM's kernels are instantiated for 32, 64, 80, 96, 112, 120, 128, 192, 256$"),
        (dict(head_sizes=[128, 100]), "invalid head size 100"),
        (dict(block_sizes=[12]), r"^invalid block size 12: vLLM's kernels are instantiated for 8, 16, 32$"),
        (dict(block_sizes=[-16]), "invalid block size -16: expected a positive integer"),
    ],
)
def test_make_spec_refuses_sizes_the_kernels_lack(tmp_path, kwargs, message):
    with pytest.raises(UsageError, match=message):
        make_spec(_fake_tree(tmp_path, None), [Variant("stock", "")], **kwargs)


@pytest.mark.parametrize("jobs", [0, -1, True, 2.5])
def test_build_refuses_jobs_below_one_before_anything_runs(jobs, monkeypatch):
    def no_nvcc():
        raise AssertionError("nvcc must not be looked for")

    monkeypatch.setattr(COMPILE, "toolchain", no_nvcc)
    spec = BuildSpec(Path("/nonexistent"), (Variant("stock", ""),), (Arch(9, 0, "a"),))
    with pytest.raises(UsageError, match=r"^invalid jobs .*: must be >= 1$"):
        B.build(spec, jobs=jobs, console=_quiet())
    with pytest.raises(UsageError, match=r"must be >= 1"):
        full_build_command("/nonexistent", [Arch(9, 0, "a")], jobs)


@network
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dtypes=["fp64"]), "invalid dtype 'fp64'"),
        (dict(kv_cache_dtypes=["int8"]), "invalid kv-cache dtype 'int8'"),
        (dict(head_sizes=[0]), "invalid head size 0"),
        (dict(block_sizes=["x"]), "invalid block size 'x'"),
        (dict(archs="sm_90"), "invalid arch 'sm_90'"),
    ],
)
def test_make_spec_rejects(tree_0102, variants_0102, kwargs, message):
    with pytest.raises(UsageError, match=message):
        make_spec(tree_0102, variants_0102, **kwargs)


@network
def test_make_spec_rejects_variants_and_trees(tree_0102, tmp_path):
    with pytest.raises(UsageError, match="invalid variant name 'no-dash'"):
        make_spec(tree_0102, [Variant("no-dash", "")])
    with pytest.raises(UsageError, match="given twice: a"):
        make_spec(tree_0102, [Variant("a", ""), Variant("a", "")])
    with pytest.raises(UsageError, match="not a vLLM source tree"):
        make_spec(tmp_path, [Variant("a", "")])


@network
def test_source_closure(tree_0102):
    files = B.source_closure(tree_0102 / "csrc", "// the variant\n#include \"attention_dtypes.h\"\n#include \"../cuda_compat.h\"\n")
    assert files["attention/attention_kernels.cuh"].startswith("// the variant")
    assert {"attention/attention_dtypes.h", "attention/dtype_fp8.cuh", "cuda_compat.h"} <= set(files)
    assert "attention/paged_attention_v1.cu" not in files
    real = B.source_closure(tree_0102 / "csrc", (tree_0102 / B.HEADER).read_text())
    assert "quantization/fp8/nvidia/quant_utils.cuh" in real


@needs_nvcc
def test_plan_is_content_keyed(spec_9a, build_cache):
    a, b = B.plan(spec_9a, cache=build_cache)
    assert a.key != b.key and a.dir.parent == build_cache / "builds"
    assert [p.key for p in B.plan(spec_9a, cache=build_cache)] == [a.key, b.key]
    other = B.plan(replace(spec_9a, archs=(Arch(8, 0),)), cache=build_cache)
    assert other[0].key != a.key
    assert "-Dvllm=kvpatch_stock" in a.compile_flags and "-Dvllm=kvpatch_patched" in b.compile_flags
    # one flag set whatever the configurations: vLLM's own, -DENABLE_FP8 included
    fp8 = B.plan(replace(spec_9a, kv_cache_dtypes=("fp8",)), cache=build_cache)[0]
    assert a.compile_flags == fp8.compile_flags
    assert a.compile_flags[: len(B.vllm_nvcc_flags())] == B.vllm_nvcc_flags()
    assert dict(a.files)["stubs/torch/all.h"] == dict(fp8.files)["stubs/torch/all.h"]


def test_vllm_nvcc_flags_are_vllms():
    flags = B.vllm_nvcc_flags()
    assert flags == ("-std=c++17", "-O2", "-g", "-DNDEBUG", "--expt-relaxed-constexpr", "-DENABLE_FP8")
    assert not any(f.startswith("-D__CUDA_NO_") for f in flags) and "--use_fast_math" not in flags
    assert "Float8_e4m3fn" in B.stub_headers()["torch/all.h"]


# --------------------------------------------------------------------------- output parsing


PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN13kvpatch_stock25paged_attention_v1_kernelIttLi128ELi16ELi128ELNS_18Fp8KVCacheDataTypeE0ELb0EEEvPT_' for 'sm_90a'
ptxas info    : Function properties for _ZN13kvpatch_stock25paged_attention_v1_kernelIttLi128ELi16ELi128ELNS_18Fp8KVCacheDataTypeE0ELb0EEEvPT_
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 96 registers, used 1 barriers, 288 bytes smem
ptxas info    : Compile time = 69.034 ms
"""


def test_parse_ptxas_log():
    sym = "_ZN13kvpatch_stock25paged_attention_v1_kernelIttLi128ELi16ELi128ELNS_18Fp8KVCacheDataTypeE0ELb0EEEvPT_"
    assert B.parse_ptxas_log(PTXAS) == {
        ("sm_90a", sym): {"registers": 96, "spill_stores": 4, "spill_loads": 12, "stack_bytes": 8}
    }


def test_scan_sass():
    sass = """\
	code for sm_90a
		Function : _Zpatched
        /*0450*/                   UBLKPF.L2 [UR4], UR5 ;
		Function : _Zreduce
        /*0000*/                   LDC R1, c[0x0][0x28] ;
	code for sm_80
		Function : _Zpatched
        /*0000*/                   LDC R1, c[0x0][0x28] ;
"""
    assert B.scan_sass(sass.splitlines()) == {
        ("sm_90a", "_Zpatched"): True,
        ("sm_90a", "_Zreduce"): False,
        ("sm_80", "_Zpatched"): False,
    }


def test_scan_sass_counts_floating_point_ops():
    from kvpatch.jit.sass import scan_sass_kernels

    sass = """\
	code for sm_90a
		Function : _Zk
        /*0010*/                   FFMA R1, R2, R3, R4 ;
        /*0020*/              @!P0 FFMA.FTZ R1, R2, R3, R4 ;
        /*0030*/                   HFMA2.MMA R5, -RZ, RZ, 0, 0 ;
        /*0040*/                   FMNMX R1, R2, R3, !PT ;
        /*0045*/                   MUFU.RCP R6, R7 ;
        /*0050*/                   UBLKPF.L2 [UR4], UR5 ;
        /*0060*/                   IMAD R1, R2, R3, R4 ;
        /*10000*/                  FFMA R1, R2, R3, R4 ;
"""
    # the last FFMA lies past 0xffff, where cuobjdump writes a fifth address digit
    assert scan_sass_kernels(sass.splitlines()) == {("sm_90a", "_Zk"): (True, {"FFMA": 3, "FMNMX": 1, "MUFU": 1}, None)}


def _loop_sass(gap: int) -> str:
    """A kernel whose key loop (4 LDG + an LDS, closed by a backward branch) uses each load
    ``gap`` instructions after issuing it; a short loop without loads before it."""
    body = ["IADD3 R2, R2, 0x1, RZ", "BRA 0x0010"]  # a loop of no interest (no loads)
    loop = [f"LDG.E.128.CONSTANT R{20 + 4 * i}, desc[UR4][R{60 + 2 * i}.64]" for i in range(4)]
    loop += ["IMAD R9, R9, 0x2, RZ"] * max(0, gap - 4) + ["LDS R8, [R3]"]
    loop += [f"HFMA2 R10, R{21 + 4 * i}, R8, R10" for i in range(4)]
    start = len(body)
    ins = body + loop + [f"@P0 BRA 0x{start * 16:04x}", "EXIT"]
    return "\tcode for sm_90a\n\t\tFunction : _Zk\n" + "".join(f"        /*{i * 16:04x}*/  {t} ;\n" for i, t in enumerate(ins))


def test_key_loop_load_use_measures_how_far_ahead_loads_issue():
    from kvpatch.jit.sass import key_loop_load_use, scan_sass_kernels

    far = scan_sass_kernels(_loop_sass(40).splitlines())[("sm_90a", "_Zk")].load_use
    near = scan_sass_kernels(_loop_sass(4).splitlines())[("sm_90a", "_Zk")].load_use
    # loads i = 0..3 used by the HFMA2 at 4 + pad + 1 + i: distance pad + 5 for each (pad = gap - 4)
    assert (far, near) == (41.0, 5.0)
    assert key_loop_load_use([(0, "LDG.E R1, desc[UR4][R2.64]"), (16, "BRA 0x0")]) is None  # no loop with an LDS
    assert key_loop_load_use([]) is None


def test_schedule_warnings_compare_load_use_with_stock():
    stock = VariantResult("stock", "kvpatch_stock", "k", Path("."), Path("s.so"), (), Path("s.sass"), ("sm_90a",),
                          ("fp16/auto/128/16",), (_kernel(has_prefetch=False, load_use=80.0),), (), False)  # fmt: skip
    close = replace(stock, name="close", kernels=(_kernel(load_use=60.0),))
    near = replace(stock, name="near", kernels=(_kernel(load_use=12.0),))
    unknown = replace(stock, name="unknown", kernels=(_kernel(load_use=None),))
    off = replace(stock, name="off", kernels=(_kernel(has_prefetch=False, expect_prefetch=False, load_use=5.0),))
    result = B.BuildResult((stock, close, near, unknown, off), 0.0)
    assert result.schedule_warnings() == ["near: v1 fp16/auto/128/16 sm_90a: its key loop uses each load 12 instructions "
                                          "after issuing it (median; stock's: 80): expect it slower than stock (measure with "
                                          "'kvpatch bench')"]  # fmt: skip
    assert B.BuildResult((close, near), 0.0).schedule_warnings() == []  # no stock to compare with
    again = VariantResult.from_dict(json.loads(json.dumps(near.to_dict())))
    assert again.kernels == near.kernels and again.kernels[0].load_use == 12.0


def _build_gated_and_plain(tree: Path, cache, issue: str, **gate):
    """Stock and two uniform patched builds of fp16 head 128 block 16 (v1, v2): 'plain' (kv-head
    scope, min-group 2, read=warp, ``issue``) and 'gated', the same with the ``gate`` settings."""
    from dataclasses import replace as with_

    path = tree / "csrc/attention/attention_kernels.cuh"
    base = make_config(inherit_rules=False, fp16="none", bf16="none", fp32="none", rules="none", issue=issue,
                       scope="kv-head", min_group=2, read="warp")  # fmt: skip
    variants = B.patched_variants(path.read_text(encoding="utf-8"), str(path),
                                  {"gated": with_(base, **gate), "plain": base})  # fmt: skip
    spec = make_spec(tree, variants, "9.0a", dtypes=["fp16"], head_sizes=[128], block_sizes=[16])
    return B.build(spec, cache=cache, console=_quiet())


@needs_nvcc
def test_build_warns_where_ptxas_schedules_the_key_loads_next_to_their_use(tree_0102, build_cache):
    """fp16 head 128 block 16 v1: with min-ctas 1024 and read=warp, ptxas issues each key load
    right before its use (0.49x stock on the H200: ctas-probe in benchmarks/ARCHIVE.md); without the
    gate it issues them all up front (1.10x)."""
    result = _build_gated_and_plain(tree_0102, build_cache, "inline", min_ctas=1024)
    warned = {w.split(": ")[0] + " " + w.split(": ")[1].split()[0] for w in result.schedule_warnings()}
    assert warned == {"gated v1", "gated v2"}
    assert all(k.load_use for v in result.variants for k in v.kernels if k.kernel != "reduce")


@needs_nvcc
def test_min_kv_mib_leaves_the_calling_loop_as_without_it(tree_0102, build_cache):
    """min-kv-mib's test lives in the call helper, so the loop calling it keeps the ungated
    form's key-load schedule (a test in the loop moved the loads next to their use:
    kv-gate-probe in benchmarks/ARCHIVE.md), and the helper still holds the prefetch."""
    result = _build_gated_and_plain(tree_0102, build_cache, "call", min_kv_mib=64)
    assert result.schedule_warnings() == []
    by = {v.name: {k.kernel: k for k in v.kernels if k.kernel != "reduce"} for v in result.variants}
    for kernel in ("v1", "v2"):
        gated, plain = by["gated"][kernel], by["plain"][kernel]
        assert gated.load_use == plain.load_use and gated.registers == plain.registers, (kernel, gated, plain)
        assert gated.has_prefetch and gated.load_use >= 0.5 * by["stock"][kernel].load_use


def test_split_warnings_compare_floating_point_ops_with_stock():
    ops = (("FADD", 3), ("FFMA", 122))
    stock = VariantResult("stock", "kvpatch_stock", "k", Path("."), Path("s.so"), (), Path("s.sass"), ("sm_90a",),
                          ("bf16/auto/128/16",), (_kernel(dtype="bf16", fp_ops=ops, has_prefetch=False),), (), False)  # fmt: skip
    same = replace(stock, name="split", kernels=(_kernel(dtype="bf16", fp_ops=ops, split=True),))
    other = replace(same, name="other", kernels=(_kernel(dtype="bf16", fp_ops=(("FFMA", 244),), split=True),))
    inline = replace(same, name="inline", kernels=(_kernel(dtype="bf16", fp_ops=(("FFMA", 61),)),))
    moved = replace(same, name="moved", kernels=(_kernel(dtype="bf16", fp_ops=(("FADD", 5), ("FFMA", 122)), split=True),))
    result = B.BuildResult((stock, same, other, inline, moved), 0.0)
    assert result.split_warnings() == ["other: v1 bf16/auto/128/16 sm_90a: issue=split, but 244 FFMA in its SASS against "
                                       "stock's 122: expect outputs with ALiBi to differ (check with 'kvpatch validate')"]  # fmt: skip
    assert B.BuildResult((same, other), 0.0).split_warnings() == []  # no stock to compare with
    again = VariantResult.from_dict(json.loads(json.dumps(other.to_dict())))
    assert again.kernels == other.kernels


@needs_nvcc
def test_build_warns_where_split_does_not_compile_as_stock(tree_0102, build_cache):
    """bf16 head 128: stock's key loop is unswitched on the ALiBi slope at block 16, not at 32.
    With issue=split block 16 keeps stock's floating-point SASS; block 32 does not, and says so."""
    stock = (tree_0102 / "csrc/attention/attention_kernels.cuh").read_text(encoding="utf-8")
    variants = B.patched_variants(stock, str(tree_0102 / "csrc/attention/attention_kernels.cuh"),
                                  {"split": make_config(inherit_rules=False, issue="split")})  # fmt: skip
    spec = make_spec(tree_0102, variants, "9.0a", dtypes=["bf16"], head_sizes=[128], block_sizes=[16, 32])
    result = B.build(spec, cache=build_cache, console=_quiet())
    split = result.variant("split")
    assert {(k.kernel, k.block_size) for k in split.kernels if k.split} == {("v1", 16), ("v2", 16), ("v1", 32), ("v2", 32)}
    warned = {(w.split(": ")[1]) for w in result.split_warnings()}
    assert warned == {"v1 bf16/auto/128/32 sm_90a", "v2 bf16/auto/128/32 sm_90a"}


def test_describe_kernel():
    sigs = {
        "v1": KernelSignature("paged_attention_v1_kernel", ("scalar_t", "cache_t", "HEAD_SIZE", "BLOCK_SIZE", "NUM_THREADS", "KV_DTYPE", "IS_BLOCK_SPARSE"), ()),
        "v2": KernelSignature("paged_attention_v2_kernel", (), ()),
        "reduce": KernelSignature("paged_attention_v2_reduce_kernel", ("scalar_t", "HEAD_SIZE", "NUM_THREADS", "PARTITION_SIZE"), ()),
    }
    name = "void kvpatch_x::paged_attention_v1_kernel<__nv_bfloat16, unsigned char, 128, 16, 128, (kvpatch_x::Fp8KVCacheDataType)1, false>(__nv_bfloat16*)"
    assert B.describe_kernel(name, sigs) == {"kernel": "v1", "dtype": "bf16", "kv_cache_dtype": "fp8", "head_size": 128, "block_size": 16}
    name = "void kvpatch_x::paged_attention_v2_reduce_kernel<unsigned short, 64, 128, 512>(unsigned short*)"
    assert B.describe_kernel(name, sigs) == {"kernel": "reduce", "dtype": "fp16", "kv_cache_dtype": "", "head_size": 64, "block_size": 0}
    assert B.describe_kernel("void other_kernel<int>()", sigs) is None


def _kernel(**kw) -> KernelInfo:
    base = dict(arch="sm_90a", kernel="v1", dtype="fp16", kv_cache_dtype="auto", head_size=128, block_size=16,
                registers=96, spill_stores=0, spill_loads=0, stack_bytes=0, has_prefetch=True, expect_prefetch=True, symbol="_Z")  # fmt: skip
    return KernelInfo(**{**base, **kw})


def test_problems_report_missing_and_unexpected_prefetch():
    kernels = (_kernel(), _kernel(kernel="v2"), _kernel(kernel="reduce", block_size=0, kv_cache_dtype="", has_prefetch=False, expect_prefetch=False))
    result = VariantResult("patched", "kvpatch_patched", "k", Path("."), Path("lib.so"), (), Path("k.sass"), ("sm_90a",),
                           ("fp16/auto/128/16",), kernels, (), True)  # fmt: skip
    assert result.problems() == []
    bad = replace(result, kernels=(_kernel(has_prefetch=False), *kernels[1:]))
    assert bad.problems() == ["patched: v1 fp16/auto/128/16 sm_90a lacks UBLKPF in its SASS"]
    stray = replace(result, kernels=(*kernels[:2], replace(kernels[2], has_prefetch=True)))
    assert stray.problems() == ["patched: reduce fp16/128 sm_90a unexpectedly has UBLKPF in its SASS"]
    assert "found 2 kernels in the SASS, expected 3" in replace(result, kernels=kernels[:2]).problems()[0]


# --------------------------------------------------------------------------- building


@needs_nvcc
def test_build_sm90a_prefetch_only_in_patched(built_9a, tree_0102):
    stock, patched = built_9a.variants
    assert built_9a.problems() == []
    # the default at head 64 block 16: fp16 v1 inline asm, bf16 v1 and v2 a call to the helper
    # (so an empty helper fails this), fp16 v2 off (no candidate was never-slower), fp32 off (not tuned)
    on = {("v1", "fp16"), ("v1", "bf16"), ("v2", "bf16")}
    assert [(k.kernel, k.dtype, k.has_prefetch) for k in patched.kernels] == [
        (kernel, dtype, (kernel, dtype) in on) for kernel in ("v1", "v2", "reduce") for dtype in ALL_DTYPES
    ]
    assert all(k.has_prefetch == k.expect_prefetch for k in patched.kernels)
    assert not any(k.has_prefetch for k in stock.kernels)
    assert "UBLKPF" in patched.read_sass() and "UBLKPF" not in stock.read_sass()
    for v in (stock, patched):
        assert v.library.is_file() and [c.name.split(".")[-2] for c in v.cubins] == ["sm_90a"]
        assert all(k.registers > 0 and k.arch == "sm_90a" for k in v.kernels)
        assert {k.kernel for k in v.kernels} == {"v1", "v2", "reduce"}
        assert v.steps and not v.cached
    # the tree itself is untouched
    assert subprocess.run(["git", "status", "--porcelain"], cwd=tree_0102, capture_output=True, text=True).stdout == ""


@needs_nvcc
def test_build_sm80_has_no_prefetch(tree_0102, variants_0102, build_cache):
    spec = make_spec(tree_0102, [variants_0102[1]], "8.0", dtypes=["fp16"])
    (patched,) = B.build(spec, cache=build_cache, console=_quiet()).variants
    assert [(k.arch, k.kernel, k.has_prefetch, k.expect_prefetch) for k in patched.kernels] == [
        ("sm_80", "v1", False, False),
        ("sm_80", "v2", False, False),
        ("sm_80", "reduce", False, False),
    ]
    assert "UBLKPF" not in patched.read_sass()


@needs_nvcc
def test_variants_have_distinct_symbols(built_9a):
    stock, patched = built_9a.variants
    assert {k.symbol for k in stock.kernels}.isdisjoint(k.symbol for k in patched.kernels)
    assert all("kvpatch_stock" in k.symbol for k in stock.kernels)
    assert all("kvpatch_patched" in k.symbol for k in patched.kernels)
    if shutil.which("nm"):
        exported = {
            v.name: subprocess.run(["nm", "-D", "--defined-only", str(v.library)], capture_output=True, text=True).stdout
            for v in (stock, patched)
        }
        assert "kvpatch_stock_paged_attention_v1" in exported["stock"]
        assert "kvpatch_patched_paged_attention_v2" in exported["patched"]
        assert "kvpatch_stock" not in exported["patched"] and "paged_attention_v1_kernel" not in exported["stock"]


@needs_nvcc
def test_repeat_build_is_a_cache_hit(built_9a, spec_9a, build_cache):
    mtimes = [v.library.stat().st_mtime_ns for v in built_9a.variants]
    again = B.build(spec_9a, cache=build_cache, console=_quiet())
    assert [v.cached for v in again.variants] == [True, True]
    assert [v.library.stat().st_mtime_ns for v in again.variants] == mtimes
    assert [v.kernels for v in again.variants] == [v.kernels for v in built_9a.variants]
    data = json.loads(json.dumps(again.to_dict()))  # the CLI's --json
    assert data["vllm_flags"] == list(B.vllm_nvcc_flags())
    for v in data["variants"]:
        assert v["compile_flags"][: len(B.vllm_nvcc_flags())] == list(B.vllm_nvcc_flags())
        assert "release" in v["nvcc"] and v["library_bytes"] > 0 and len(v["library_sha256"]) == 64


@needs_nvcc
@pytest.mark.parametrize("damage", ["empty", "truncated", "changed"])
def test_damaged_cached_library_is_rebuilt(damage, tree_0102, variants_0102, tmp_path):
    spec = make_spec(tree_0102, variants_0102[:1], "9.0a", dtypes=["fp16"])
    (first,) = B.build(spec, cache=tmp_path, console=_quiet()).variants
    good = first.library.read_bytes()
    recorded = json.loads((first.dir / "result.json").read_text())
    assert recorded["library_bytes"] == len(good)
    if damage == "empty":
        first.library.write_bytes(b"")
    elif damage == "truncated":
        first.library.write_bytes(good[: len(good) // 2])
    else:
        first.library.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    log = io.StringIO()
    (again,) = B.build(spec, cache=tmp_path, console=Console(file=log, width=300)).variants
    assert not again.cached and "damaged" in log.getvalue() and "rebuilding" in log.getvalue()
    assert ("sha256" in log.getvalue()) == (damage == "changed")  # same size: the digest says why
    assert again.library.read_bytes() == good
    (third,) = B.build(spec, cache=tmp_path, console=_quiet()).variants
    assert third.cached


@needs_nvcc
def test_a_cached_build_without_load_use_gets_it_from_its_sass(tree_0102, variants_0102, tmp_path):
    """A build cached by a kvpatch that did not record the key loop's load-use distance is read
    again from its kept SASS, once (FP op counts too): the numbers equal a fresh build's and
    result.json keeps them."""
    spec = make_spec(tree_0102, variants_0102[:1], "9.0a", dtypes=["fp16"])
    (first,) = B.build(spec, cache=tmp_path, console=_quiet()).variants
    assert all(k.load_use for k in first.kernels if k.kernel != "reduce")
    path = first.dir / "result.json"
    old = json.loads(path.read_text())
    for k in old["kernels"]:
        del k["load_use"]
        k["fp_ops"] = [["FFMA", 1]]  # what an older kvpatch counted is read again too
    path.write_text(json.dumps(old))
    (again,) = B.build(spec, cache=tmp_path, console=_quiet()).variants
    assert again.cached and again.kernels == first.kernels
    assert [k["load_use"] for k in json.loads(path.read_text())["kernels"]] == [k.load_use for k in first.kernels]


@needs_nvcc
def test_build_table(built_9a):
    out = io.StringIO()
    Console(file=out, width=200).print(build_table(built_9a))
    text = out.getvalue()
    assert "kvpatch build (" in text and "bf16/auto/64/16" in text and "fp32/64" in text
    assert "vLLM's nvcc flags: -std=c++17 -O2 -g -DNDEBUG --expt-relaxed-constexpr -DENABLE_FP8" in text


@needs_nvcc
def test_sass_check_fails_the_build(tree_0102, variants_0102, build_cache):
    liar = Variant("liar", variants_0102[0].header, expect_prefetch=True)
    spec = make_spec(tree_0102, [liar], "9.0a", dtypes=["fp16"])
    with pytest.raises(BuildError, match=r"^liar: v1 fp16/auto/128/16 sm_90a lacks UBLKPF in its SASS \(and 1 more\)$"):
        B.build(spec, cache=build_cache, console=_quiet())
    (unchecked,) = B.build(spec, cache=build_cache, console=_quiet(), check=False).variants
    assert unchecked.cached and len(unchecked.problems()) == 2


@needs_nvcc
def test_nvcc_failure_is_one_line(tree_0102, variants_0102, build_cache):
    broken = Variant("broken", variants_0102[0].header + "\n#error kvpatch-test-breakage\n")
    spec = make_spec(tree_0102, [broken], "9.0a", dtypes=["fp16"])
    with pytest.raises(BuildError, match="nvcc failed for variant 'broken': .*kvpatch-test-breakage") as e:
        B.build(spec, cache=build_cache, console=_quiet())
    assert "\n" not in str(e.value)


@needs_nvcc
def test_runtime_loads_without_torch(built_9a):
    stock, patched = built_9a.variants
    k = Kernels(stock.library, stock.prefix)
    p = Kernels.from_build(patched)
    assert k.configs == ("fp16/auto/64/16", "bf16/auto/64/16", "fp32/auto/64/16") == p.configs
    assert not k.scale_by_value
    assert k.error_string(-1) == "configuration not built into this library"
    with pytest.raises(RuntimeError, match="no kvpatch_patched_abi_version"):
        Kernels(stock.library, "kvpatch_patched")


@needs_nvcc
def test_build_064_takes_scales_by_value(tree_064, build_cache):
    stock, _ = stock_and_patched(tree_064)
    spec = make_spec(tree_064, [stock], "9.0a", dtypes=["bf16"])
    (built,) = B.build(spec, cache=build_cache, console=_quiet()).variants
    assert Kernels(built.library, built.prefix).scale_by_value
    assert "          a.k_scale,\n          a.v_scale," in (built.dir / "launcher_0.cu").read_text()


# --------------------------------------------------------------------------- --full


def test_full_build_command(tmp_path):
    argv, env = full_build_command(tmp_path, parse_arch_list("8.0;9.0a"), 16, python="/py", base_env={"PATH": "/bin"})
    assert argv == ["/py", "-m", "pip", "install", "-v", "-e", str(tmp_path.resolve()), "--no-build-isolation"]
    assert env == {"PATH": "/bin", "TORCH_CUDA_ARCH_LIST": "8.0;9.0a", "MAX_JOBS": "16", "VLLM_TARGET_DEVICE": "cuda"}
    with pytest.raises(UsageError):
        full_build_command(tmp_path, [], 16)
    with pytest.raises(UsageError):
        full_build_command(tmp_path, parse_arch_list("9.0a"), 0)
