"""The pure parts of kvpatch.gpu, on the CPU: dispatch rule, matrices, reference
attention (against a naive loop), fp8 decoding, block tables, poisoning, statistics,
and the whole validate/bench pipelines driven by fake CPU "kernels"."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import types

import pytest

from kvpatch.gpu import bench as B
from kvpatch.gpu import dispatch as Dp
from kvpatch.gpu import inputs as I
from kvpatch.gpu import launch as Ln
from kvpatch.gpu import points as P
from kvpatch.gpu import reference as R
from kvpatch.gpu import report as Rp
from kvpatch.gpu import stats as S
from kvpatch.gpu import timing as Tm
from kvpatch.gpu import validate as V

try:
    import torch
except ImportError:  # pragma: no cover - the CI venv may have no torch
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (pip install torch: CPU wheel is enough)")


# --------------------------------------------------------------------------- import hygiene


def _runs_ok(code: str) -> None:
    """``code`` runs in a fresh interpreter and prints ``ok``."""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "ok"


def test_package_imports_without_torch_numpy_matplotlib():
    code = (
        "import sys\n"
        "for m in ('torch', 'numpy', 'matplotlib'): sys.modules[m] = None\n"
        "import kvpatch.gpu, kvpatch.gpu.validate, kvpatch.gpu.bench, kvpatch.gpu.plot, kvpatch.gpu.commands\n"
        "import kvpatch.gpu.upstream, kvpatch.gpu.upstream_shim, kvpatch.gpu.env, kvpatch.tune\n"
        "from kvpatch.gpu.dispatch import uses_v1\n"
        "assert uses_v1(64, 32, 1024)\n"
        "print('ok')\n"
    )
    _runs_ok(code)


def test_gpu_commands_import_without_the_build_side():
    """validate/bench --lib run where kvpatch's build dependencies (git, libclang) are absent."""
    code = (
        "import sys\n"
        "for m in ('git', 'clang', 'clang.cindex', 'torch'): sys.modules[m] = None\n"
        "import kvpatch.cli, kvpatch.gpu.commands, kvpatch.render\n"
        "from kvpatch.gpu.validate import vllm_sizes\n"
        "assert vllm_sizes('/nonexistent')[0][0] == 32\n"
        "print('ok')\n"
    )
    _runs_ok(code)


# --------------------------------------------------------------------------- dispatch


@pytest.mark.parametrize(
    "seqs,heads,max_len,kernel",
    [
        (1, 32, 512, "v1"),  # one partition
        (1, 32, 513, "v2"),  # two partitions, 32 <= 512
        (16, 32, 1024, "v2"),  # 512 is not > 512
        (17, 32, 1024, "v1"),  # 544 > 512
        (64, 32, 1024, "v1"),
        (64, 32, 4096, "v1"),
        (64, 32, 8192, "v1"),  # 8192 is still <= 8192
        (64, 32, 8193, "v2"),
        (1000, 32, 16384, "v2"),
        (1, 1, 1, "v1"),
    ],
)
def test_dispatch_rule(seqs, heads, max_len, kernel):
    assert Dp.dispatched_kernel(seqs, heads, max_len) == kernel
    assert Dp.uses_v1(seqs, heads, max_len) == (kernel == "v1")


def test_default_bench_points_dispatch_v2_at_10_of_12():
    pts = B.default_points()
    assert len(pts) == 24
    fp16 = [p for p in pts if p.dtype == "fp16"]
    assert [(p.batch, p.context) for p in fp16 if p.dispatched == "v1"] == [(64, 1024), (64, 4096)]
    assert sum(p.dispatched == "v2" for p in fp16) == 10


def test_bench_point_bytes():
    p = P.BenchPoint("fp16", 64, 16384)
    assert p.block_bytes == 2 * 8 * 128 * 16 * 2
    assert p.num_blocks == 64 * 1024
    assert p.kv_bytes == 64 * 16384 * 4096  # 4.3 GB
    q = P.BenchPoint("fp16", 3, 17, kv_cache_dtype="fp8")
    assert q.blocks_per_seq == 2 and q.kv_bytes == 3 * 2 * (2 * 8 * 128 * 16)
    assert "kv=fp8" in q.name and "kv=" not in p.name


def test_pool_blocks_sizing():
    pts = B.default_points()
    l2 = 60 * 2**20
    n = P.pool_blocks(pts, l2)
    assert n >= 1.2 * 65536
    assert n * pts[0].block_bytes >= 64 * l2
    assert 4.5e9 < n * pts[0].block_bytes < 6e9  # ~5 GB, like NOTES.md


def test_make_points_and_quick():
    assert len(P.quick_points()) == 8
    with pytest.raises(ValueError):
        P.make_points(dtypes=("fp8",))
    with pytest.raises(ValueError):
        P.make_points(num_heads=30, num_kv_heads=8)


# --------------------------------------------------------------------------- validate matrix


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
                          kernels=("v2",), heads=((8, 2),), alibi=(False,), contexts=(1, 17))
    assert [c.context for c in m] == [1, 17]
    for bad in ({"dtypes": ("fp64",)}, {"kernels": ("v3",)}, {"heads": ((8, 3),)}, {"contexts": (0,)}):
        with pytest.raises(ValueError):
            V.validate_matrix(**bad)


def test_case_seq_lens():
    c = V.ValidateCase("fp16", "auto", 128, 16, "v2", 8, 2, False, 1500)
    lens = c.seq_lens(7)
    assert len(lens) == 3 and max(lens) == 1500 and min(lens) >= 1
    assert lens == c.seq_lens(7)
    assert V.ValidateCase("fp16", "auto", 128, 16, "v2", 8, 2, False, 1).seq_lens(3) == [1, 1, 1]


# --------------------------------------------------------------------------- small helpers


def test_alibi_slopes():
    s8 = I.alibi_slopes_list(8)
    assert s8 == pytest.approx([2 ** -(i + 1) for i in range(8)])
    s12 = I.alibi_slopes_list(12)
    assert len(s12) == 12 and all(0 < x < 1 for x in s12)


def test_validation_slopes_are_drawn_like_vllms_test():
    """Power-of-two slopes make the ALiBi product exact, and the models' small positive slopes
    keep the softmax flat: both hid a fused-vs-unfused multiply-add that vLLM's own test
    (randn slopes) found. The inputs draw standard-normal slopes: signed, large ones too."""
    import math
    import random

    a = I.random_alibi_slopes(64, random.Random(3))
    assert a == I.random_alibi_slopes(64, random.Random(3)) and a != I.random_alibi_slopes(64, random.Random(4))
    assert not any(x == 0 or math.log2(abs(x)).is_integer() for x in a)
    assert min(a) < -1.0 and max(a) > 1.0  # the models' slopes all lie in (0, 1)
    inp = I.make_inputs(dtype="fp16", kv_cache_dtype="auto", head_size=64, block_size=16, num_heads=16, num_kv_heads=2,
                        seq_lens=[17, 5], alibi=True, seed=1, device="cpu")
    got = inp.alibi_slopes.tolist()
    assert len(got) == 16 and min(got) < 0 < max(got) and not any(math.log2(abs(x)).is_integer() for x in got)


