"""Bench points and the named point sets: what ``tune`` sees and what it never sees.

* ``tuning``: what ``kvpatch tune`` chooses on, per instantiation: every (dtype, head
  size, block size) it tunes -- fp16 + bf16 x head 64/128/256 x block 16/32, auto
  cache -- in three head layouts (GQA 32/8, MHA 32/32, GQA 64/8) at batch 2/8/32 x
  context 512/2048/12288, seed 0 (324 points). Batches and contexts are off the
  published grid on purpose, and they reach both kernels (v1 at context 512 and at
  batch 32 x 2048, v2 elsewhere). The layouts are there because a setting that is fast
  for GQA 32/8 can be slower than stock for MHA (the held-out run of tune-5's table).
* ``headline``: the README's table: GQA 32/8, head 128, block 16, auto cache, fp16 +
  bf16, batch 1/4/16/64 x context 1k/4k/16k, seed 1 (24 points). Tune saw this
  instantiation, never these batches, contexts or data.
* ``heldout``: shapes users run, each with its own seed (101+): one factor changed
  at a time around the headline shape -- head 64, head 256, block 32, GQA 64/8, GQA
  8/1 (a TP-8 shard of a 70B model), MHA 32/32, fp8 cache -- plus the headline shape
  itself on a new seed; each for fp16 and bf16 at the full batch 1/4/16/64 x context
  1k/4k/16k grid (8 shapes x 2 dtypes x 12 = 192 points). No (batch, context, seed)
  of it is a tuning point; GQA 8/1 and the fp8 cache are shapes tune never ran (MHA
  32/32 and GQA 64/8 it ran at other batches, contexts and data). Not sampled:
  combinations of two changed factors (e.g. head 256 with block 32). Points whose KV
  does not fit the GPU are skipped at run time and listed.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

from ..errors import UsageError
from .dispatch import cdiv, dispatched_kernel
from .inputs import DTYPES, cache_elem_size, cache_x, check_kv_cache_dtype

#: The headline shape: Llama-3.1-8B's attention (GQA 32 query / 8 KV heads, head 128) in
#: vLLM's default block size 16, unquantized cache. Every default below that names a shape.
HEADLINE_HEADS = (32, 8)
HEADLINE_HEAD_SIZE = 128
HEADLINE_BLOCK_SIZE = 16
#: The headline grid (kvpatch bench's default and the decode step's, kvpatch.prefetch).
DEFAULT_BATCHES = (1, 4, 16, 64)
DEFAULT_CONTEXTS = (1024, 4096, 16384)
#: The instantiations ``kvpatch tune`` tunes (each gets its own setting, or ``off``) and
#: the batch x context grid it measures each on; instantiations outside it get the
#: shipped default's fallback.
TUNING_DTYPES = ("fp16", "bf16")
TUNING_HEAD_SIZES = (64, 128, 256)
TUNING_BLOCK_SIZES = (16, 32)
TUNING_BATCHES = (2, 8, 32)
TUNING_CONTEXTS = (512, 2048, 12288)
#: (query heads, KV heads) of the tuning set.
TUNING_HEADS = ((32, 8), (32, 32), (64, 8))
POINT_SETS = ("tuning", "headline", "heldout")


#: The most tokens a measured context, or a launch ``--capture-len`` sizes, may have: 131072, the
#: longest context of the models kvpatch knows (a typo, not a wish, is what it catches: beyond
#: int32's range a sequence's length cannot even be given to the kernels).
MAX_CONTEXT = 1 << 17


#: The most sequences a measured batch may have: 1024, vLLM's largest ``max_num_seqs`` in common use
#: (its default is 256); a typo, not a wish, is what it catches.
MAX_BATCH = 1024


#: The most query heads a measured layout may have: 1024, eight times the most of a model in common
#: use (128: Llama-3.1-405B); a typo, not a wish, is what it catches.
MAX_HEADS = 1024


def check_heads(num_heads: int, num_kv_heads: int, what: str) -> None:
    """KV heads >= 1, query heads a positive multiple of them and at most :data:`MAX_HEADS`, else a
    :class:`UsageError` naming ``what`` (the layout as the user wrote it)."""
    if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads:
        raise UsageError(f"invalid heads {what}: KV heads >= 1 and query heads a positive multiple of them")
    if num_heads > MAX_HEADS:
        raise UsageError(f"invalid heads {what}: at most {MAX_HEADS} query heads")


def check_batches(batches: Iterable[int], option: str = "--batches") -> None:
    """Every batch 1 to :data:`MAX_BATCH` sequences, else a :class:`UsageError` naming ``option``."""
    bad = [b for b in batches if not 1 <= b <= MAX_BATCH]
    if bad:
        raise UsageError(f"{option} must be 1 to {MAX_BATCH} sequences, not {bad[0]}")


def check_contexts(contexts: Iterable[int]) -> None:
    """Every context 1 to :data:`MAX_CONTEXT` tokens, else a :class:`UsageError`."""
    bad = [c for c in contexts if not 1 <= c <= MAX_CONTEXT]
    if bad:
        raise UsageError(f"--contexts must be 1 to {MAX_CONTEXT} tokens (the longest context of the models kvpatch "
                         f"knows), not {bad[0]}")  # fmt: skip


@dataclass(frozen=True)
class BenchPoint:
    """One batch shape: ``batch`` sequences of ``context`` tokens each, drawn with ``seed``.
    ``capture``: the ``max_seq_len`` the launch is sized for when longer than the context, as in
    vLLM's CUDA graphs (captured for min(engine context, 8192) tokens); 0: the context."""

    dtype: str
    batch: int
    context: int
    num_heads: int = HEADLINE_HEADS[0]
    num_kv_heads: int = HEADLINE_HEADS[1]
    head_size: int = HEADLINE_HEAD_SIZE
    block_size: int = HEADLINE_BLOCK_SIZE
    kv_cache_dtype: str = "auto"
    seed: int = 0
    capture: int = 0

    @property
    def max_seq_len(self) -> int:
        """What the launch is given as ``max_seq_len`` (vLLM's dispatch reads it too)."""
        return max(self.capture, self.context)

    @property
    def shape(self) -> str:
        """Everything but dtype, batch and context: ``'32/8 h128 b16 auto'``."""
        return f"{self.num_heads}/{self.num_kv_heads} h{self.head_size} b{self.block_size} {self.kv_cache_dtype}"

    @property
    def name(self) -> str:
        s = f"{self.dtype} B={self.batch} ctx={self.context}"
        if (self.num_heads, self.num_kv_heads, self.head_size, self.block_size, self.kv_cache_dtype) != (
            *HEADLINE_HEADS,
            HEADLINE_HEAD_SIZE,
            HEADLINE_BLOCK_SIZE,
            "auto",
        ):
            s += (f" heads={self.num_heads}/{self.num_kv_heads} head={self.head_size}"
                  f" block={self.block_size} kv={self.kv_cache_dtype}")  # fmt: skip
        return s + (f" launch={self.capture}" if self.capture > self.context else "")

    @property
    def dispatched(self) -> str:
        return dispatched_kernel(self.batch, self.num_heads, self.max_seq_len)

    @property
    def blocks_per_seq(self) -> int:
        return cdiv(self.context, self.block_size)

    @property
    def num_blocks(self) -> int:
        return self.batch * self.blocks_per_seq

    @property
    def block_bytes(self) -> int:
        """K + V bytes of one block (all KV heads)."""
        return (
            2 * self.num_kv_heads * self.head_size * self.block_size * cache_elem_size(self.dtype, self.kv_cache_dtype)
        )

    @property
    def kv_bytes(self) -> int:
        """Unique K + V bytes the batch's blocks cover (blocks are distinct)."""
        return self.num_blocks * self.block_bytes

    @property
    def pool_key(self) -> tuple[Any, ...]:
        return (self.dtype, self.kv_cache_dtype, self.num_kv_heads, self.head_size, self.block_size, self.seed)

    @property
    def config(self) -> str:
        """The build configuration it needs (``Kernels.configs`` entry)."""
        return f"{self.dtype}/{self.kv_cache_dtype}/{self.head_size}/{self.block_size}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_points(
    *,
    dtypes: Sequence[str] = ("fp16", "bf16"),
    batches: Sequence[int] = DEFAULT_BATCHES,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    num_heads: int = HEADLINE_HEADS[0],
    num_kv_heads: int = HEADLINE_HEADS[1],
    head_size: int = HEADLINE_HEAD_SIZE,
    block_size: int = HEADLINE_BLOCK_SIZE,
    kv_cache_dtype: str = "auto",
    seed: int = 0,
) -> list[BenchPoint]:
    """dtype x batch x context, in that nesting order."""
    check_heads(num_heads, num_kv_heads, f"{num_heads}/{num_kv_heads}")
    for d in dtypes:
        if d not in DTYPES:
            raise UsageError(f"unknown dtype {d!r}: choose from {', '.join(DTYPES)}")
    check_kv_cache_dtype(kv_cache_dtype)
    check_batches(batches)
    check_contexts(contexts)
    if head_size < 1 or block_size < 1:
        raise UsageError("head and block sizes must be >= 1")
    for d in dtypes:
        if head_size % cache_x(d, kv_cache_dtype):
            raise UsageError(f"head size {head_size} with a {kv_cache_dtype} cache of {d}: the key cache's layout needs a "
                             f"multiple of {cache_x(d, kv_cache_dtype)} (16 bytes of elements)")  # fmt: skip
    return [
        BenchPoint(d, b, c, num_heads, num_kv_heads, head_size, block_size, kv_cache_dtype, seed)
        for d, b, c in itertools.product(dtypes, batches, contexts)
    ]


