"""The H200 route's stand-in for xformers' prefill (scripts/serving_standins/xformers): block-
diagonal causal attention over torch SDPA must equal attention computed prompt by prompt."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "serving_standins"))
from xformers import ops as xops  # noqa: E402
from xformers.ops.fmha.attn_bias import BlockDiagonalCausalMask, BlockDiagonalMask, LowerTriangularMaskWithTensorBias  # noqa: E402

sys.path.pop(0)


def _reference(q, k, v, lens, scale, causal):
    """One prompt at a time, the textbook way: softmax(q k^T * scale + mask) v per head."""
    out, start = [], 0
    for n in lens:
        qs, ks, vs = (t[start : start + n].transpose(0, 1) for t in (q, k, v))  # [H, n, D]
        scores = qs @ ks.transpose(1, 2) * scale
        if causal:
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        out.append((scores.softmax(-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("grouped", [False, True])
def test_block_diagonal_causal_prefill_equals_attention_prompt_by_prompt(grouped):
    torch.manual_seed(0)
    lens, d = [5, 1, 9], 16
    t = sum(lens)
    scale = 1 / math.sqrt(d)
    if grouped:  # vLLM's GQA layout: [1, T, KV heads, queries per KV head, D], keys expanded
        q = torch.randn(1, t, 2, 3, d)
        k = torch.randn(1, t, 2, 1, d).expand(1, t, 2, 3, d)
        v = torch.randn(1, t, 2, 1, d).expand(1, t, 2, 3, d)
    else:
        q, k, v = (torch.randn(1, t, 4, d) for _ in range(3))
    out = xops.memory_efficient_attention_forward(q, k, v, attn_bias=BlockDiagonalCausalMask.from_seqlens(lens), p=0.0,
                                                  scale=scale)  # fmt: skip
    flat = [x.reshape(t, -1, d) for x in (q, k, v)]
    assert out.shape == q.shape
    torch.testing.assert_close(out.reshape(t, -1, d), _reference(*flat, lens, scale, causal=True))
    plain = xops.memory_efficient_attention_forward(
        q, k, v, attn_bias=BlockDiagonalMask.from_seqlens(lens), scale=scale
    )
    torch.testing.assert_close(plain.reshape(t, -1, d), _reference(*flat, lens, scale, causal=False))


def test_what_the_standin_cannot_do_it_refuses():
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(NotImplementedError, match="dropout"):
        xops.memory_efficient_attention_forward(q, q, q, attn_bias=BlockDiagonalCausalMask.from_seqlens([4]), p=0.1)
    with pytest.raises(NotImplementedError, match="sliding-window"):
        BlockDiagonalCausalMask.from_seqlens([4]).make_local_attention(2)
    with pytest.raises(NotImplementedError, match="ALiBi"):
        LowerTriangularMaskWithTensorBias(None)
    with pytest.raises(NotImplementedError, match="as many queries as keys"):
        xops.memory_efficient_attention_forward(
            q[:, :2], q, q, attn_bias=BlockDiagonalCausalMask.from_seqlens([2], [4])
        )
