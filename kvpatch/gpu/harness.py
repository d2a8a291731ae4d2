"""What validation and benchmarking share: inputs, the reference, dispatch, launches.

Layouts are vLLM's (the paged_attention_v1/v2 torch ops):

* query ``[num_seqs, num_heads, head_size]``
* key_cache ``[num_blocks, num_kv_heads, head_size // x, block_size, x]``,
  ``x = 16 // element size of the cache dtype`` (fp8: uint8 storage, x = 16)
* value_cache ``[num_blocks, num_kv_heads, head_size, block_size]``
* block_tables int32 ``[num_seqs, max_blocks_per_seq]``, seq_lens int32 ``[num_seqs]``
* v2 scratch: exp_sums / max_logits float32 ``[num_seqs, num_heads, partitions]``,
  tmp_out ``[num_seqs, num_heads, partitions, head_size]`` in the query dtype,
  ``partitions = ceil(max_seq_len / 512)``.

Everything here runs on any torch device, so the pure parts (inputs, reference,
fp8 decoding, block tables, statistics) are tested on the CPU.
torch is imported inside functions only.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: vLLM's v2 partition size (paged_attention_v2_launcher's PARTITION_SIZE default).
PARTITION_SIZE = 512
#: vLLM dispatches v1 only up to this max_seq_len (vllm/attention/ops/paged_attn.py).
V1_MAX_SEQ_LEN = 8192
#: ...and, with several partitions, only when num_seqs * num_heads exceeds this.
V1_MIN_PARALLELISM = 512

DTYPES = ("fp16", "bf16", "fp32")
KV_CACHE_DTYPES = ("auto", "fp8")
KERNELS = ("v1", "v2")

_TORCH_DTYPE = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
_ELEM_SIZE = {"fp16": 2, "bf16": 2, "fp32": 4}

#: fp8 (e4m3) test data: magnitude bytes drawn below this (exponent field <= 9:
#: |value| <= 7.5, subnormals and zero included); never the NaN codes 0x7F / 0xFF.
FP8_MAX_MAGNITUDE_BYTE = 0x50


# --------------------------------------------------------------------------- small pure helpers


def torch_dtype(name: str) -> "torch.dtype":
    """``fp16`` / ``bf16`` / ``fp32`` -> the torch dtype."""
    import torch

    try:
        return getattr(torch, _TORCH_DTYPE[name])
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}: choose one of {', '.join(DTYPES)}") from None


def cache_elem_size(dtype: str, kv_cache_dtype: str) -> int:
    """Bytes per KV-cache element: the query dtype's for ``auto``, 1 for ``fp8``."""
    if kv_cache_dtype == "fp8":
        return 1
    if kv_cache_dtype != "auto":
        raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}: choose auto or fp8")
    return _ELEM_SIZE[dtype]


def cache_x(dtype: str, kv_cache_dtype: str) -> int:
    """The key cache's innermost dimension: 16 bytes' worth of elements."""
    return 16 // cache_elem_size(dtype, kv_cache_dtype)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def num_partitions(max_seq_len: int, partition_size: int = PARTITION_SIZE) -> int:
    return cdiv(max_seq_len, partition_size)


def uses_v1(num_seqs: int, num_heads: int, max_seq_len: int) -> bool:
    """vLLM's rule (paged_attn.py): v1 iff max_seq_len <= 8192 and
    (one partition or num_seqs * num_heads > 512); v2 otherwise."""
    return max_seq_len <= V1_MAX_SEQ_LEN and (
        num_partitions(max_seq_len) == 1 or num_seqs * num_heads > V1_MIN_PARALLELISM
    )


def dispatched_kernel(num_seqs: int, num_heads: int, max_seq_len: int) -> str:
    """``"v1"`` or ``"v2"``: the kernel vLLM would launch for this batch."""
    return "v1" if uses_v1(num_seqs, num_heads, max_seq_len) else "v2"


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


