"""kvpatch.gpu.launch: naming and loading libraries (``NAME=path.so:prefix``), the NaN-poisoned
output buffers, and a launch made with vLLM's op arguments in :class:`Kernels`' order."""

from __future__ import annotations

import inspect

import pytest
from gpu_helpers import needs_torch, torch

from kvpatch.errors import UsageError
from kvpatch.gpu import inputs as I
from kvpatch.gpu import launch as Ln


def test_parse_lib_specs():
    assert Ln.parse_lib_spec("stock=/a/b:c/s.so:stock_") == Ln.LibSpec("stock", "/a/b:c/s.so", "stock_")
    assert str(Ln.parse_lib_spec("a=x.so:p")) == "a=x.so:p"
    assert [tuple(vars(s).values()) for s in Ln.parse_lib_specs(["a=x.so:p,b=y.so:q", "c=z.so:r"])] == [
        ("a", "x.so", "p"), ("b", "y.so", "q"), ("c", "z.so", "r")]  # fmt: skip
    for bad in ("x.so:p", "a=x.so", "a=:p", "=x.so:p", "a b=x.so:p", "-a=x.so:p"):
        with pytest.raises(UsageError):
            Ln.parse_lib_spec(bad)
    with pytest.raises(UsageError, match="given twice: a"):
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


def test_is_built_says_none_for_a_library_that_cannot_list_its_configurations():
    class Lists:
        configs = ("fp16/auto/128/16",)

    assert Ln.is_built(Lists(), "fp16/auto/128/16") is True
    assert Ln.is_built(Lists(), "bf16/auto/128/16") is False
    assert Ln.is_built(object(), "fp16/auto/128/16") is None


@needs_torch
def test_buffers_poisoned_and_written_check():
    inp = I.make_inputs(dtype="fp16", kv_cache_dtype="auto", head_size=64, block_size=16, num_heads=4,
                        num_kv_heads=4, seq_lens=[1100, 5], alibi=False, seed=0, device="cpu")  # fmt: skip
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
    Ln.poison(b2)
    assert all(Ln.count_unwritten(t) == t.numel() for t in b2.tensors())
    m = Ln.written_partitions_mask([1100, 5], 4, 3, "cpu")
    assert m.shape == (2, 4, 3) and m[0].all() and m[1, :, 0].all() and not m[1, :, 1:].any()
    with pytest.raises(UsageError):
        Ln.make_buffers(inp, "v3")


KERNELS_COMMON_ARGS = ["query", "key_cache", "value_cache", "num_kv_heads", "scale", "block_tables", "seq_lens",
                       "block_size", "max_seq_len", "alibi_slopes", "kv_cache_dtype", "k_scale", "v_scale"]  # fmt: skip


def _kernels_params():
    v1 = list(inspect.signature(Ln.Kernels.v1).parameters)[1:]
    v2 = list(inspect.signature(Ln.Kernels.v2).parameters)[1:]
    return v1, v2


def test_kernels_take_vllms_op_arguments():
    v1, v2 = _kernels_params()
    assert v1 == ["out", *KERNELS_COMMON_ARGS]
    assert v2 == ["out", "exp_sums", "max_logits", "tmp_out", *KERNELS_COMMON_ARGS]


class _Recorder:
    """A library that records the arguments of its last call."""

    def __init__(self, scale_by_value: bool = False):
        self.scale_by_value = scale_by_value

    def v1(self, *a):
        self.args = a

    def v2(self, *a):
        self.args = a


@needs_torch
def test_launch_argument_order_matches_kernels():
    """launch.launch passes vLLM's op arguments in Kernels' order."""
    v1, v2 = _kernels_params()
    inp = I.make_inputs(dtype="fp16", kv_cache_dtype="fp8", head_size=32, block_size=16, num_heads=4,
                        num_kv_heads=2, seq_lens=[600], alibi=True, seed=0, device="cpu")  # fmt: skip
    r = _Recorder()
    b = Ln.make_buffers(inp, "v2")
    Ln.launch(r, "v2", inp, b)
    got = dict(zip(v2, r.args))
    assert got["out"] is b.out and got["tmp_out"] is b.tmp_out and got["exp_sums"] is b.exp_sums
    assert got["key_cache"] is inp.key_cache and got["kv_cache_dtype"] == "fp8"
    assert got["max_seq_len"] == 600 and got["block_size"] == 16 and got["num_kv_heads"] == 2
    assert got["alibi_slopes"] is inp.alibi_slopes and got["v_scale"] is inp.v_scale
    b1 = Ln.make_buffers(inp, "v1")
    Ln.launch(r, "v1", inp, b1)
    got = dict(zip(v1, r.args))
    assert got["out"] is b1.out and got["query"] is inp.query and got["k_scale"] is inp.k_scale


@needs_torch
def test_scale_by_value_kernels_get_host_numbers_not_tensors():
    """vLLM 0.6.4's kernels take k/v scale by value: the launcher passes the host values, so
    no launch reads a device tensor back (a sync that bench would time)."""
    _, v2 = _kernels_params()
    inp = I.make_inputs(dtype="fp16", kv_cache_dtype="fp8", head_size=32, block_size=16, num_heads=4,
                        num_kv_heads=2, seq_lens=[600], alibi=False, seed=0, device="cpu")  # fmt: skip
    r = _Recorder(scale_by_value=True)
    Ln.launch(r, "v2", inp, Ln.make_buffers(inp, "v2"))
    got = dict(zip(v2, r.args))
    assert (got["k_scale"], got["v_scale"]) == (inp.k_scale_value, inp.v_scale_value)
    assert isinstance(got["k_scale"], float) and isinstance(got["v_scale"], float)
