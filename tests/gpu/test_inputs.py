"""kvpatch.gpu.inputs: random inputs in vLLM's layouts -- ALiBi slopes, fp8 (e4m3) bytes and
their values, scattered block tables that hold block 0, and whole input sets."""

from __future__ import annotations

import math
import random

import pytest
from gpu_helpers import needs_torch, torch

from kvpatch.gpu import inputs as I


def test_alibi_slopes():
    s8 = I.alibi_slopes_list(8)
    assert s8 == pytest.approx([2 ** -(i + 1) for i in range(8)])
    s12 = I.alibi_slopes_list(12)
    assert len(s12) == 12 and all(0 < x < 1 for x in s12)


def test_validation_slopes_are_drawn_like_vllms_test():
    """Power-of-two slopes make the ALiBi product exact, and the models' small positive slopes
    keep the softmax flat: both hid a fused-vs-unfused multiply-add that vLLM's own test
    (randn slopes) found. The inputs draw standard-normal slopes: signed, large ones too."""
    a = I.random_alibi_slopes(64, random.Random(3))
    assert a == I.random_alibi_slopes(64, random.Random(3)) and a != I.random_alibi_slopes(64, random.Random(4))
    assert not any(x == 0 or math.log2(abs(x)).is_integer() for x in a)
    assert min(a) < -1.0 and max(a) > 1.0  # the models' slopes all lie in (0, 1)


@needs_torch
def test_make_inputs_draws_its_alibi_slopes_like_vllms_test():
    inp = I.make_inputs(dtype="fp16", kv_cache_dtype="auto", head_size=64, block_size=16, num_heads=16, num_kv_heads=2,
                        seq_lens=[17, 5], alibi=True, seed=1, device="cpu")  # fmt: skip
    got = inp.alibi_slopes.tolist()
    assert len(got) == 16 and min(got) < 0 < max(got) and not any(math.log2(abs(x)).is_integer() for x in got)


def test_e4m3_decoding():
    assert I.e4m3_value(0x00) == 0.0
    assert I.e4m3_value(0x80) == 0.0 and math.copysign(1, I.e4m3_value(0x80)) == -1
    assert I.e4m3_value(0x38) == 1.0  # exp 7, man 0
    assert I.e4m3_value(0x7E) == 448.0
    assert I.e4m3_value(0xFE) == -448.0
    assert I.e4m3_value(0x01) == 2.0**-9
    assert math.isnan(I.e4m3_value(0x7F)) and math.isnan(I.e4m3_value(0xFF))
    assert I.e4m3_value(I.FP8_MAX_MAGNITUDE_BYTE - 1) == 7.5


@needs_torch
def test_e4m3_table_matches_torch_float8():
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("torch has no float8_e4m3fn")
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    t = b.view(torch.float8_e4m3fn).to(torch.float64)
    ours = torch.tensor(I.e4m3_table(), dtype=torch.float64)
    assert torch.equal(torch.isnan(t), torch.isnan(ours))
    ok = ~torch.isnan(t)
    assert torch.equal(t[ok], ours[ok])


@needs_torch
def test_block_tables_scattered_distinct_with_block_zero():
    lens = [40, 5, 33]
    for seed in range(20):
        t = I.make_block_tables(lens, 16, 20, seed=seed, extra_cols=1)
        assert t.dtype == torch.int32 and t.shape == (3, 4)
        used = torch.cat([t[0, :3], t[1, :1], t[2, :3]])
        assert len(set(used.tolist())) == 7
        assert int((t == 0).sum()) >= 1
        assert 0 in t[0, 1:3].tolist()  # block 0 in the longest sequence, as a "next" block
        assert int(t.min()) >= 0 and int(t.max()) < 20
    with pytest.raises(ValueError):
        I.make_block_tables([100], 16, 3, seed=0)


@needs_torch
def test_block_tables_are_scattered():
    t = I.make_block_tables([16 * 200], 16, 1000, seed=1)
    d = torch.diff(t[0].long())
    assert int((d == 1).sum()) < 10  # not contiguous


@needs_torch
def test_random_fp8_bytes_never_nan():
    g = I.make_generator("cpu", 0)
    b = I.random_e4m3_bytes((100_000,), device="cpu", generator=g)
    assert b.dtype == torch.uint8
    assert not bool(((b == 0x7F) | (b == 0xFF)).any())
    assert int((b & 0x7F).max()) < I.FP8_MAX_MAGNITUDE_BYTE
    assert 0.4 < float((b >> 7).float().mean()) < 0.6


@needs_torch
@pytest.mark.parametrize(
    "dtype,kv", [("fp16", "auto"), ("bf16", "auto"), ("fp32", "auto"), ("fp16", "fp8"), ("fp32", "fp8")]
)
def test_make_inputs_shapes(dtype, kv):
    inp = I.make_inputs(dtype=dtype, kv_cache_dtype=kv, head_size=64, block_size=16, num_heads=8,
                        num_kv_heads=2, seq_lens=[17, 3, 40], alibi=True, seed=1, device="cpu")  # fmt: skip
    x = I.cache_x(dtype, kv)
    assert x == ({"fp16": 8, "bf16": 8, "fp32": 4}[dtype] if kv == "auto" else 16)  # 16 bytes, as vLLM's
    assert inp.key_cache.shape[1:] == (2, 64 // x, 16, x)
    assert inp.value_cache.shape[1:] == (2, 64, 16)
    assert inp.key_cache.dtype == (torch.uint8 if kv == "fp8" else I.torch_dtype(dtype))
    assert inp.query.shape == (3, 8, 64) and inp.query.dtype == I.torch_dtype(dtype)
    assert inp.block_tables.shape == (3, 4) and inp.max_seq_len == 40 and inp.max_num_partitions == 1
    assert inp.seq_lens.dtype == torch.int32 and inp.seq_lens.tolist() == [17, 3, 40]
    assert inp.alibi_slopes.shape == (8,) and inp.k_scale.shape == (1,)
    assert not bool((inp.query == 0).all())
    if kv == "auto":
        assert inp.k_scale_value == 1.0
    sized = I.make_inputs(dtype=dtype, kv_cache_dtype=kv, head_size=64, block_size=16, num_heads=8, num_kv_heads=2,
                          seq_lens=[17, 3, 40], alibi=True, seed=1, device="cpu", max_seq_len=1100)  # fmt: skip
    assert sized.max_seq_len == 1100 and sized.max_num_partitions == 3 and sized.seq_lens.tolist() == [17, 3, 40]
    assert torch.equal(sized.key_cache, inp.key_cache) and torch.equal(sized.query, inp.query)
    with pytest.raises(ValueError, match="max_seq_len 39 is shorter than the longest sequence .40."):
        I.make_inputs(dtype=dtype, kv_cache_dtype=kv, head_size=64, block_size=16, num_heads=8, num_kv_heads=2,
                      seq_lens=[17, 3, 40], alibi=True, seed=1, device="cpu", max_seq_len=39)  # fmt: skip
    # reproducible
    again = I.make_inputs(dtype=dtype, kv_cache_dtype=kv, head_size=64, block_size=16, num_heads=8,
                          num_kv_heads=2, seq_lens=[17, 3, 40], alibi=True, seed=1, device="cpu")  # fmt: skip
    assert torch.equal(inp.key_cache, again.key_cache) and torch.equal(inp.block_tables, again.block_tables)
