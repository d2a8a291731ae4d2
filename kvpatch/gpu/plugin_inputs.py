"""Inputs and calls for :mod:`kvpatch.vllm_plugin.gpu_check`: a decode batch laid out as
vLLM lays it out, the two call paths (``vllm._custom_ops`` and
``PagedAttention.forward_decode``), and one case's outputs eagerly and through a CUDA
graph replayed on changed inputs. torch is imported inside the functions only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .. import dtypes as D


@dataclass(frozen=True)
class Case:
    """One configuration checked: the kernel's template parameters, ALiBi, v1 or v2."""

    dtype: str
    kv_cache_dtype: str
    head_size: int
    block_size: int
    alibi: bool
    kernel: str  # 'v1' | 'v2'
    long: bool = False  # at LONG's shape (v1 sized for 8192 tokens), captured before any eager call

    @property
    def label(self) -> str:
        return (f"{self.dtype}/{self.kv_cache_dtype}/{self.head_size}/{self.block_size} "
                f"{self.kernel}{' alibi' if self.alibi else ''}{' 8192 tokens' if self.long else ''}")  # fmt: skip


def matrix(configs: Iterable[str], *, dtypes: Iterable[str] | None = None, kv_cache_dtypes=("auto", "fp8"),
           head_sizes=(64, 128, 256), block_sizes=(16, 32), alibi=(False, True), kernels=("v1", "v2")) -> list[Case]:  # fmt: skip
    """The cases among the library's built ``configs`` ('fp16/auto/128/16'...) that the
    option sets select (``None``: every value built)."""
    want = [None if x is None else set(x) for x in (dtypes, kv_cache_dtypes, head_sizes, block_sizes)]
    out = []
    for label in configs:
        d, kv, h, b = label.split("/")
        parts = (d, kv, int(h), int(b))
        if all(w is None or p in w for w, p in zip(want, parts)):
            out += [Case(*parts, a, k) for k in kernels for a in alibi]
    return sorted(set(out), key=lambda c: (c.dtype, c.kv_cache_dtype, c.head_size, c.block_size, c.kernel, c.alibi))


def long_cases(cases: Iterable[Case]) -> list[Case]:
    """The v1 cases without ALiBi again at :data:`LONG`: vLLM's V0 engine captures its decode
    graphs sized for up to 8192 tokens (``max_seq_len_to_capture``), where a launch's shared
    memory, not its real lengths, decides how many CTAs an SM holds and which form the launcher
    takes."""
    return [Case(c.dtype, c.kv_cache_dtype, c.head_size, c.block_size, False, "v1", long=True)
            for c in cases if c.kernel == "v1" and not c.alibi and not c.long]  # fmt: skip


#: vLLM's dispatch (paged_attn.py): v1 iff max_seq_len <= 8192 and (one 512-token partition
#: or num_seqs * num_heads > 512). These shapes take the case's kernel through forward_decode.
SHAPES = {"v1": (4, 8, 2, 500), "v2": (4, 8, 2, 1500)}  # num_seqs, num_heads, num_kv_heads, max_seq_len
#: A long case's shape: Llama-3.1-8B's heads (GQA 32/8), 8192 tokens, v1 (64 x 32 > 512), 512
#: CTAs of the grouped grid (the shipped table groups launches of 256 or more). Its sequences
#: share a pool of twice one sequence's blocks (vLLM's tables may map any block).
LONG = (64, 32, 8, 8192)


