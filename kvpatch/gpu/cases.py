"""One configuration of the validate matrix (:mod:`.validate` builds the matrices)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from . import launch as L


@dataclass(frozen=True)
class ValidateCase:
    """One configuration. ``context`` is the longest sequence's length (= max_seq_len);
    the batch's other sequences are random lengths in [1, context]."""

    dtype: str
    kv_cache_dtype: str
    head_size: int
    block_size: int
    kernel: str
    num_heads: int
    num_kv_heads: int
    alibi: bool
    context: int
    num_seqs: int = 3

    @property
    def name(self) -> str:
        return (
            f"{self.kernel} q={self.dtype} kv={self.kv_cache_dtype} head={self.head_size} "
            f"block={self.block_size} heads={self.num_heads}/{self.num_kv_heads} "
            f"alibi={'on' if self.alibi else 'off'} ctx={self.context}"
        )

    @property
    def config(self) -> str:
        """The build configuration this case needs (``Kernels.configs`` entry)."""
        return L.config_label(self.dtype, self.kv_cache_dtype, self.head_size, self.block_size)

    def seq_lens(self, seed: int) -> list[int]:
        """``num_seqs`` lengths: ``context`` itself, plus random ones in [1, context], shuffled."""
        rng = random.Random(seed)
        lens = [self.context] + [rng.randint(1, self.context) for _ in range(self.num_seqs - 1)]
        rng.shuffle(lens)
        return lens
