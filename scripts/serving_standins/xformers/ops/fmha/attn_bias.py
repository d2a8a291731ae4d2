"""The attention-bias classes vLLM's XFORMERS backend builds for prefill: block-diagonal
masks over the prompts of one batch, causal or not."""

from __future__ import annotations


class AttentionBias:
    pass


class BlockDiagonalMask(AttentionBias):
    causal = False

    def __init__(self, q_seqlens: list[int], kv_seqlens: list[int] | None = None) -> None:
        self.q_seqlens = [int(n) for n in q_seqlens]
        self.kv_seqlens = [int(n) for n in (kv_seqlens if kv_seqlens is not None else q_seqlens)]
        if len(self.q_seqlens) != len(self.kv_seqlens):
            raise ValueError("as many key as query sequences are needed")

    @classmethod
    def from_seqlens(cls, q_seqlen, kv_seqlen=None, device=None):  # noqa: ARG003 - xformers' signature
        return cls(list(q_seqlen), None if kv_seqlen is None else list(kv_seqlen))

    def make_local_attention(self, window_size: int):
        raise NotImplementedError("the xformers stand-in has no sliding-window prefill")


class BlockDiagonalCausalMask(BlockDiagonalMask):
    causal = True


class LowerTriangularMaskWithTensorBias(AttentionBias):
    def __init__(self, bias) -> None:
        raise NotImplementedError("the xformers stand-in has no ALiBi prefill")