@needs_torch
def test_alibi_widens_the_reference_tolerance_by_the_float32_logit_rounding():
    """Standard-normal slopes over long contexts make float32 logits of |slope| x thousands:
    their rounding alone puts an exact float32 softmax beyond fp32's own 1e-4 against float64.
    The tolerance grows with the largest bias, and covers that emulation."""
    import random

    assert R.ref_tolerance("fp32", "auto") == R.REF_TOLERANCE["fp32/auto"] == R.ref_tolerance("fp32", "auto", 10.0)
    assert R.ref_tolerance("fp32", "auto", 3 * 2099) == pytest.approx(R.ALIBI_BIAS_TOLERANCE * 3 * 2099)
    assert R.ref_tolerance("bf16", "fp8", 3 * 2099) == R.REF_TOLERANCE["bf16/fp8"]  # 16-bit: its own is wider
    inp = I.make_inputs(dtype="fp32", kv_cache_dtype="auto", head_size=64, block_size=16, num_heads=4, num_kv_heads=4,
                        seq_lens=[1500, 9], alibi=True, seed=2, device="cpu")
    assert R.max_alibi_bias(inp) == pytest.approx(float(inp.alibi_slopes.abs().max()) * 1499)
    inp_off = I.make_inputs(dtype="fp32", kv_cache_dtype="auto", head_size=64, block_size=16, num_heads=4, num_kv_heads=4,
                            seq_lens=[1500], alibi=False, seed=2, device="cpu")
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


def test_statistics():
    xs = [0.5, 1.0, 2.0, 4.0]
    assert S.geomean(xs) == pytest.approx(math.sqrt(2))
    assert S.median(xs) == 1.5
    assert S.quantile([1, 2, 3, 4, 5], 0.1) == pytest.approx(1.4)
    assert S.quantile([3.0], 0.9) == 3.0
    s = S.summarize([1.1, 0.9, 1.21])
    assert s["n"] == 3 and s["min"] == 0.9 and s["median"] == 1.1 and s["max"] == 1.21
    assert s["geomean"] == pytest.approx((1.1 * 0.9 * 1.21) ** (1 / 3))
    with pytest.raises(ValueError):
        S.geomean([])
    with pytest.raises(ValueError):
        S.geomean([1.0, 0.0])


def test_parse_lib_specs():
    assert Ln.parse_lib_spec("stock=/a/b:c/s.so:stock_") == Ln.LibSpec("stock", "/a/b:c/s.so", "stock_")
    assert str(Ln.parse_lib_spec("a=x.so:p")) == "a=x.so:p"
    assert [tuple(vars(s).values()) for s in Ln.parse_lib_specs(["a=x.so:p,b=y.so:q", "c=z.so:r"])] == [
        ("a", "x.so", "p"), ("b", "y.so", "q"), ("c", "z.so", "r")]
    for bad in ("x.so:p", "a=x.so", "a=:p", "=x.so:p"):
        with pytest.raises(ValueError):
            Ln.parse_lib_spec(bad)
    with pytest.raises(ValueError):
        Ln.parse_lib_specs(["a=x.so:p", "a=y.so:q"])
    assert Ln.order_variants(["paper", "stock", "patched"]) == ["stock", "paper", "patched"]
    assert Ln.order_variants(["x", "y"]) == ["x", "y"]


def test_lib_info(tmp_path):
    f = tmp_path / "k.so"
    f.write_bytes(b"abc")
    i = Ln.lib_info(f, "pre")
    assert i["bytes"] == 3 and i["prefix"] == "pre"
    assert i["sha256"].startswith("ba7816bf")
    assert "error" in Ln.lib_info(tmp_path / "missing.so", "p")


def test_json_safe():
    assert Rp.json_safe({"a": float("nan"), "b": (1, float("inf")), 3: [1.5]}) == {
        "a": "nan", "b": [1, "inf"], "3": [1.5]}


# --------------------------------------------------------------------------- inputs


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
@pytest.mark.parametrize("dtype,kv", [("fp16", "auto"), ("bf16", "auto"), ("fp32", "auto"), ("fp16", "fp8"), ("fp32", "fp8")])
def test_make_inputs_shapes(dtype, kv):
    inp = I.make_inputs(dtype=dtype, kv_cache_dtype=kv, head_size=64, block_size=16, num_heads=8,
                        num_kv_heads=2, seq_lens=[17, 3, 40], alibi=True, seed=1, device="cpu")
    x = I.cache_x(dtype, kv)
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
    # reproducible
    again = I.make_inputs(dtype=dtype, kv_cache_dtype=kv, head_size=64, block_size=16, num_heads=8,
                          num_kv_heads=2, seq_lens=[17, 3, 40], alibi=True, seed=1, device="cpu")
    assert torch.equal(inp.key_cache, again.key_cache) and torch.equal(inp.block_tables, again.block_tables)


@needs_torch
def test_buffers_poisoned_and_written_check():
    inp = I.make_inputs(dtype="fp16", kv_cache_dtype="auto", head_size=64, block_size=16, num_heads=4,
                        num_kv_heads=4, seq_lens=[1100, 5], alibi=False, seed=0, device="cpu")
    b1 = Ln.make_buffers(inp, "v1")
    assert b1.exp_sums is None and Ln.count_unwritten(b1.out) == b1.out.numel()
    b2 = Ln.make_buffers(inp, "v2")
    assert b2.exp_sums.shape == (2, 4, 3) and b2.tmp_out.shape == (2, 4, 3, 64)
    assert b2.tmp_out.dtype == torch.float16 and b2.max_logits.dtype == torch.float32
    assert all(Ln.count_unwritten(t) == t.numel() for t in b2.tensors())
    b2.out.fill_(1.0)
    assert Ln.all_written(b2.out)
    b2.out[1, 2, 3] = float("nan")
    assert Ln.count_unwritten(b2.out) == 1 and not Ln.all_written(b2.out)
    m = Ln.written_partitions_mask([1100, 5], 4, 3, "cpu")
    assert m.shape == (2, 4, 3) and m[0].all() and m[1, :, 0].all() and not m[1, :, 1:].any()
    with pytest.raises(ValueError):
        Ln.make_buffers(inp, "v3")


# --------------------------------------------------------------------------- reference vs a naive loop


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


@needs_torch
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
                        num_kv_heads=heads[1], seq_lens=lens, alibi=alibi, seed=11, device="cpu")
    if kv == "fp8":
        assert inp.k_scale_value != 1.0 and inp.v_scale_value != 1.0
    ref = R.reference_attention(inp)
    assert ref.dtype == torch.float64 and ref.shape == inp.query.shape
    naive = torch.tensor(naive_attention(inp), dtype=torch.float64)
    assert torch.allclose(ref, naive, rtol=1e-10, atol=1e-12)
    ref32 = R.reference_attention(inp, compute_dtype=torch.float32)
    assert R.max_rel_l2_per_seq(ref32, naive) < 1e-5


@needs_torch
def test_reference_single_token_is_its_value():
    inp = I.make_inputs(dtype="fp32", kv_cache_dtype="auto", head_size=16, block_size=16, num_heads=2,
                        num_kv_heads=1, seq_lens=[1], alibi=True, seed=3, device="cpu")
    blk = int(inp.block_tables[0, 0])
    v = inp.value_cache[blk, 0, :, 0].double()
    ref = R.reference_attention(inp)
    assert torch.allclose(ref[0, 0], v) and torch.allclose(ref[0, 1], v)