# --------------------------------------------------------------------------- statistics


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), q in [0, 1]."""
    if not xs:
        raise ValueError("quantile of no values")
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def geomean(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("geomean of no values")
    if any(x <= 0 for x in xs):
        raise ValueError("geomean needs positive values")
    return float(math.exp(sum(math.log(x) for x in xs) / len(xs)))


def summarize(xs: Sequence[float]) -> dict[str, float | int]:
    """min / median / geomean / max / n of positive numbers (speedups)."""
    return {
        "n": len(xs),
        "min": float(min(xs)),
        "median": median(xs),
        "geomean": geomean(xs),
        "max": float(max(xs)),
    }


# --------------------------------------------------------------------------- libraries


def parse_lib_spec(spec: str) -> tuple[str, str, str]:
    """``NAME=path.so:prefix`` -> (name, path, prefix); the path may itself hold ':'."""
    name, eq, rest = spec.partition("=")
    path, colon, prefix = rest.rpartition(":")
    if not eq or not name or not colon or not path or not prefix:
        raise ValueError(f"invalid library spec {spec!r}: expected NAME=path.so:prefix")
    return name.strip(), path, prefix.strip()


def parse_lib_specs(specs: Iterable[str]) -> list[tuple[str, str, str]]:
    """Several specs (each may also be a comma-separated list); names must be unique."""
    out: list[tuple[str, str, str]] = []
    for spec in specs:
        for part in spec.split(","):
            if part.strip():
                out.append(parse_lib_spec(part.strip()))
    names = [n for n, _, _ in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"library name(s) given twice: {', '.join(dup)}")
    return out


def lib_info(path: str | os.PathLike[str], prefix: str) -> dict[str, Any]:
    """Provenance of one library for a report: path, prefix, size and sha256."""
    p = Path(path)
    info: dict[str, Any] = {"so": str(p), "prefix": prefix}
    try:
        data = p.read_bytes()
    except OSError as e:
        info["error"] = str(e)
        return info
    info["bytes"] = len(data)
    info["sha256"] = hashlib.sha256(data).hexdigest()
    return info


def load_libs(specs: Iterable[tuple[str, str, str]]) -> dict[str, Any]:
    """Load ``(name, path, prefix)`` triples as :class:`kvpatch.gpu.launch.Kernels`, in order."""
    from kvpatch.gpu.launch import Kernels

    return {name: Kernels(path, prefix) for name, path, prefix in specs}


def config_label(dtype: str, kv_cache_dtype: str, head_size: int, block_size: int) -> str:
    """The build's name of one instantiation: ``'fp16/auto/128/16'`` (kvpatch.build's KernelConfig.label)."""
    return f"{dtype}/{kv_cache_dtype}/{head_size}/{block_size}"


def built_configs(lib: Any) -> tuple[str, ...] | None:
    """The configurations a library says it holds (``Kernels.configs``), or None if it does not say."""
    cfgs = getattr(lib, "configs", None)
    return tuple(cfgs) if cfgs is not None else None


def is_built(lib: Any, label: str) -> bool | None:
    """True / False when the library lists its configurations, None when it does not."""
    cfgs = built_configs(lib)
    return None if cfgs is None else label in cfgs


def order_variants(names: Iterable[str], baseline: str = "stock") -> list[str]:
    """The baseline first (``stock``, else the first name), then the rest in given order."""
    names = list(names)
    if not names:
        raise ValueError("no libraries given")
    base = baseline if baseline in names else names[0]
    return [base] + [n for n in names if n != base]


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
    width = max(needed, default=0) + extra_cols
    width = max(width, 1)
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
) -> AttentionInputs:
    """Fresh random inputs for one call: randn query, a random pool of ``num_blocks``
    (default: exactly what the sequences need plus ``spare_blocks``), a scattered
    block table with one spare column, random fp8 scales (1.0 for ``auto``).

    Pass ``kv_pool`` to reuse existing caches (the bench's shared pool)."""
    import torch

    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if not seq_lens or min(seq_lens) < 1:
        raise ValueError("every sequence needs at least one token")
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
    slopes = (
        torch.tensor(alibi_slopes_list(num_heads), dtype=torch.float32, device=device) if alibi else None
    )
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
        max_seq_len=int(max(seq_lens)),
        alibi_slopes=slopes,
        kv_cache_dtype=kv_cache_dtype,
        k_scale=torch.tensor([k_scale_value], dtype=torch.float32, device=device),
        v_scale=torch.tensor([v_scale_value], dtype=torch.float32, device=device),
        k_scale_value=k_scale_value,
        v_scale_value=v_scale_value,
    )


