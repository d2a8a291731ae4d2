"""kvpatch.jit.spec: user options validated into a build spec before anything runs -- the
instantiations the tree's launcher file names, sizes the kernels lack refused, the archs,
the variants, the job count."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from jit_helpers import needs_release, tree_0102, variants_0102  # noqa: F401  (fixtures)

from kvpatch.errors import UsageError
from kvpatch.jit import HEADER, Arch, BuildSpec, Variant, build, full_build_command, make_spec, vllm_kernel_set

# kvpatch.jit re-exports a function named like the module (build's compile)
COMPILE = importlib.import_module("kvpatch.jit.compile")


@needs_release
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
    (root / HEADER).parent.mkdir(parents=True)
    (root / HEADER).write_text("// not parsed by make_spec\n")
    if launcher is not None:
        (root / "csrc/attention/paged_attention_v1.cu").write_text(launcher)
    return root


def test_vllm_kernel_set_reads_the_trees_launcher(tmp_path):
    tree = _fake_tree(tmp_path / "other", OTHER_LAUNCHER)
    assert vllm_kernel_set(tree) == ((48, 160), (64, 24))
    full = make_spec(tree, [Variant("stock", "")], all_kernels=True)
    assert (full.head_sizes, full.block_sizes) == ((48, 160), (64, 24))
    assert (
        make_spec(tree, [Variant("stock", "")], head_sizes=[160], block_sizes=[24]).configs[0].label
        == "fp16/auto/160/24"
    )
    with pytest.raises(UsageError, match=r"^invalid head size 128: vLLM's kernels are instantiated for 48, 160$"):
        make_spec(tree, [Variant("stock", "")], head_sizes=[128])
    # no launcher file (or none of its dispatch found): the set vLLM 0.6.4-0.22 instantiate
    bare = _fake_tree(tmp_path / "bare", None)
    assert vllm_kernel_set(bare) == ((32, 64, 80, 96, 112, 120, 128, 192, 256), (8, 16, 32))
    assert vllm_kernel_set(_fake_tree(tmp_path / "empty", "// nothing\n")) == vllm_kernel_set(bare)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(head_sizes=[7]),
            r"^invalid head size 7: vLLM's kernels are instantiated for 32, 64, 80, 96, 112, 120, 128, 192, 256$",
        ),
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
        build(spec, jobs=jobs)
    with pytest.raises(UsageError, match=r"must be >= 1"):
        full_build_command("/nonexistent", [Arch(9, 0, "a")], jobs)


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
def test_make_spec_rejects(tmp_path, kwargs, message):
    with pytest.raises(UsageError, match=message):
        make_spec(_fake_tree(tmp_path, None), [Variant("stock", "")], **kwargs)


def test_make_spec_rejects_variants_and_trees(tmp_path):
    tree = _fake_tree(tmp_path / "tree", None)
    with pytest.raises(UsageError, match="invalid variant name 'no-dash'"):
        make_spec(tree, [Variant("no-dash", "")])
    with pytest.raises(UsageError, match="given twice: a"):
        make_spec(tree, [Variant("a", ""), Variant("a", "")])
    with pytest.raises(UsageError, match="not a vLLM source tree"):
        make_spec(tmp_path / "empty", [Variant("a", "")])
    # the options checked first, the variants given later (kvpatch build reads the tree after)
    assert make_spec(tree, [Variant("no-dash", "")], check_variants=False).variants == (Variant("no-dash", ""),)
