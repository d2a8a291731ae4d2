"""kvpatch.gpu.validate's matrices: the default cross product, the quick and full sets (every
instantiation vLLM builds, sampled), and one case's sequence lengths."""

from __future__ import annotations

import pytest

from kvpatch.errors import UsageError
from kvpatch.gpu import dispatch as Dp
from kvpatch.gpu import validate as V


def test_default_validate_matrix():
    m = V.validate_matrix()
    assert len(m) == 3 * 2 * 3 * 2 * 2 * 2 * 2 * 5
    assert len(set(m)) == len(m)
    assert {c.kv_cache_dtype for c in m if c.dtype == "fp32"} == {"auto", "fp8"}
    names = {c.name for c in m}
    assert "v2 q=bf16 kv=fp8 head=256 block=32 heads=8/2 alibi=on ctx=2100" in names
    # contexts end mid-block and span several v2 partitions
    assert any(c % 16 and Dp.num_partitions(c) >= 3 for c in V.DEFAULT_CONTEXTS)


def test_validate_matrix_trims_and_rejects():
    assert len(V.quick_matrix()) == 32
    m = V.validate_matrix(dtypes=("fp16",), kv_cache_dtypes=("auto",), head_sizes=(128,), block_sizes=(16,),
                          kernels=("v2",), heads=((8, 2),), alibi=(False,), contexts=(1, 17))  # fmt: skip
    assert [c.context for c in m] == [1, 17]
    for bad in ({"dtypes": ("fp64",)}, {"kernels": ("v3",)}, {"heads": ((8, 3),)}, {"contexts": (0,)},
                {"contexts": (17, 131073)}, {"contexts": (99999999999,)}):  # fmt: skip
        with pytest.raises(UsageError):
            V.validate_matrix(**bad)


def test_case_seq_lens():
    c = V.ValidateCase("fp16", "auto", 128, 16, "v2", 8, 2, False, 1500)
    lens = c.seq_lens(7)
    assert len(lens) == 3 and max(lens) == 1500 and min(lens) >= 1
    assert lens == c.seq_lens(7)
    assert V.ValidateCase("fp16", "auto", 128, 16, "v2", 8, 2, False, 1).seq_lens(3) == [1, 1, 1]


def test_full_matrix_covers_every_vllm_instantiation(tmp_path):
    m = V.full_matrix()
    configs = {(c.dtype, c.kv_cache_dtype, c.head_size, c.block_size, c.kernel, c.alibi) for c in m}
    for d in ("fp16", "bf16", "fp32"):
        for h in V.VLLM_HEAD_SIZES:
            for b in V.VLLM_BLOCK_SIZES:
                for k in ("v1", "v2"):
                    for al in (False, True):
                        assert (d, "auto", h, b, k, al) in configs
                        assert ((d, "fp8", h, b, k, al) in configs) == (h % 16 == 0)
    assert len(m) == 2 * len(configs) == 1224
    assert {(c.num_heads, c.num_kv_heads, c.num_seqs) for c in m if not c.alibi} == {(8, 2, 3), (4, 4, 3)}
    # ALiBi: more heads and sequences, so a v1 kernel's 16-bit outputs show a fused-vs-unfused ulp
    assert {(c.num_heads, c.num_kv_heads, c.num_seqs) for c in m if c.alibi} == {(32, 8, 8), (16, 16, 8)}
    assert {c.context for c in m} == set(V.FULL_SHORT_CONTEXTS + V.FULL_LONG_CONTEXTS)
    # each configuration: one short context and one spanning several v2 partitions, both head layouts
    per = {}
    for c in m:
        per.setdefault((c.dtype, c.kv_cache_dtype, c.head_size, c.block_size, c.kernel, c.alibi), []).append(c)
    assert all(len(v) == 2 and v[0].context <= 17 < 513 <= v[1].context and v[0].num_heads != v[1].num_heads
               for v in per.values())  # fmt: skip
    # the sizes come from the tree's launcher file (kvpatch.jit.vllm_kernel_set)
    launcher = tmp_path / "csrc/attention/paged_attention_v1.cu"
    launcher.parent.mkdir(parents=True)
    launcher.write_text("LAUNCH_PAGED_ATTENTION_V1(64);\nLAUNCH_PAGED_ATTENTION_V1(96);\n"
                        "CALL_V1_LAUNCHER_SPARSITY(T, CACHE_T, 16, IS_FP8_KV_CACHE);\n")  # fmt: skip
    assert V.vllm_sizes(tmp_path) == ((64, 96), (16,))
    assert V.vllm_sizes(None) == (V.VLLM_HEAD_SIZES, V.VLLM_BLOCK_SIZES)
    assert {c.head_size for c in V.full_matrix(head_sizes=(64, 96), block_sizes=(16,))} == {64, 96}
