"""Random inputs laid out as vLLM's paged_attention_v1/v2 ops take them.

* query ``[num_seqs, num_heads, head_size]``
* key_cache ``[num_blocks, num_kv_heads, head_size // x, block_size, x]``,
  ``x = 16 // element size of the cache dtype`` (fp8: uint8 storage, x = 16)
* value_cache ``[num_blocks, num_kv_heads, head_size, block_size]``
* block_tables int32 ``[num_seqs, max_blocks_per_seq]``, seq_lens int32 ``[num_seqs]``

Never zeros: randn data (fp8: random valid e4m3 bytes), scattered block tables that
include physical block 0. Runs on any torch device (the tests use the CPU); torch is
imported inside functions only.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from .. import dtypes as D
from ..errors import UsageError
from .dispatch import cdiv, num_partitions

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: The query dtypes and KV-cache dtypes the GPU checks draw inputs for.
DTYPES = tuple(D.QUERY_DTYPES)  # fp16, bf16, fp32
KV_CACHE_DTYPES = ("auto", "fp8")

#: fp8 (e4m3) test data: magnitude bytes drawn below this (exponent field <= 9:
#: |value| <= 7.5, subnormals and zero included); never the NaN codes 0x7F / 0xFF.
FP8_MAX_MAGNITUDE_BYTE = 0x50


def torch_dtype(name: str) -> "torch.dtype":
    """``fp16`` / ``bf16`` / ``fp32`` -> the torch dtype (names from :mod:`kvpatch.dtypes`)."""
    import torch

    return getattr(torch, D.query_dtype(name).torch)


def check_kv_cache_dtype(kv_cache_dtype: str) -> str:
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise UsageError(f"unknown kv cache dtype {kv_cache_dtype!r}: choose {' or '.join(KV_CACHE_DTYPES)}")
    return kv_cache_dtype


def cache_elem_size(dtype: str, kv_cache_dtype: str) -> int:
    """Bytes per KV-cache element: the query dtype's for ``auto``, 1 for ``fp8``."""
    return D.cache_elem_size(dtype, check_kv_cache_dtype(kv_cache_dtype))


def cache_x(dtype: str, kv_cache_dtype: str) -> int:
    """The key cache's innermost dimension: 16 bytes' worth of elements."""
    return 16 // cache_elem_size(dtype, kv_cache_dtype)


