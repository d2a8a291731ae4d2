"""``memory_efficient_attention_forward`` over torch SDPA, one prompt at a time."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import fmha  # noqa: F401
from .fmha.attn_bias import BlockDiagonalMask


def memory_efficient_attention_forward(query, key, value, attn_bias=None, p: float = 0.0, scale=None):
    """query [1, T, H, D] or [1, T, G, Hg, D] (grouped heads), key/value likewise; the output
    has the query's shape. ``attn_bias``: a BlockDiagonal(Causal)Mask over the T tokens."""
    if p:
        raise NotImplementedError("the xformers stand-in has no dropout")
    if not isinstance(attn_bias, BlockDiagonalMask):
        raise NotImplementedError(f"the xformers stand-in takes block-diagonal masks, not {type(attn_bias).__name__}")
    shape = query.shape
    q = query.reshape(shape[1], -1, shape[-1])
    k = key.reshape(key.shape[1], -1, key.shape[-1])
    v = value.reshape(value.shape[1], -1, value.shape[-1])
    out = torch.empty_like(q)
    qs = ks = 0
    for nq, nk in zip(attn_bias.q_seqlens, attn_bias.kv_seqlens):
        if attn_bias.causal and nq != nk:
            raise NotImplementedError("the xformers stand-in's causal mask needs as many queries as keys")
        qi, ki, vi = (t.transpose(0, 1)[None] for t in (q[qs : qs + nq], k[ks : ks + nk], v[ks : ks + nk]))
        o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=attn_bias.causal and nq > 1, scale=scale)
        out[qs : qs + nq] = o[0].transpose(0, 1)
        qs, ks = qs + nq, ks + nk
    return out.reshape(shape)