#: The held-out shapes: (what changed, make_points keywords), one factor at a time.
HELDOUT_SHAPES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("headline shape, new seed", {}),
    ("head 64", {"head_size": 64}),
    ("head 256", {"head_size": 256}),
    ("block 32", {"block_size": 32}),
    ("GQA 64/8", {"num_heads": 64, "num_kv_heads": 8}),
    ("GQA 8/1 (TP-8 shard of a 70B model)", {"num_heads": 8, "num_kv_heads": 1}),
    ("MHA 32/32", {"num_heads": 32, "num_kv_heads": 32}),
    ("fp8 cache", {"kv_cache_dtype": "fp8"}),
)


def point_set(name: str, *, dtypes: Sequence[str] = ("fp16", "bf16")) -> list[BenchPoint]:
    """The named set (see the module docstring)."""
    if name == "tuning":
        return tuning_points(dtypes=[d for d in dtypes if d in TUNING_DTYPES])
    if name == "headline":
        return make_points(dtypes=dtypes, seed=1)
    if name == "heldout":
        pts: list[BenchPoint] = []
        for i, (_, kw) in enumerate(HELDOUT_SHAPES):
            pts += make_points(dtypes=dtypes, seed=101 + i, **kw)
        return pts
    raise UsageError(f"unknown point set {name!r}: choose {', '.join(POINT_SETS)}")


