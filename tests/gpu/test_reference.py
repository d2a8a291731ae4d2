"""kvpatch.gpu.reference: the float64 reference attention (against a naive loop over vLLM's
layouts), the relative L2 error, and the tolerances stock is held to."""

from __future__ import annotations

import math
import random

import pytest

torch = pytest.importorskip("torch")

from kvpatch.gpu import inputs as I  # noqa: E402
from kvpatch.gpu import reference as R  # noqa: E402


def naive_attention(inp) -> list:
    """Plain Python loops over tokens, straight from vLLM's layouts."""
    q = inp.query.double().tolist()
    kc, vc = inp.key_cache, inp.value_cache
    fp8 = inp.kv_cache_dtype == "fp8"
    table = inp.block_tables.tolist()
    bs = inp.block_size
    d = inp.head_size
    x = kc.shape[-1]
    qpk = inp.num_heads // inp.num_kv_heads
    slopes = inp.alibi_slopes.tolist() if inp.alibi_slopes is not None else None

    def val(t, idx, scale):
        v = t[idx].item()
        return I.e4m3_value(int(v)) * scale if fp8 else float(v)

    out = []
    for i, L in enumerate(inp.seq_lens_list):
        rows = []
        for h in range(inp.num_heads):
            g = h // qpk
            logits = []
            for tok in range(L):
                blk, off = table[i][tok // bs], tok % bs
                dot = sum(q[i][h][e] * val(kc, (blk, g, e // x, off, e % x), inp.k_scale_value) for e in range(d))
                lg = inp.scale * dot
                if slopes is not None:
                    lg += slopes[h] * (tok - L + 1)
                logits.append(lg)
            m = max(logits)
            w = [math.exp(lg - m) for lg in logits]
            z = sum(w)
            row = []
            for e in range(d):
                acc = 0.0
                for tok in range(L):
                    blk, off = table[i][tok // bs], tok % bs
                    acc += w[tok] / z * val(vc, (blk, g, e, off), inp.v_scale_value)
                row.append(acc)
            rows.append(row)
        out.append(rows)
    return out


@pytest.mark.parametrize(
    "dtype,kv,heads,alibi,lens,bs",
    [
        ("fp32", "auto", (4, 2), False, [1, 17, 9], 8),  # GQA, partial last block, one-token sequence
        ("fp16", "auto", (4, 4), True, [23, 5], 16),  # MHA + ALiBi
        ("bf16", "fp8", (4, 1), True, [19, 33], 16),  # fp8 dequant with scales, MQA
        ("fp32", "fp8", (2, 2), False, [40], 32),
    ],
)
def test_reference_matches_naive_loop(dtype, kv, heads, alibi, lens, bs):
    inp = I.make_inputs(dtype=dtype, kv_cache_dtype=kv, head_size=16, block_size=bs, num_heads=heads[0],
                        num_kv_heads=heads[1], seq_lens=lens, alibi=alibi, seed=11, device="cpu")  # fmt: skip
    if kv == "fp8":
        assert inp.k_scale_value != 1.0 and inp.v_scale_value != 1.0
    ref = R.reference_attention(inp)
    assert ref.dtype == torch.float64 and ref.shape == inp.query.shape
    naive = torch.tensor(naive_attention(inp), dtype=torch.float64)
    assert torch.allclose(ref, naive, rtol=1e-10, atol=1e-12)
    ref32 = R.reference_attention(inp, compute_dtype=torch.float32)
    assert R.max_rel_l2_per_seq(ref32, naive) < 1e-5


def test_reference_single_token_is_its_value():
    inp = I.make_inputs(dtype="fp32", kv_cache_dtype="auto", head_size=16, block_size=16, num_heads=2,
                        num_kv_heads=1, seq_lens=[1], alibi=True, seed=3, device="cpu")  # fmt: skip
    blk = int(inp.block_tables[0, 0])
    v = inp.value_cache[blk, 0, :, 0].double()
    ref = R.reference_attention(inp)
    assert torch.allclose(ref[0, 0], v) and torch.allclose(ref[0, 1], v)


def test_rel_l2():
    a = torch.tensor([3.0, 4.0])
    assert R.rel_l2(a, a) == 0.0
    assert R.rel_l2(torch.tensor([3.0, 4.5]), a) == pytest.approx(0.1)
    assert R.rel_l2(torch.zeros(2), torch.zeros(2)) == 0.0
    assert math.isnan(R.rel_l2(torch.tensor([float("nan"), 1.0]), a))
    ref = torch.ones(2, 3)
    out = ref.clone()
    out[1] *= 1.5
    assert R.max_rel_l2_per_seq(out, ref) == pytest.approx(0.5)


@pytest.mark.slow
def test_alibi_widens_the_reference_tolerance_by_the_float32_logit_rounding():
    """Standard-normal slopes over long contexts make float32 logits of |slope| x thousands:
    their rounding alone puts an exact float32 softmax beyond fp32's own 1e-4 against float64.
    The tolerance grows with the largest bias, and covers that emulation."""
    assert R.ref_tolerance("fp32", "auto") == R.REF_TOLERANCE["fp32/auto"] == R.ref_tolerance("fp32", "auto", 10.0)
    assert R.ref_tolerance("fp32", "auto", 3 * 2099) == pytest.approx(R.ALIBI_BIAS_TOLERANCE * 3 * 2099)
    assert R.ref_tolerance("bf16", "fp8", 3 * 2099) == R.REF_TOLERANCE["bf16/fp8"]  # 16-bit: its own is wider
    inp = I.make_inputs(dtype="fp32", kv_cache_dtype="auto", head_size=64, block_size=16, num_heads=4, num_kv_heads=4,
                        seq_lens=[1500, 9], alibi=True, seed=2, device="cpu")  # fmt: skip
    assert R.max_alibi_bias(inp) == pytest.approx(float(inp.alibi_slopes.abs().max()) * 1499)
    inp_off = I.make_inputs(dtype="fp32", kv_cache_dtype="auto", head_size=64, block_size=16, num_heads=4,
                            num_kv_heads=4, seq_lens=[1500], alibi=False, seed=2, device="cpu")  # fmt: skip
    assert R.max_alibi_bias(inp_off) == 0.0
    rng, gen = random.Random(5), torch.Generator().manual_seed(5)
    beyond_base = 0
    for _ in range(60):
        L, d, s = 4096, 128, rng.gauss(0.0, 1.0)
        q = torch.randn(d, dtype=torch.float64, generator=gen)
        k = torch.randn(L, d, dtype=torch.float64, generator=gen) * 0.5
        v = torch.randn(L, d, dtype=torch.float64, generator=gen)
        pos = torch.arange(L, dtype=torch.float64) - (L - 1)
        ref = torch.softmax((k @ q) / d**0.5 + s * pos, 0) @ v
        l32 = (k.float() @ q.float()) / d**0.5 + torch.tensor(s, dtype=torch.float32) * pos.float()
        err = float((torch.softmax(l32, 0) @ v.float()).double().sub(ref).norm() / ref.norm())
        assert err < R.ref_tolerance("fp32", "auto", abs(s) * (L - 1))
        beyond_base += err >= R.REF_TOLERANCE["fp32/auto"]
    assert beyond_base > 0  # without the ALiBi term, stock would "fail" its own reference