def make_inputs(case: Case, *, device: Any = "cuda", scale_by_value: bool = False, seed: int = 0,
                shape: tuple[int, int, int, int] | None = None) -> dict[str, Any]:  # fmt: skip
    """A decode batch for ``case`` laid out as vLLM lays it out (key cache split into x);
    ``shape``: (num_seqs, num_heads, num_kv_heads, max_seq_len), by default the kernel's."""
    import torch

    num_seqs, num_heads, num_kv_heads, max_seq_len = shape or (LONG if case.long else SHAPES[case.kernel])
    g = torch.Generator(device="cpu").manual_seed(seed)
    dtype = getattr(torch, D.query_dtype(case.dtype).torch)
    fp8 = D.kv_cache_dtype(case.kv_cache_dtype).size == 1
    elem = 1 if fp8 else D.query_dtype(case.dtype).size
    per_seq = -(-max_seq_len // case.block_size)
    x, blocks = 16 // elem, per_seq * (2 if case.long else num_seqs)
    cache = torch.randn(2, blocks, case.block_size * num_kv_heads * case.head_size, generator=g)
    if fp8:
        f8 = torch.float8_e5m2 if case.kv_cache_dtype == "fp8_e5m2" else torch.float8_e4m3fn
        cache = cache.to(f8).view(torch.uint8)
    else:
        cache = cache.to(dtype)
    cache = cache.to(device)
    lens = torch.randint(1, max_seq_len + 1, (num_seqs,), generator=g, dtype=torch.int32)
    lens[0] = max_seq_len
    scales = (1.0, 1.0) if scale_by_value else (torch.ones(1, device=device), torch.ones(1, device=device))
    return dict(
        query=torch.randn(num_seqs, num_heads, case.head_size, generator=g).to(dtype).to(device),
        key_cache=cache[0].view(blocks, num_kv_heads, case.head_size // x, case.block_size, x),
        value_cache=cache[1].view(blocks, num_kv_heads, case.head_size, case.block_size),
        num_kv_heads=num_kv_heads, scale=case.head_size**-0.5,
        block_tables=(torch.randint(0, blocks, (num_seqs, per_seq), generator=g) if case.long
                      else torch.randperm(blocks, generator=g).view(num_seqs, -1)).to(torch.int32).to(device),
        seq_lens=lens.to(device), block_size=case.block_size, max_seq_len=max_seq_len,
        alibi_slopes=torch.rand(num_heads, generator=g).to(device) if case.alibi else None,
        kv_cache_dtype=case.kv_cache_dtype, k_scale=scales[0], v_scale=scales[1],
    )  # fmt: skip


def perturb(inp: dict[str, Any], seed: int) -> None:
    """Change the inputs in place (what a graph replay must pick up): query, cache, lengths."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    q = inp["query"]
    q.copy_(torch.randn(q.shape, generator=g).to(q.dtype))
    kc = inp["key_cache"]
    kc.copy_(kc.flatten().roll(int(torch.randint(1, 1000, (1,), generator=g))).view(kc.shape))
    lens = inp["seq_lens"]
    lens.copy_(torch.randint(1, inp["max_seq_len"] + 1, lens.shape, generator=g, dtype=torch.int32))


def custom_ops_call(ops: Any, kernel: str) -> Callable[[dict[str, Any]], Any]:
    """A call through ``vllm._custom_ops`` (v2 with vLLM's scratch buffers, allocated here)."""
    import torch

    def call(inp: dict[str, Any]) -> Any:
        q = inp["query"]
        out = torch.empty_like(q)
        tail = [inp[k] for k in ("query", "key_cache", "value_cache", "num_kv_heads", "scale", "block_tables",
                                 "seq_lens", "block_size", "max_seq_len", "alibi_slopes", "kv_cache_dtype",
                                 "k_scale", "v_scale")]  # fmt: skip
        if kernel == "v1":
            ops.paged_attention_v1(out, *tail)
            return out
        s, h, d = q.shape
        parts = -(-inp["max_seq_len"] // 512)
        exp_sums = torch.empty(s, h, parts, dtype=torch.float32, device=q.device)
        tmp = torch.empty(s, h, parts, d, dtype=q.dtype, device=q.device)
        ops.paged_attention_v2(out, exp_sums, torch.empty_like(exp_sums), tmp, *tail)
        return out

    return call


def forward_decode_call(forward_decode: Callable[..., Any]) -> Callable[[dict[str, Any]], Any]:
    def call(inp: dict[str, Any]) -> Any:
        return forward_decode(*[inp[k] for k in ("query", "key_cache", "value_cache", "block_tables", "seq_lens",
                                                  "max_seq_len", "kv_cache_dtype", "num_kv_heads", "scale",
                                                  "alibi_slopes", "k_scale", "v_scale")])  # fmt: skip

    return call


def outputs(call: Callable[[dict[str, Any]], Any], inp: dict[str, Any], graphs: bool, seed: int, *,
            graph_first: bool = False) -> dict[str, Any]:  # fmt: skip
    """Eager output; with ``graphs``, the output of a captured graph, then of its replay on
    changed inputs (the changes are the same on both sides: seeded). ``graph_first``: capture
    before any eager call (nothing the launcher learns in an eager call helps the capture), and
    the eager output last, on the changed inputs."""
    import torch

    out = {}
    if graphs:
        if not graph_first:
            out["eager"] = call(inp).clone()
            call(inp)  # warm-up on the capturing device
            torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static = call(inp)
        g.replay()
        out["graph"] = static.clone()
        perturb(inp, seed)
        g.replay()
        out["graph replayed"] = static.clone()
    if "eager" not in out:
        out["eager"] = call(inp).clone()
    return out