def tuning_points(*, dtypes: Sequence[str] = TUNING_DTYPES, head_sizes: Sequence[int] = TUNING_HEAD_SIZES,
                  block_sizes: Sequence[int] = TUNING_BLOCK_SIZES, batches: Sequence[int] = TUNING_BATCHES,
                  contexts: Sequence[int] = TUNING_CONTEXTS,
                  heads: Sequence[tuple[int, int]] = TUNING_HEADS) -> list[BenchPoint]:  # fmt: skip
    """The tuning set (or part of it): dtype x head layout x head x block x batch x context, seed 0."""
    return [p for hs in head_sizes for bs in block_sizes for nh, nkv in heads
            for p in make_points(dtypes=dtypes, batches=batches, contexts=contexts, num_heads=nh, num_kv_heads=nkv,
                                 head_size=hs, block_size=bs, seed=0)]  # fmt: skip


def quick_points() -> list[BenchPoint]:
    """fp16 and bf16, batch 1/64 x context 1024/16384 of the tuning shape."""
    return make_points(batches=(1, 64), contexts=(1024, 16384))


def pool_blocks(
    points: Sequence[BenchPoint], l2_bytes: int, *, l2_multiple: float = 64.0, headroom: float = 1.2
) -> int:
    """Blocks in a shared pool: >= headroom x the largest point's blocks and >= l2_multiple x L2."""
    need = max(p.num_blocks for p in points)
    bb = points[0].block_bytes
    return max(math.ceil(headroom * need) + 1, math.ceil(l2_multiple * l2_bytes / bb))