# --------------------------------------------------------------------------- outputs and launches


@dataclass
class OutputBuffers:
    """``out`` for v1 and v2; the v2 scratch (exp_sums, max_logits, tmp_out) for v2."""

    out: "torch.Tensor"
    exp_sums: "torch.Tensor | None" = None
    max_logits: "torch.Tensor | None" = None
    tmp_out: "torch.Tensor | None" = None

    def tensors(self) -> list["torch.Tensor"]:
        return [t for t in (self.out, self.exp_sums, self.max_logits, self.tmp_out) if t is not None]


def make_buffers(inp: AttentionInputs, kernel: str) -> OutputBuffers:
    """Output buffers for ``kernel``, already poisoned with NaN."""
    import torch

    q = inp.query
    out = torch.empty_like(q)
    bufs = OutputBuffers(out=out)
    if kernel == "v2":
        p = inp.max_num_partitions
        s, h, d = q.shape
        bufs.exp_sums = torch.empty((s, h, p), dtype=torch.float32, device=q.device)
        bufs.max_logits = torch.empty((s, h, p), dtype=torch.float32, device=q.device)
        bufs.tmp_out = torch.empty((s, h, p, d), dtype=q.dtype, device=q.device)
    elif kernel != "v1":
        raise ValueError(f"unknown kernel {kernel!r}: v1 or v2")
    poison(bufs)
    return bufs


def poison(bufs: OutputBuffers) -> None:
    """Fill every buffer with NaN, so an element the kernel skipped stays NaN."""
    for t in bufs.tensors():
        t.fill_(float("nan"))


def count_unwritten(t: "torch.Tensor") -> int:
    """Elements still NaN (poisoned, never written -- or computed NaN, equally wrong)."""
    import torch

    return int(torch.isnan(t).sum().item())


def all_written(t: "torch.Tensor") -> bool:
    return count_unwritten(t) == 0


def written_partitions_mask(seq_lens: Sequence[int], num_heads: int, max_partitions: int, device: Any) -> "torch.Tensor":
    """bool ``[num_seqs, num_heads, max_partitions]``: the v2 partitions a sequence has
    (the kernel leaves the others alone)."""
    import torch

    parts = torch.tensor([num_partitions(L) for L in seq_lens], device=device)
    idx = torch.arange(max_partitions, device=device)
    m = idx[None, :] < parts[:, None]
    return m[:, None, :].expand(len(seq_lens), num_heads, max_partitions)


def launch(lib: Any, kernel: str, inp: AttentionInputs, bufs: OutputBuffers) -> None:
    """One v1 or v2 call through a :class:`kvpatch.gpu.launch.Kernels`, as vLLM's op would."""
    make_launcher(lib, kernel, inp, bufs)()


def make_launcher(lib: Any, kernel: str, inp: AttentionInputs, bufs: OutputBuffers) -> Callable[[], None]:
    """A zero-argument closure doing :func:`launch` with its arguments bound (for timing loops)."""
    tail = (
        inp.query,
        inp.key_cache,
        inp.value_cache,
        inp.num_kv_heads,
        inp.scale,
        inp.block_tables,
        inp.seq_lens,
        inp.block_size,
        inp.max_seq_len,
        inp.alibi_slopes,
        inp.kv_cache_dtype,
        inp.k_scale,
        inp.v_scale,
    )
    if kernel == "v1":
        fn, args = lib.v1, (bufs.out, *tail)
    elif kernel == "v2":
        fn, args = lib.v2, (bufs.out, bufs.exp_sums, bufs.max_logits, bufs.tmp_out, *tail)
    else:
        raise ValueError(f"unknown kernel {kernel!r}: v1 or v2")
    return lambda: fn(*args)


def synchronize(device: "torch.device | str") -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------- reference


def dequantize(cache: "torch.Tensor", kv_cache_dtype: str, scale: float, compute_dtype: "torch.dtype") -> "torch.Tensor":
    """A cache (or a gathered part of one) as ``compute_dtype``; fp8 bytes decoded through
    the e4m3 table and multiplied by the scale."""
    import torch

    if kv_cache_dtype == "fp8":
        table = torch.tensor(e4m3_table(), dtype=torch.float64, device=cache.device).to(compute_dtype)
        return table[cache.long()] * scale
    return cache.to(compute_dtype)