@needs_torch
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


# --------------------------------------------------------------------------- fake kernels: whole pipelines on CPU


class FakeKernels:
    """Computes attention with the reference (rounded to the query dtype) and writes
    vLLM's output buffers; ``fault`` breaks it on purpose."""

    def __init__(self, fault: str | None = None, configs=None, says_configs: bool = True):
        self.fault = fault
        if says_configs:
            self.configs = configs if configs is not None else tuple(
                Ln.config_label(d, kv, h, b) for d in I.DTYPES for kv in I.KV_CACHE_DTYPES
                for h in (16, 32, 64, 128) for b in (8, 16, 32))
        self.says_configs = says_configs
        self.calls = 0

    def _compute(self, out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
                 block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale, v_scale):
        self.calls += 1
        if not self.says_configs and query.dtype == torch.float32:
            raise RuntimeError("failed for fp32/...: not built")
        inp = I.AttentionInputs(
            query=query, key_cache=key_cache, value_cache=value_cache, block_tables=block_tables,
            seq_lens=seq_lens, seq_lens_list=seq_lens.tolist(), num_kv_heads=num_kv_heads, scale=scale,
            block_size=block_size, max_seq_len=max_seq_len, alibi_slopes=alibi_slopes,
            kv_cache_dtype=kv_cache_dtype, k_scale=k_scale, v_scale=v_scale,
            k_scale_value=float(k_scale[0]), v_scale_value=float(v_scale[0]))
        res = R.reference_attention(inp).to(out.dtype)
        if self.fault == "unwritten":
            res[-1, -1, -1] = float("nan")
        elif self.fault == "offbyone":
            res.view(-1)[0] = torch.nextafter(res.view(-1)[0], torch.tensor(math.inf, dtype=res.dtype))
        elif self.fault == "crash":
            raise RuntimeError("illegal memory access")
        out.copy_(res)
        return res

    def v1(self, out, *args):
        self._compute(out, *args)

    def v2(self, out, exp_sums, max_logits, tmp_out, *args):
        res = self._compute(out, *args)
        seq_lens = args[6]
        for i, L in enumerate(seq_lens.tolist()):
            p = Dp.num_partitions(L)
            exp_sums[i, :, :p] = 1.0 + (self.fault == "scratch")
            max_logits[i, :, :p] = 0.5
            tmp_out[i, :, :p] = res[i][:, None, :]


def _tiny_matrix():
    return V.validate_matrix(dtypes=("fp16", "fp32"), kv_cache_dtypes=("auto", "fp8"), head_sizes=(32,),
                             block_sizes=(16,), kernels=("v1", "v2"), heads=((4, 2),), alibi=(True,),
                             contexts=(17, 530))


@needs_torch
def test_run_validate_all_pass_on_cpu():
    libs = {"patched": FakeKernels(), "stock": FakeKernels()}
    rep = V.run_validate(libs, _tiny_matrix(), seed=5, device="cpu")
    assert rep.variants == ["stock", "patched"] and rep.baseline == "stock"
    assert rep.ok and rep.failures == [] and rep.n_passed == 16
    assert all(r.ref_error is not None and r.ref_error < r.tolerance for r in rep.results)
    assert rep.max_ref_error()["fp32/auto"] < 1e-6 and rep.max_ref_error()["fp32/fp8"] < 1e-6
    d = json.loads(rep.to_json())
    assert d["ok"] and d["counts"] == {"cases": 16, "passed": 16, "failed": 0, "skipped": 0}
    assert d["results"][0]["name"].startswith("v1 q=fp16 kv=auto")
    assert libs["stock"].calls == 32  # twice per case
    assert "16 passed, 0 failed, 0 skipped" in rep.summary_line()


@needs_torch
@pytest.mark.parametrize("fault,why", [
    ("unwritten", "not written"),
    ("offbyone", "differs from stock: 1 elements"),
    ("crash", "raised RuntimeError"),
])
def test_run_validate_names_failures(fault, why):
    libs = {"stock": FakeKernels(), "good": FakeKernels(), "bad": FakeKernels(fault)}
    rep = V.run_validate(libs, _tiny_matrix()[:3], seed=1, device="cpu")
    assert not rep.ok and rep.n_failed == 3
    assert len(rep.failures) == 3
    for line in rep.failures:
        assert line.startswith(("bad: v1 q=fp16 kv=", "bad: v2 q=fp16 kv=")) and why in line and "seed" in line
    assert all(r.variants["good"].status == "pass" for r in rep.results)


@needs_torch
def test_run_validate_v2_scratch_compared():
    libs = {"stock": FakeKernels(), "bad": FakeKernels("scratch")}
    cases = [c for c in _tiny_matrix() if c.kernel == "v2"][:1]
    rep = V.run_validate(libs, cases, seed=1, device="cpu")
    assert rep.n_failed == 1 and "exp_sums differ" in rep.failures[0]


@needs_torch
def test_run_validate_stock_checked_against_reference():
    libs = {"stock": FakeKernels("unwritten"), "v": FakeKernels("unwritten")}
    rep = V.run_validate(libs, _tiny_matrix()[:1], seed=1, device="cpu")
    assert rep.n_failed == 1
    assert any(f.startswith("stock: ") and "not written" in f for f in rep.failures)


@needs_torch
def test_run_validate_skips_unbuilt_configs():
    fp16 = tuple(c for c in FakeKernels().configs if c.startswith("fp16/"))
    libs = {"stock": FakeKernels(configs=fp16), "v": FakeKernels(configs=fp16)}
    rep = V.run_validate(libs, _tiny_matrix(), seed=1, device="cpu")
    assert rep.ok and rep.n_passed == 8 and len(rep.skipped) == 8
    assert all("q=fp32" in s and "fp32/" in s and "not built in stock" in s for s in rep.skipped)
    assert libs["stock"].calls == 16  # skipped cases launch nothing
    none = V.run_validate(libs, [c for c in _tiny_matrix() if c.dtype == "fp32"], seed=1, device="cpu")
    assert not none.ok and none.failures == []  # nothing validated is not ok
    # a library that cannot list its configurations: a RuntimeError from stock means "not built"
    mute = {"stock": FakeKernels(says_configs=False), "v": FakeKernels(says_configs=False)}
    rep = V.run_validate(mute, _tiny_matrix(), seed=1, device="cpu")
    assert rep.ok and len(rep.skipped) == 8 and "raised RuntimeError" in rep.skipped[0]


@needs_torch
def test_run_validate_variant_missing_config_or_stock_crash_fails():
    full = FakeKernels().configs
    libs = {"stock": FakeKernels(), "v": FakeKernels(configs=tuple(c for c in full if not c.startswith("fp32/")))}
    rep = V.run_validate(libs, _tiny_matrix(), seed=1, device="cpu")
    assert rep.n_failed == 8 and all("not built in this library" in f and f.startswith("v: ") for f in rep.failures)
    crash = {"stock": FakeKernels("crash"), "v": FakeKernels()}
    rep = V.run_validate(crash, _tiny_matrix()[:2], seed=1, device="cpu")
    assert rep.n_failed == 2 and all(f.startswith("stock: ") and "illegal memory" in f for f in rep.failures)