def alibi_slopes_list(num_heads: int) -> list[float]:
    """ALiBi slopes as in the paper/vLLM's models (power-of-two heads, interleaved rest)."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest != num_heads:
        extra_base = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        n_rest = min(closest, num_heads - closest)
        slopes += [extra_base ** (1 + 2 * i) for i in range(n_rest)]
    return slopes


def random_alibi_slopes(num_heads: int, rng: random.Random) -> list[float]:
    """Standard-normal slopes, as vLLM's kernel test draws them (``torch.randn``): signed,
    of every magnitude, (almost surely) not powers of two. A check of bit-identity needs them. With the
    models' power-of-two slopes ``slope * (token - seq_len + 1)`` is exact, so a kernel whose
    compiler fused the ALiBi multiply-add rounds like one that did not; with the models'
    magnitudes scaled by a random factor (what kvpatch drew before) the softmax stays flat,
    and an ulp in a float logit reaches a 16-bit v1 output only now and then. On the H200
    (the eval-tune-7 probe, benchmarks/ARCHIVE.md) two such v1 kernels differed from stock in 14
    of 24 cases (0-32 outputs each) with scaled model slopes and in 24 of 24 (10-3135
    outputs) with these."""
    return [rng.gauss(0.0, 1.0) for _ in range(num_heads)]


# --------------------------------------------------------------------------- fp8 bytes


def e4m3_value(byte: int) -> float:
    """Decode one OCP fp8 e4m3 ("fn": no infinities, 0x7F / 0xFF NaN) byte."""
    sign = -1.0 if byte & 0x80 else 1.0
    exp = (byte >> 3) & 0xF
    man = byte & 0x7
    if exp == 0xF and man == 0x7:
        return math.nan
    if exp == 0:
        return sign * man * 2.0**-9  # subnormal: man/8 * 2^(1-7)
    return sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)


def e4m3_table() -> list[float]:
    """All 256 e4m3 values, by byte."""
    return [e4m3_value(b) for b in range(256)]


def random_e4m3_bytes(
    shape: Sequence[int],
    *,
    device: "torch.device | str",
    generator: "torch.Generator",
    max_magnitude_byte: int = FP8_MAX_MAGNITUDE_BYTE,
) -> "torch.Tensor":
    """uint8 tensor of valid e4m3 codes: random sign, magnitude byte < max (never NaN)."""
    import torch

    if not 1 <= max_magnitude_byte <= 0x7F:
        raise ValueError("max_magnitude_byte must be in 1..0x7F (0x7F is NaN)")
    mag = torch.randint(0, max_magnitude_byte, tuple(shape), device=device, generator=generator, dtype=torch.int16)
    sign = torch.randint(0, 2, tuple(shape), device=device, generator=generator, dtype=torch.int16) * 0x80
    return (mag | sign).to(torch.uint8)


# --------------------------------------------------------------------------- inputs


@dataclass
class AttentionInputs:
    """One call's worth of inputs, laid out as vLLM's ops take them."""

    query: "torch.Tensor"
    key_cache: "torch.Tensor"
    value_cache: "torch.Tensor"
    block_tables: "torch.Tensor"
    seq_lens: "torch.Tensor"
    seq_lens_list: list[int]
    num_kv_heads: int
    scale: float
    block_size: int
    max_seq_len: int
    alibi_slopes: "torch.Tensor | None"
    kv_cache_dtype: str
    k_scale: "torch.Tensor"
    v_scale: "torch.Tensor"
    k_scale_value: float
    v_scale_value: float

    @property
    def num_seqs(self) -> int:
        return int(self.query.shape[0])

    @property
    def num_heads(self) -> int:
        return int(self.query.shape[1])

    @property
    def head_size(self) -> int:
        return int(self.query.shape[2])

    @property
    def max_num_partitions(self) -> int:
        return num_partitions(self.max_seq_len)


def make_generator(device: "torch.device | str", seed: int) -> "torch.Generator":
    import torch

    g = torch.Generator(device=torch.device(device))
    g.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF)
    return g


def make_kv_pool(
    num_blocks: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    dtype: str,
    kv_cache_dtype: str,
    *,
    device: "torch.device | str",
    generator: "torch.Generator",
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Random key and value caches (randn; fp8: random valid e4m3 bytes), never zeros."""
    import torch

    x = cache_x(dtype, kv_cache_dtype)
    if head_size % x:
        raise ValueError(f"head_size {head_size} is not a multiple of x={x}")
    kshape = (num_blocks, num_kv_heads, head_size // x, block_size, x)
    vshape = (num_blocks, num_kv_heads, head_size, block_size)
    if kv_cache_dtype == "fp8":
        k = random_e4m3_bytes(kshape, device=device, generator=generator)
        v = random_e4m3_bytes(vshape, device=device, generator=generator)
    else:
        td = torch_dtype(dtype)
        k = torch.randn(kshape, device=device, dtype=td, generator=generator)
        v = torch.randn(vshape, device=device, dtype=td, generator=generator)
    return k, v


def make_block_tables(
    seq_lens: Sequence[int],
    block_size: int,
    num_blocks: int,
    *,
    seed: int,
    include_block_zero: bool = True,
    extra_cols: int = 0,
) -> "torch.Tensor":
    """A scattered int32 block table (CPU): every used entry a distinct physical block,
    drawn from a random permutation of the pool.

    With ``include_block_zero``, physical block 0 is always among the used entries,
    placed in the longest sequence at a position >= 1 where it has two blocks (so it
    is some loop iteration's *next* block: the paper's "0 means none" sentinel).
    ``extra_cols`` unused columns at the end hold random valid block numbers.
    """
    import torch

    needed = [cdiv(L, block_size) for L in seq_lens]
    total = sum(needed)
    if total > num_blocks:
        raise ValueError(f"{total} blocks needed but the pool has {num_blocks}")
    g = torch.Generator().manual_seed(int(seed) & 0xFFFF_FFFF_FFFF)
    perm = torch.randperm(num_blocks, generator=g)
    used = perm[:total].clone()
    if include_block_zero and total:
        longest = max(range(len(seq_lens)), key=lambda i: needed[i])
        start = sum(needed[:longest])
        n = needed[longest]
        rng = random.Random(seed)
        target = start + (rng.randrange(1, n) if n >= 2 else 0)
        where = (used == 0).nonzero()
        if len(where):  # 0 already used somewhere: swap it into the target slot
            j = int(where[0, 0])
            used[j], used[target] = used[target].clone(), used[j].clone()
        else:
            used[target] = 0
    width = max(max(needed, default=0) + extra_cols, 1)
    table = torch.randint(0, num_blocks, (len(seq_lens), width), generator=g, dtype=torch.int32)
    off = 0
    for i, n in enumerate(needed):
        table[i, :n] = used[off : off + n].to(torch.int32)
        off += n
    return table


def make_inputs(
    *,
    dtype: str,
    kv_cache_dtype: str,
    head_size: int,
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    seq_lens: Sequence[int],
    alibi: bool,
    seed: int,
    device: "torch.device | str",
    num_blocks: int | None = None,
    spare_blocks: int = 5,
    include_block_zero: bool = True,
    kv_pool: tuple["torch.Tensor", "torch.Tensor"] | None = None,
    max_seq_len: int | None = None,
) -> AttentionInputs:
    """Fresh random inputs for one call: randn query, a random pool of ``num_blocks``
    (default: exactly what the sequences need plus ``spare_blocks``), a scattered
    block table with one spare column, random fp8 scales (1.0 for ``auto``), and with
    ``alibi`` random standard-normal slopes (:func:`random_alibi_slopes`).

    Pass ``kv_pool`` to reuse existing caches (the bench's shared pool), ``max_seq_len`` to
    size the launch for more tokens than the longest sequence (as vLLM's CUDA graphs do)."""
    import torch

    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if not seq_lens or min(seq_lens) < 1:
        raise ValueError("every sequence needs at least one token")
    if max_seq_len is not None and max_seq_len < max(seq_lens):
        raise ValueError(f"max_seq_len {max_seq_len} is shorter than the longest sequence ({max(seq_lens)})")
    device = torch.device(device)
    g = make_generator(device, seed)
    rng = random.Random(seed)
    td = torch_dtype(dtype)
    need = sum(cdiv(L, block_size) for L in seq_lens)
    if kv_pool is not None:
        key_cache, value_cache = kv_pool
        num_blocks = int(key_cache.shape[0])
    else:
        if num_blocks is None:
            num_blocks = need + spare_blocks
        key_cache, value_cache = make_kv_pool(
            num_blocks, num_kv_heads, head_size, block_size, dtype, kv_cache_dtype, device=device, generator=g
        )
    block_tables = make_block_tables(
        seq_lens, block_size, num_blocks, seed=seed, include_block_zero=include_block_zero, extra_cols=1
    ).to(device)
    query = torch.randn((len(seq_lens), num_heads, head_size), device=device, dtype=td, generator=g)
    if kv_cache_dtype == "fp8":
        k_scale_value = rng.uniform(0.25, 2.0)
        v_scale_value = rng.uniform(0.25, 2.0)
    else:
        k_scale_value = v_scale_value = 1.0
    slopes = torch.tensor(random_alibi_slopes(num_heads, rng), dtype=torch.float32, device=device) if alibi else None
    return AttentionInputs(
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=block_tables,
        seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32, device=device),
        seq_lens_list=[int(L) for L in seq_lens],
        num_kv_heads=num_kv_heads,
        scale=1.0 / math.sqrt(head_size),
        block_size=block_size,
        max_seq_len=int(max_seq_len if max_seq_len is not None else max(seq_lens)),
        alibi_slopes=slopes,
        kv_cache_dtype=kv_cache_dtype,
        k_scale=torch.tensor([k_scale_value], dtype=torch.float32, device=device),
        v_scale=torch.tensor([v_scale_value], dtype=torch.float32, device=device),
        k_scale_value=k_scale_value,
        v_scale_value=v_scale_value,
    )