def reference_attention(inp: AttentionInputs, *, compute_dtype: "torch.dtype | None" = None) -> "torch.Tensor":
    """softmax(scale * q.k + alibi) . v per sequence, over its gathered blocks, in
    float64 (default): the check of the harness itself. Returns ``[seqs, heads, head_size]``.

    ALiBi adds ``slope * (token_idx - seq_len + 1)`` as vLLM's kernel does."""
    import torch

    cd = compute_dtype or torch.float64
    q_all = inp.query.to(cd)
    s, h, d = inp.query.shape
    kvh = inp.num_kv_heads
    qpk = h // kvh
    bs = inp.block_size
    out = torch.empty((s, h, d), dtype=cd, device=inp.query.device)
    tables = inp.block_tables.long()
    for i, L in enumerate(inp.seq_lens_list):
        nb = cdiv(L, bs)
        blocks = tables[i, :nb]
        kb = inp.key_cache.index_select(0, blocks)  # [nb, kvh, d/x, bs, x]
        vb = inp.value_cache.index_select(0, blocks)  # [nb, kvh, d, bs]
        k = dequantize(kb, inp.kv_cache_dtype, inp.k_scale_value, cd)
        v = dequantize(vb, inp.kv_cache_dtype, inp.v_scale_value, cd)
        k = k.permute(0, 3, 1, 2, 4).reshape(nb * bs, kvh, d)[:L]  # [L, kvh, d]
        v = v.permute(0, 3, 1, 2).reshape(nb * bs, kvh, d)[:L]
        q = q_all[i].reshape(kvh, qpk, d)
        logits = torch.einsum("gqd,tgd->gqt", q, k) * float(inp.scale)
        if inp.alibi_slopes is not None:
            slopes = inp.alibi_slopes.to(cd).reshape(kvh, qpk, 1)
            pos = torch.arange(L, device=q.device, dtype=cd) - (L - 1)
            logits = logits + slopes * pos
        p = torch.softmax(logits, dim=-1)
        out[i] = torch.einsum("gqt,tgd->gqd", p, v).reshape(h, d)
    return out


def rel_l2(a: "torch.Tensor", b: "torch.Tensor") -> float:
    """||a - b|| / ||b|| in float64 (NaN if either holds a NaN; inf if b == 0 != a)."""
    import torch

    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    num = torch.linalg.vector_norm(a64 - b64).item()
    den = torch.linalg.vector_norm(b64).item()
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def max_rel_l2_per_seq(out: "torch.Tensor", ref: "torch.Tensor") -> float:
    """The worst sequence's relative L2 error (one wrong sequence cannot hide in the mean)."""
    return max(rel_l2(out[i], ref[i]) for i in range(out.shape[0]))


#: Tolerance on the stock kernel's max per-sequence rel-L2 error against the float64
#: reference, by ``"dtype/kv_cache_dtype"``. 16-bit paths round probabilities, v2's
#: partial results and the output to the query dtype; fp8 caches are dequantised to
#: the query dtype (value * scale, rounded) before the dot products. Emulating that
#: rounding on the CPU gave, over 40 seeds: fp16 <= 7e-4; bf16 <= 3.3e-3 (auto) and
#: <= 7.4e-3 (fp8); fp32 stays near 1e-6.
REF_TOLERANCE = {
    "fp16/auto": 1e-2,
    "fp16/fp8": 1e-2,
    "bf16/auto": 1e-2,
    "bf16/fp8": 2e-2,
    "fp32/auto": 1e-4,
    # vLLM dequantises fp8 through 16-bit arithmetic even for fp32 queries: measured on
    # an H200 (1440 cases), stock reached 7.5e-4 against the float64 reference.
    "fp32/fp8": 1e-2,
}


def ref_tolerance(dtype: str, kv_cache_dtype: str) -> float:
    return REF_TOLERANCE[f"{dtype}/{kv_cache_dtype}"]


def json_safe(obj: Any) -> Any:
    """A copy that strict JSON accepts: NaN / inf as strings, tuples as lists, other
    unknown objects through ``str``."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return str(obj)