def run_cli(*args: str) -> int:
    """kvpatch's CLI in this process (so monkeypatches apply); the exit code it would give."""
    from kvpatch import cli
    from kvpatch.errors import KvpatchError

    try:
        cli.app(list(args), standalone_mode=False)
    except KvpatchError as e:
        return e.exit_code
    return 0


@needs_torch
def test_validate_with_prebuilt_libs_exit_codes(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(Ln, "load_libs", lambda specs: {s.name: FakeKernels("offbyone" if s.name == "bad" else None)
                                                        for s in specs})
    info = tmp_path / "variants.json"
    info.write_text(json.dumps({"good": "lookahead=1 size=auto", "stock": "stock"}))
    common = ["--dtypes", "fp32", "--kv", "auto", "--head-sizes", "32", "--block-sizes", "16", "--kernels", "v1",
              "--heads", "4/2", "--alibi", "off", "--contexts", "17", "--device", "cpu"]
    out = tmp_path / "v.json"
    rc = run_cli("validate", "--lib", "stock=s.so:s", "--lib", "good=g.so:g", "--variant-info", str(info),
                 "--json", str(out), *common)
    d = json.loads(out.read_text())
    assert rc == 0 and d["ok"] and d["matrix"] == "custom" and d["identical"] == {"good": {"checked": 1, "identical": 1}}
    assert d["env"]["libs"]["good"]["marker"] == "lookahead=1 size=auto" and d["env"]["libs"]["good"]["so"] == "g.so"
    capsys.readouterr()
    rc = run_cli("validate", "--lib", "stock=s.so:s,bad=b.so:b", *common)
    assert rc == 6  # the documented 'GPU check failed'
    captured = capsys.readouterr()
    assert "bad: v1 q=fp32 kv=auto head=32 block=16 heads=4/2 alibi=off ctx=17" in captured.err
    assert "bad: 0/1 bit-identical" in captured.out
    assert run_cli("validate", "--lib", "stock=s.so", *common) == 2  # no prefix
    assert run_cli("validate", "--lib", "s=s.so:s", "--quick", "--full", "--device", "cpu") == 2


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
               for v in per.values())
    # the sizes come from the tree's launcher file (kvpatch.jit.vllm_kernel_set)
    launcher = tmp_path / "csrc/attention/paged_attention_v1.cu"
    launcher.parent.mkdir(parents=True)
    launcher.write_text("LAUNCH_PAGED_ATTENTION_V1(64);\nLAUNCH_PAGED_ATTENTION_V1(96);\n"
                        "CALL_V1_LAUNCHER_SPARSITY(T, CACHE_T, 16, IS_FP8_KV_CACHE);\n")
    assert V.vllm_sizes(tmp_path) == ((64, 96), (16,))
    assert V.vllm_sizes(None) == (V.VLLM_HEAD_SIZES, V.VLLM_BLOCK_SIZES)


# --------------------------------------------------------------------------- bench pipeline and stats


def _synthetic_report():
    names = ["stock", "fast", "slow"]
    pts = [P.BenchPoint("fp16", 1, 1024), P.BenchPoint("fp16", 64, 1024), P.BenchPoint("bf16", 1, 1024)]
    raw = {}
    for p in pts:
        for k in ("v1", "v2"):
            for m in ("warm", "cold"):
                base = 100.0 if k == "v1" else 50.0
                raw[(p, k, m)] = {
                    "stock": [[base, base * 1.1, base * 0.9], [base] * 3],
                    "fast": [[base / 2] * 3, [base / 2] * 3],
                    "slow": [[base * 1.25] * 3, [base * 1.25] * 3],
                }
    results = Rp.finish_results(raw, names, copy_bytes_per_s=4e12)
    return Rp.BenchReport(baseline="stock", variants=names, results=results,
                         copy_bandwidth={"bytes_per_s": 4e12}, settings={"reps": 3}, env={"gpu": {"name": "fake"}})


def test_finish_results_stats():
    rep = _synthetic_report()
    r = next(x for x in rep.results if x.point.batch == 64 and x.kernel == "v1" and x.mode == "warm")
    assert r.dispatched
    st = r.variants["stock"]
    assert st.round_medians_us == [100.0, 100.0] and st.median_us == 100.0
    assert st.p10_us == pytest.approx(95.0) and st.p90_us == pytest.approx(105.0)
    assert r.variants["fast"].speedup == 2.0 and r.variants["slow"].speedup == 0.8
    assert r.variants["fast"].speedup_rounds == [2.0, 2.0]
    kvb = r.point.kv_bytes
    assert r.variants["fast"].kv_bytes_per_s == pytest.approx(kvb / 50e-6)
    assert r.variants["fast"].copy_fraction == pytest.approx(kvb / 50e-6 / 4e12)


def test_summary_over_dispatched_points():
    rep = _synthetic_report()
    rows = {(s["variant"], s["dtype"], s["mode"], s["scope"]): s for s in rep.summary}
    fast = rows[("fast", "fp16", "warm", "dispatched")]
    assert fast["n"] == 2 and fast["min"] == 2.0 and fast["geomean"] == pytest.approx(2.0)
    assert rows[("slow", "bf16", "cold", "dispatched")]["n"] == 1
    assert rows[("slow", "fp16", "warm", "v1")]["n"] == 2
    assert ("stock", "fp16", "warm", "dispatched") not in rows
    mixed = Rp.summarize_results(rep.results, ["stock", "fast"])
    assert {r["variant"] for r in mixed} == {"fast"}


def test_bench_report_json_and_tables(tmp_path):
    rep = _synthetic_report()
    path = tmp_path / "r.json"
    path.write_text(rep.to_json())
    d = json.loads(path.read_text())
    assert d["kind"] == "kvpatch-bench" and d["variants"] == ["stock", "fast", "slow"]
    assert len(d["results"]) == 12 and d["results"][0]["variants"]["stock"]["samples_us"][0] == pytest.approx([100.0, 110.0, 90.0])
    assert {s["scope"] for s in d["summary"]} == {"dispatched", "v1", "v2"}
    from rich.console import Console

    from kvpatch.render import print_bench

    c = Console(record=True, width=250)
    print_bench(rep, c)
    text = c.export_text()
    assert "v1*" in text and "2.00" in text and "0.80" in text and "geomean" in text
    assert "[2.00..2.00]" in text and "slower" in text


def test_plot_bench_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    from kvpatch.gpu import plot as P

    rep = _synthetic_report()
    series = P.speedup_series(rep)
    assert set(series) == {("fp16", "warm"), ("fp16", "cold"), ("bf16", "warm"), ("bf16", "cold")}
    assert series[("fp16", "warm")]["series"]["fast"]["speedup"] == [2.0, 2.0]
    out = P.plot_bench(json.loads(rep.to_json()), tmp_path / "r.png")
    data = open(out, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


@needs_torch
def test_run_bench_on_cpu_with_fakes(tmp_path):
    libs = {"stock": FakeKernels(), "paper": FakeKernels(), "broken": FakeKernels("offbyone")}
    pts = P.make_points(dtypes=("fp16",), batches=(1, 2), contexts=(16, 600), num_heads=4, num_kv_heads=2,
                        head_size=32, block_size=16)
    msgs = []
    rep = B.run_bench(libs, pts, reps=3, warmup=1, rounds=2, device="cpu", l2_bytes=1 << 16,
                      copy_bytes=1 << 20, variant_info={"paper": {"preset": "paper"}}, progress=msgs.append)
    assert rep.variants == ["stock", "paper", "broken"]
    assert len(rep.results) == 4 * 2 * 2
    for r in rep.results:
        for n, t in r.variants.items():
            assert len(t.samples_us) == 2 and all(len(s) == 3 for s in t.samples_us)  # 2 rounds x 3 reps
            assert t.median_us > 0 and t.kv_bytes_per_s > 0
        assert r.variants["paper"].outputs_match is True and r.variants["broken"].outputs_match is False
    assert len(rep.mismatches) == 8 and all(m.startswith("broken: ") for m in rep.mismatches)
    assert rep.copy_bandwidth["bytes_per_s"] > 0 and rep.copy_bandwidth["bytes_moved"] == 2 << 20
    assert rep.settings["pools"][0]["blocks"] >= 1.2 * 2 * 38
    assert rep.env["variants"]["paper"] == {"preset": "paper"}
    assert any(m.startswith("pool 1/1") for m in msgs)
    d = json.loads(rep.to_json())
    assert d["settings"]["modes"] == ["warm", "cold"] and d["env"]["torch"] == torch.__version__
    assert {r["dispatched"] for r in d["results"]} == {True, False}
    lead = d["settings"]["lead"]  # every timed round went through chunks; none late on the CPU (no sleep)
    assert lead["chunks"] >= 4 * 2 * 2 and lead["retried"] == lead["host_bound"] == 0
    assert not any("host" in w for w in rep.warnings)
    assert not rep.ok


@needs_torch
def test_run_bench_warns_when_chunks_stay_host_bound(monkeypatch):
    """A sleep that has always ended before the host is done: every chunk is timed twice,
    counted as host-bound, and the report says so."""
    monkeypatch.setattr(Tm.Timer, "lead", lambda self, seconds: types.SimpleNamespace(query=lambda: True))
    libs = {"stock": FakeKernels(), "v": FakeKernels()}
    pts = P.make_points(dtypes=("fp16",), batches=(1,), contexts=(16,), num_heads=4, num_kv_heads=2,
                        head_size=32, block_size=16)
    rep = B.run_bench(libs, pts, reps=2, warmup=1, rounds=1, device="cpu", l2_bytes=1 << 16, copy_bytes=1 << 16)
    lead = rep.settings["lead"]
    assert lead["host_bound"] > 0 and lead["chunks"] == Tm.LEAD_ATTEMPTS * lead["host_bound"]
    assert any(f"{lead['host_bound']} of {lead['chunks']} chunks" in w for w in rep.warnings)


@needs_torch
def test_run_bench_aa_control_times_the_baseline_again():
    """--aa adds stock's own kernels as one more variant: every slower verdict it gets is
    counted as stock code (the method's false verdicts), and its outputs equal stock's."""
    stock, other = FakeKernels(), FakeKernels()
    pts = P.make_points(dtypes=("fp16",), batches=(1,), contexts=(16,), num_heads=4, num_kv_heads=2, head_size=32,
                        block_size=16)
    rep = B.run_bench({"stock": stock, "v": other}, pts, reps=2, warmup=1, rounds=2, device="cpu", l2_bytes=1 << 16,
                      copy_bytes=1 << 16, kernels=("v1",), adaptive=False, aa=True, variant_info={"stock": {"so": "s.so"}})
    assert rep.variants == ["stock", "v", B.AA]
    assert rep.variant_info[B.AA] == {"so": "s.so", "marker": "stock", "aa_of": "stock"}
    assert all(r.variants[B.AA].outputs_match for r in rep.results)
    assert stock.calls == 2 * other.calls  # the A/A launches stock's kernels
    assert all(Rp.stock_code_of(rep.variant_info, "stock")(B.AA, r) is True for r in rep.results)
    row = next(r for r in rep.summary if r["variant"] == B.AA and r["scope"] == "dispatched")
    assert row["slower_stock_code"] == row["slower"]
    with pytest.raises(ValueError, match="A/A"):
        B.run_bench({"stock": stock, B.AA: other}, pts, reps=1, rounds=1, device="cpu", l2_bytes=1 << 16,
                    copy_bytes=1 << 16, aa=True)


@needs_torch
def test_bench_with_prebuilt_libs_on_cpu(monkeypatch, tmp_path, capsys):
    from kvpatch.gpu import bench as Bn

    monkeypatch.setattr(Ln, "load_libs", lambda specs: {s.name: FakeKernels() for s in specs})
    real = Bn.run_bench

    def small(libs, points, **kw):
        kw.update(l2_bytes=1 << 16, copy_bytes=1 << 20)
        return real(libs, points, **kw)

    monkeypatch.setattr(Bn, "run_bench", small)
    info = tmp_path / "info.json"
    info.write_text(json.dumps({"patched": {"marker": "lookahead=2", "compile_flags": ["-O3"]}}))
    rc = run_cli("bench", "--lib", "stock=s.so:s", "--lib", "patched=p.so:p", "--device", "cpu", "--dtypes", "bf16",
                 "--batches", "1", "--contexts", "40", "--heads", "4/2", "--head-sizes", "32", "--reps", "2",
                 "--rounds", "2", "--no-cold", "--aa", "--json", str(tmp_path / "r.json"), "--variant-info", str(info),
                 *(["--plot", str(tmp_path / "r.png")] if _has_mpl() else []))
    assert rc == 0
    d = json.loads((tmp_path / "r.json").read_text())
    assert d["point_set"] == "custom" and d["variant_info"]["patched"]["marker"] == "lookahead=2"
    assert d["variant_info"]["patched"]["compile_flags"] == ["-O3"] and d["variant_info"]["stock"]["so"] == "s.so"
    assert d["variant_info"]["stock"]["marker"] == "stock" and d["variants"] == ["stock", "patched", "stock-aa"]
    assert [p["head_size"] for p in d["settings"]["points"]] == [32]
    row = d["summary"][0]
    assert row["faster"] + row["noise"] + row["slower"] == row["n"]
    assert "speedup over stock" in capsys.readouterr().out


def _has_mpl() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("n", range(1, 10))
def test_carryover_order_puts_every_launcher_after_every_launcher_once(n):
    order = Tm.carryover_order(n)
    assert len(order) == n * n and all(order.count(i) == n for i in range(n))
    pairs = {(order[k - 1], order[k]) for k in range(len(order))}  # cyclic: the last precedes the first
    assert pairs == {(a, b) for a in range(n) for b in range(n)}


def test_time_interleaved_balances_predecessors_and_counts():
    if torch is None:
        pytest.skip("torch is not installed")
    order = []
    fns = [lambda i=i: (order.append(i), time.sleep(0.02 * i * i)) for i in range(3)]  # 0, 20, 80 ms
    flushes = []
    us = Tm.time_interleaved(fns, reps=3, warmup=1, timer=Tm.Timer("cpu"), flush=lambda: flushes.append(1))
    assert [len(u) for u in us] == [3, 3, 3]
    assert order[:3] == [0, 1, 2]  # warm-up
    assert order[3:] == Tm.carryover_order(3) == [0, 0, 1, 0, 2, 1, 1, 2, 2]
    assert len(flushes) == 12
    # each time (us) is its own launcher's: sleep never ends early, and the margins (20 ms,
    # 60 ms) outlast a loaded CI machine's stalls (the 2/4 ms of an earlier version did not)
    assert max(us[0]) < 20_000 <= min(us[1]) and max(us[1]) < 80_000 <= min(us[2])
    us = Tm.time_interleaved(fns, reps=4, warmup=0, timer=Tm.Timer("cpu"))
    assert [len(u) for u in us] == [6, 6, 6]  # reps rounded up to whole cycles


class _LeadTimer:
    """A host-clock timer whose GPU-side leads are recorded; the lead's end event says
    'already passed' for the leads listed in ``late`` (by index)."""

    def __init__(self, late=()):
        self.leads, self.late, self.log = [], set(late), []
        self.chunks = self.retried = self.host_bound = 0

    def events(self, n):
        return [Tm.HostEvent() for _ in range(n)]

    def sync(self):
        pass

    def lead(self, seconds):
        self.leads.append(seconds)
        self.log.append("lead")
        passed = len(self.leads) - 1 in self.late
        return types.SimpleNamespace(query=lambda: passed)


def test_time_interleaved_queues_each_chunk_within_its_lead_and_retimes_a_late_one(monkeypatch):
    """Each chunk starts with a lead that covers 1.3x the host's time to queue it; chunks are
    whole cycles where a cycle fits in MAX_CHUNK; a chunk whose lead had ended is timed again
    with twice the lead, its first samples dropped; one late every time is counted."""
    monkeypatch.setattr(Tm, "CHUNK_LEAD_S", 10.0)
    monkeypatch.setattr(Tm, "MAX_CHUNK", 10)  # one 9-launch cycle per chunk
    fns = [lambda i=i: timer.log.append(i) for i in range(3)]
    timer = _LeadTimer(late={1})
    us = Tm.time_interleaved(fns, reps=6, warmup=1, timer=timer)
    cycle = Tm.carryover_order(3)
    assert [len(u) for u in us] == [6, 6, 6]
    # warm-up, then chunk 1, chunk 2 (late: timed again), chunk 2 again
    assert timer.log == [0, 1, 2] + ["lead", *cycle] * 3
    assert timer.chunks == 3 and timer.retried == 1 and timer.host_bound == 0
    first, late, again = timer.leads
    assert first == pytest.approx(late) and again == pytest.approx(2 * late) and first >= 1.3 * 9 * Tm.EVENT_COST_S
    timer = _LeadTimer(late=set(range(100)))
    Tm.time_interleaved(fns, reps=3, warmup=0, timer=timer)
    assert timer.chunks == Tm.LEAD_ATTEMPTS and timer.host_bound == 1
    # a cycle longer than MAX_CHUNK: chunks of MAX_CHUNK launches, the sequence unchanged
    monkeypatch.setattr(Tm, "MAX_CHUNK", 4)
    timer = _LeadTimer()
    us = Tm.time_interleaved(fns, reps=6, warmup=0, timer=timer)
    seq = cycle * 2
    assert timer.log == [x for k in range(0, 18, 4) for x in ["lead", *seq[k:k + 4]]]
    assert [len(u) for u in us] == [6, 6, 6] and timer.chunks == 5
    # the chunk is what the host queues in about CHUNK_LEAD_S: a tiny one, one launch each
    monkeypatch.setattr(Tm, "CHUNK_LEAD_S", 0.0)
    timer = _LeadTimer()
    Tm.time_interleaved(fns, reps=3, warmup=0, timer=timer)
    assert timer.log == [x for i in cycle for x in ["lead", i]]


@needs_torch
def test_run_bench_refuses_unbuilt_points():
    libs = {"stock": FakeKernels(), "v": FakeKernels(configs=("fp16/auto/32/16",))}
    pts = P.make_points(dtypes=("fp16", "bf16"), batches=(1,), contexts=(16,), num_heads=4, num_kv_heads=2,
                        head_size=32, block_size=16)
    with pytest.raises(ValueError, match="bf16/auto/32/16 not built in v"):
        B.run_bench(libs, pts, reps=1, rounds=1, device="cpu", l2_bytes=1 << 16, copy_bytes=1 << 16)


KERNELS_COMMON_ARGS = ["query", "key_cache", "value_cache", "num_kv_heads", "scale", "block_tables", "seq_lens",
                       "block_size", "max_seq_len", "alibi_slopes", "kv_cache_dtype", "k_scale", "v_scale"]


def _kernels_params():
    import inspect

    v1 = list(inspect.signature(Ln.Kernels.v1).parameters)[1:]
    v2 = list(inspect.signature(Ln.Kernels.v2).parameters)[1:]
    return v1, v2


def test_kernels_take_vllms_op_arguments():
    v1, v2 = _kernels_params()
    assert v1 == ["out", *KERNELS_COMMON_ARGS]
    assert v2 == ["out", "exp_sums", "max_logits", "tmp_out", *KERNELS_COMMON_ARGS]


def test_launch_argument_order_matches_kernels():
    """launch.launch passes vLLM's op arguments in Kernels' order."""
    pytest.importorskip("torch")
    _, v2 = _kernels_params()

    class Rec:
        def v1(self, *a):
            self.args = a

        def v2(self, *a):
            self.args = a

    inp = I.make_inputs(dtype="fp16", kv_cache_dtype="fp8", head_size=32, block_size=16, num_heads=4,
                        num_kv_heads=2, seq_lens=[600], alibi=True, seed=0, device="cpu")
    r = Rec()
    b = Ln.make_buffers(inp, "v2")
    Ln.launch(r, "v2", inp, b)
    got = dict(zip(v2, r.args))
    assert got["out"] is b.out and got["tmp_out"] is b.tmp_out and got["exp_sums"] is b.exp_sums
    assert got["key_cache"] is inp.key_cache and got["kv_cache_dtype"] == "fp8"
    assert got["max_seq_len"] == 600 and got["block_size"] == 16 and got["num_kv_heads"] == 2
    assert got["alibi_slopes"] is inp.alibi_slopes and got["v_scale"] is inp.v_scale


def test_scale_by_value_kernels_get_host_numbers_not_tensors():
    """vLLM 0.6.4's kernels take k/v scale by value: the launcher passes the host values, so
    no launch reads a device tensor back (a sync that bench would time)."""
    pytest.importorskip("torch")
    _, v2 = _kernels_params()

    class Rec:
        scale_by_value = True

        def v2(self, *a):
            self.args = a

    inp = I.make_inputs(dtype="fp16", kv_cache_dtype="fp8", head_size=32, block_size=16, num_heads=4,
                        num_kv_heads=2, seq_lens=[600], alibi=False, seed=0, device="cpu")
    r = Rec()
    Ln.launch(r, "v2", inp, Ln.make_buffers(inp, "v2"))
    got = dict(zip(v2, r.args))
    assert (got["k_scale"], got["v_scale"]) == (inp.k_scale_value, inp.v_scale_value)
    assert isinstance(got["k_scale"], float) and isinstance(got["v_scale"], float)


# --------------------------------------------------------------------------- the honest method (issue 8, part 1)


def test_speedup_interval_and_verdict():
    base = [[10.0, 10.0], [10.0, 10.0], [10.0, 10.0]]
    faster = [[8.0, 8.0], [9.0, 9.0], [7.0, 7.0]]
    lo, hi = S.speedup_interval(base, faster)
    assert (lo, hi) == (pytest.approx(10 / 9), pytest.approx(10 / 7)) and S.verdict(lo, hi) == S.FASTER
    slower = [[11.0], [12.0], [10.5]]
    assert S.verdict(*S.speedup_interval([[10.0]] * 3, slower)) == S.SLOWER
    mixed = [[9.5], [10.5], [10.0]]
    assert S.verdict(*S.speedup_interval([[10.0]] * 3, mixed)) == S.NOISE
    # one round: the quartile box
    lo, hi = S.speedup_interval([[9.0, 10.0, 11.0, 12.0, 10.0]], [[9.0, 10.0, 11.0, 12.0, 10.0]])
    assert lo < 1.0 < hi
    assert math.isnan(S.speedup_interval([[]], [[]])[0])
    assert S.verdict(math.nan, math.nan) == S.NOISE


def test_summary_counts_points_within_noise():
    names = ["stock", "v"]
    raw = {}
    for i, (b, ctx) in enumerate([(1, 1024), (4, 1024), (16, 1024)]):
        p = P.BenchPoint("fp16", b, ctx)
        per_round = [[10.0], [10.0], [10.0]]
        v = [[[8.0], [8.5], [8.2]], [[10.2], [9.8], [10.0]], [[11.0], [11.5], [10.8]]][i]
        raw[(p, p.dispatched, "warm")] = {"stock": per_round, "v": v}
    rep = Rp.BenchReport("stock", names, Rp.finish_results(raw, names, 4e12), {}, {})
    row = next(r for r in rep.summary if r["scope"] == "dispatched")
    assert (row["faster"], row["noise"], row["slower"], row["n"]) == (1, 1, 1, 3)
    assert row["worst_hi"] == pytest.approx(10 / 10.8)
    d = json.loads(rep.to_json())
    t = d["results"][2]["variants"]["v"]
    assert t["verdict"] == "slower" and t["speedup_hi"] < 1.0


#: The start of a subprocess script in which importing clang or git fails, as on the H200
#: (no libclang there): what the GPU-side commands must work without.
WITHOUT_CLANG_AND_GIT = """import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("clang", "git"):
            raise ImportError(f"blocked: {name}")
sys.meta_path.insert(0, Block())
"""


def test_bench_reports_need_no_libclang():
    """The GPU machine runs bench/validate/tune on prebuilt libraries without libclang (or
    git): reading variant markers into a summary must not import the build side."""
    import textwrap

    code = WITHOUT_CLANG_AND_GIT + textwrap.dedent("""
        import json
        import kvpatch.cli, kvpatch.gpu.commands, kvpatch.gpu.tune_command, kvpatch.tune
        from kvpatch.config import make_config
        from kvpatch.gpu import points as P, report as Rp
        p = P.BenchPoint("fp16", 4, 1024)
        names = ["stock", "v"]
        raw = {(p, p.dispatched, "warm"): {"stock": [[10.0]] * 3, "v": [[10.5], [10.6], [10.4]]}}
        info = {"stock": {"marker": "stock"}, "v": {"marker": make_config(inherit_rules=False, fp16="off").marker()}}
        rep = Rp.BenchReport("stock", names, Rp.finish_results(raw, names, 4e12), {}, {}, variant_info=info)
        row = json.loads(rep.to_json())["summary"][0]
        assert row["slower"] == 1 and row["slower_stock_code"] == 1, row
        assert not [m for m in sys.modules if m.startswith(("clang", "git", "kvpatch.jit"))]
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@pytest.mark.parametrize("command", ["tune", "validate", "bench"])
def test_commands_on_prebuilt_libraries_need_no_libclang(tmp_path, command):
    """tune, validate and bench given --lib get as far as the GPU check without libclang or git
    (the H200 has neither): here, with no GPU, that is the one-line "no CUDA" error, exit 5."""
    import textwrap

    lib = tmp_path / "libx.so"
    lib.write_bytes(b"")
    code = WITHOUT_CLANG_AND_GIT + textwrap.dedent("""
        from kvpatch.cli import run
        sys.argv = ["kvpatch"] + sys.argv[1:]
        run()
    """)
    args = [command, "--lib", f"stock={lib}:kvpatch_stock", "--lib", f"v={lib}:kvpatch_v"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=env,
                       cwd=tmp_path)  # fmt: skip
    assert r.returncode == 5, r.stderr[-2000:]
    assert "blocked" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert "torch" in r.stderr


def test_no_module_needs_libclang_to_import():
    """Every package imports without libclang and git (tune on the H200 imports kvpatch.jit
    for the machine record); parsing a header without libclang is a one-line PatchError."""
    import textwrap

    code = WITHOUT_CLANG_AND_GIT + textwrap.dedent("""
        import kvpatch.api, kvpatch.jit, kvpatch.cli, kvpatch.patch, kvpatch.tune
        from kvpatch.jit import plan, toolchain, vllm_nvcc_flags
        from kvpatch.machine import local
        from kvpatch.errors import PatchError
        local(arch="sm_90a")
        assert not [m for m in sys.modules if m.startswith(("clang", "git"))]
        try:
            kvpatch.patch.find_sites("int x;", "a.cuh")
        except PatchError as e:
            assert "libclang" in str(e) and "\\n" not in str(e), e
            print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_summary_says_which_slower_points_run_stock_code():
    """A slower verdict on a kernel the variant compiles as stock (a rule turns it off, or an fp8
    cache under quantized=skip) compares stock's code with itself: the summary counts those apart."""
    import io

    from rich.console import Console

    from kvpatch.config import make_config
    from kvpatch.render import bench_summary_table

    names = ["stock", "v", "unknown"]
    raw = {}
    for dtype, kv in (("fp16", "auto"), ("bf16", "auto"), ("bf16", "fp8")):
        p = P.BenchPoint(dtype, 4, 1024, kv_cache_dtype=kv)
        slow = [[10.5], [10.6], [10.4]]
        raw[(p, p.dispatched, "warm")] = {"stock": [[10.0]] * 3, "v": slow, "unknown": slow}
    marker = make_config(inherit_rules=False, fp16="off").marker()
    info = {"stock": {"marker": "stock"}, "v": {"marker": marker}, "unknown": {"compile_flags": []}}
    rep = Rp.BenchReport("stock", names, Rp.finish_results(raw, names, 4e12), {}, {}, variant_info=info)
    rows = {(r["variant"], r["dtype"]): r for r in rep.summary if r["scope"] == "dispatched"}
    assert rows[("v", "fp16")]["slower"] == 1 and rows[("v", "fp16")]["slower_stock_code"] == 1  # fp16 off
    assert rows[("v", "bf16")]["slower"] == 2 and rows[("v", "bf16")]["slower_stock_code"] == 1  # fp8: skipped
    assert rows[("unknown", "bf16")]["slower"] == 2 and rows[("unknown", "bf16")]["slower_stock_code"] is None
    out = io.StringIO()
    Console(file=out, width=300).print(bench_summary_table(rep))
    assert "2 (1 stock code)" in out.getvalue() and "1 (1 stock code)" in out.getvalue()


def test_adaptive_reps():
    assert Tm.adaptive_reps(50, 100.0) == 50
    assert Tm.adaptive_reps(50, 30.0) == 50
    assert Tm.adaptive_reps(50, 12.0) == 150
    assert Tm.adaptive_reps(50, 1.0) == 200  # capped at 4x
    assert Tm.adaptive_reps(50, float("nan")) == 50


@needs_torch
def test_l2_flush_reads_and_writes_twice_the_l2():
    f = Tm.L2Flush("cpu", l2_bytes=1 << 12)
    assert f.nbytes >= 2 * (1 << 12) and f.buf.numel() * 4 == f.nbytes
    f()
    f()
    assert bool((f.buf == 2.0).all())  # every element read and written each time
    assert float(f.sink) == 2.0 * f.buf.numel()  # and read again
    assert "add_" in f.method and "zero_" not in f.method
    with pytest.raises(ValueError, match="2x the L2"):
        Tm.L2Flush("cpu", l2_bytes=1 << 12, nbytes=1 << 12)


def test_decode_clock_event_reasons():
    from kvpatch.gpu import env as E

    assert E.decode_event_reasons("0x0000000000000000") == []
    assert E.decode_event_reasons("0x0000000000000004") == ["sw_power_cap"]
    assert E.decode_event_reasons("0x0000000000000041") == ["gpu_idle", "hw_thermal_slowdown"]
    assert E.decode_event_reasons(0x1000) == ["bit_0x1000"]
    assert E.decode_event_reasons("[N/A]") == [] and E.decode_event_reasons("") == []


def test_window_summary_flags_power_capped_rounds():
    from kvpatch.gpu import env as E

    lines = [
        "2026/11/30 12:00:00.000, 0, 1980, 3201, 650.10, 700.00, 60, 0x0000000000000000",
        "2026/11/30 12:00:00.100, 0, 1755, 3201, 699.80, 700.00, 62, 0x0000000000000004",
        "2026/11/30 12:00:00.200, 0, 1980, 3201, 500.00, 700.00, 61, 0x0000000000000000",
        "garbage line",
    ]
    samples = [s for s in map(E.parse_sample_line, lines) if s is not None]
    assert len(samples) == 3 and samples[1].reasons == ("sw_power_cap",) and samples[0].sm_mhz == 1980.0
    t0 = samples[0].t
    w = E.window_summary(samples, t0 - 0.01, t0 + 0.15)
    assert w["samples"] == 2 and w["sm_mhz"] == [1755.0, 1980.0] and w["power_w"] == [650.1, 699.8]
    assert w["power_capped"] and w["flagged"] and w["throttled"] == ["sw_power_cap"]
    calm = E.window_summary(samples, t0 + 0.15, t0 + 0.25)
    assert calm["samples"] == 1 and not calm["flagged"]
    assert E.window_summary(samples, t0 + 10, t0 + 11) == {"t0": t0 + 10, "t1": t0 + 11, "samples": 0}


def test_point_sets():
    tuning = P.point_set("tuning")
    headline = P.point_set("headline")
    heldout = P.point_set("heldout")
    assert len(tuning) == 2 * 3 * 2 * 3 * 9 and len(headline) == 24
    assert {(p.num_heads, p.num_kv_heads) for p in tuning} == {(32, 8), (32, 32), (64, 8)}
    assert {p.seed for p in tuning} == {0} and {p.seed for p in headline} == {1}
    # every tuned instantiation gets both kernels: v1 at context 512 and at batch 32 x 2048
    per_inst = {}
    for p in tuning:
        per_inst.setdefault((p.dtype, p.head_size, p.block_size), []).append(p.dispatched)
    assert len(per_inst) == 12 and all(k.count("v1") == 12 and k.count("v2") == 15 for k in per_inst.values())
    assert P.kernel_selector("bf16", 64, 32, "fp8_e5m2", "v2") == "bf16/64/32/fp8/v2"
    assert len(heldout) == 8 * 2 * 12 and 0 not in {p.seed for p in heldout}
    # no published point is a tuning point: other batches and contexts, other seeds
    published = {(p.dtype, p.shape, p.batch, p.context) for p in headline + heldout}
    assert not published & {(p.dtype, p.shape, p.batch, p.context) for p in tuning}
    shapes = {(p.num_heads, p.num_kv_heads, p.head_size, p.block_size, p.kv_cache_dtype) for p in heldout}
    assert shapes == {(32, 8, 128, 16, "auto"), (32, 8, 64, 16, "auto"), (32, 8, 256, 16, "auto"),
                      (32, 8, 128, 32, "auto"), (64, 8, 128, 16, "auto"), (8, 1, 128, 16, "auto"),
                      (32, 32, 128, 16, "auto"), (32, 8, 128, 16, "fp8")}
    # tune never sees a held-out (shape, seed) pair
    assert not {(p.shape, p.seed) for p in heldout} & {(p.shape, p.seed) for p in tuning}
    with pytest.raises(ValueError):
        P.point_set("everything")


def test_bench_points_from_options():
    from kvpatch.errors import UsageError
    from kvpatch.gpu.commands import BenchOptions, bench_points, marker_of, parse_heads

    pts, name = bench_points(BenchOptions())
    assert name == "headline" and len(pts) == 24
    pts, name = bench_points(BenchOptions(point_set="heldout", heads=[(8, 1)], batches=[64]))
    assert name == "heldout" and len(pts) == 2 * 3 and {p.num_kv_heads for p in pts} == {1}
    pts, name = bench_points(BenchOptions(head_sizes=[64, 256], block_sizes=[32], heads=parse_heads("32/8,8/1"),
                                          batches=[1], contexts=[1024], dtypes=["bf16"], seed=7))
    assert name == "custom" and len(pts) == 4 and {p.seed for p in pts} == {7}
    pts, _ = bench_points(BenchOptions(point_set="tuning", seed=5))
    assert {p.seed for p in pts} == {5}
    assert len(bench_points(BenchOptions(quick=True))[0]) == 8
    with pytest.raises(UsageError):
        bench_points(BenchOptions(point_set="tuning", batches=[3]))
    with pytest.raises(UsageError):
        parse_heads("32")
    header = "x\n    // kvpatch:begin key lookahead=1 size=auto issue=call\n  y\n    // kvpatch:begin value lookahead=1\n"
    assert marker_of(header) == "lookahead=1 size=auto issue=call" and marker_of("plain") == "stock"


def test_validate_cases_from_options():
    from kvpatch.errors import UsageError
    from kvpatch.gpu.commands import ValidateOptions, validate_cases

    cases, name, _ = validate_cases(ValidateOptions())
    assert name == "default" and len(cases) == 1440
    cases, name, sampling = validate_cases(ValidateOptions(full=True, dtypes=["bf16"], alibi=[True], block_sizes=[32]))
    assert name == "full" and "filtered" in sampling
    assert {c.dtype for c in cases} == {"bf16"} and {c.block_size for c in cases} == {32} and all(c.alibi for c in cases)
    assert {c.head_size for c in cases} == set(V.VLLM_HEAD_SIZES)
    cases, name, _ = validate_cases(ValidateOptions(dtypes=["fp16"], head_sizes=[80], contexts=[5]))
    assert name == "custom" and {c.head_size for c in cases} == {80} and len(cases) == 2 * 2 * 2 * 2 * 2
    with pytest.raises(UsageError):
        validate_cases(ValidateOptions(quick=True, full=True))
    with pytest.raises(UsageError):
        validate_cases(ValidateOptions(quick=True, head_sizes=[32]))  # filters everything out
