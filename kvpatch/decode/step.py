"""The model-shaped decode step of ``kvpatch bench-decode``: weights, caches, one step.

Per layer (random weights, the model's real shapes, :mod:`.models`)::

    RMSNorm -> fused QKV GEMM -> write K/V of the new token into the paged cache
    -> PagedAttention (a kvpatch-built library, v1 or v2 by vLLM's rule)
    -> o_proj GEMM (+ residual) -> RMSNorm -> gate/up GEMM -> SiLU * up -> down GEMM (+ residual)

Caches use vLLM's layouts (key ``[blocks, kv_heads, head/x, block, x]`` with
``x = 16 / element size``, value ``[blocks, kv_heads, head, block]``), block size 16,
one cache per layer and a random (scattered) block table per layer; every sequence has
``context`` tokens, the last of which this step writes. RoPE, embeddings and the LM
head are left out. The step runs a layer as the ops of :data:`~.windows.LAYER_OPS`, one by
one (:meth:`DecodeStep.run_op`; the per-kernel benchmark runs them one at a time too). With a
:class:`~kvpatch.prefetch.controller.PrefetchController` and the forks of
:func:`~.windows.plan_forks`, the step forks each window's prefetch (the controller's window
``(name, layer)``, registered by :meth:`DecodeStep.add_prefetch`) right before the op the window
names, and joins once per step or before each o_proj (``join=``).

torch is imported inside functions only.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..dtypes import QUERY_DTYPES
from ..errors import UsageError
from ..gpu.dispatch import PARTITION_SIZE, V1_MAX_SEQ_LEN, V1_MIN_PARALLELISM, dispatched_kernel  # noqa: F401  (vLLM's rule, one place)
from .models import ModelShape
from .options import BLOCK_SIZE, JOIN_POINTS
from .windows import KINDS, LAYER_OPS, Fork, forks_by_op

#: The decode step runs fp16 and bf16: (torch dtype name, element size) from kvpatch.dtypes.
DTYPES = {name: (QUERY_DTYPES[name].torch, QUERY_DTYPES[name].size) for name in ("fp16", "bf16")}


def point_bytes(shape: ModelShape, elem: int, batch: int, context: int, layers: int) -> int:
    """Device bytes a point needs beyond the weights: caches and activations."""
    blocks = batch * -(-context // BLOCK_SIZE) + 1
    cache = layers * blocks * BLOCK_SIZE * shape.kv_bytes_per_token(elem)
    acts = 16 * batch * (shape.qkv_out + 2 * shape.intermediate + 4 * shape.hidden) * elem * layers
    return cache + acts


class DecodeWeights:
    """One model's layer weights (random, scaled so activations stay near unit size)."""

    def __init__(self, shape: ModelShape, dtype: str, layers: int, device: Any, seed: int = 0) -> None:
        import torch

        self.shape, self.dtype_name, self.layers = shape, dtype, layers
        self.dtype = getattr(torch, DTYPES[dtype][0])
        self.elem = DTYPES[dtype][1]
        self.device = torch.device(device)
        g = torch.Generator(device=self.device).manual_seed(seed)
        s = shape

        def randn(*size: int, scale: float = 1.0) -> Any:
            t = torch.randn(*size, generator=g, device=self.device, dtype=torch.float32)
            return (t * scale).to(self.dtype)

        self.per_layer: list[dict[str, Any]] = []
        for _ in range(layers):
            self.per_layer.append({
                "norm1": (1 + 0.1 * torch.randn(s.hidden, generator=g, device=self.device)).to(self.dtype),
                "qkv": randn(s.qkv_out, s.hidden, scale=s.hidden**-0.5),
                "o_proj": randn(s.hidden, s.q_size, scale=s.q_size**-0.5),
                "norm2": (1 + 0.1 * torch.randn(s.hidden, generator=g, device=self.device)).to(self.dtype),
                "gate_up": randn(2 * s.intermediate, s.hidden, scale=s.hidden**-0.5),
                "down": randn(s.hidden, s.intermediate, scale=s.intermediate**-0.5),
            })  # fmt: skip

    def prefetch_tensors(self, layer: int, window: str = "attn") -> list[Any]:
        """What ``window`` forked in ``layer`` pulls, in reading order (``[]`` for a next-layer
        window in the last layer)."""
        kind = KINDS[window]
        target = layer + 1 if kind.next_layer else layer
        if target >= self.layers:
            return []
        return [self.per_layer[target][name] for name in kind.weights]

    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for w in self.per_layer for t in w.values())


class DecodeStep:
    """One point (batch, context) of a model: caches, block tables, buffers, and ``step``."""

    def __init__(self, weights: DecodeWeights, batch: int, context: int, *, seed: int = 1) -> None:
        import torch

        self.w, self.batch, self.context = weights, batch, context
        s, dev, dt = weights.shape, weights.device, weights.dtype
        self.kernel = dispatched_kernel(batch, s.heads, context)
        self.x_elems = 16 // weights.elem
        g = torch.Generator(device=dev).manual_seed(seed)
        per_seq = -(-context // BLOCK_SIZE)
        blocks = batch * per_seq + 1
        self.key_caches, self.value_caches, self.block_tables = [], [], []
        self.slot_blocks: list[Any] = []
        pos = context - 1
        for _ in range(weights.layers):
            kc = torch.randn(
                blocks,
                s.kv_heads,
                s.head_size // self.x_elems,
                BLOCK_SIZE,
                self.x_elems,
                generator=g,
                device=dev,
                dtype=torch.float32,
            ).to(dt)
            vc = torch.randn(
                blocks, s.kv_heads, s.head_size, BLOCK_SIZE, generator=g, device=dev, dtype=torch.float32
            ).to(dt)
            perm = torch.randperm(blocks, generator=g, device=dev)[: batch * per_seq]
            table = perm.view(batch, per_seq).to(torch.int32).contiguous()
            self.key_caches.append(kc)
            self.value_caches.append(vc)
            self.block_tables.append(table)
            self.slot_blocks.append(table[:, pos // BLOCK_SIZE].to(torch.int64).contiguous())
        self.slot_offset = pos % BLOCK_SIZE
        self.seq_lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
        self.x0 = torch.randn(batch, s.hidden, generator=g, device=dev, dtype=torch.float32).to(dt)
        self.q_static = torch.randn(batch, s.heads, s.head_size, generator=g, device=dev, dtype=torch.float32).to(dt)
        self.out = torch.empty(batch, s.hidden, device=dev, dtype=dt)
        self.attn_out = torch.empty(batch, s.heads, s.head_size, device=dev, dtype=dt)
        parts = -(-context // PARTITION_SIZE)
        self.exp_sums = torch.empty(batch, s.heads, parts, device=dev, dtype=torch.float32)
        self.max_logits = torch.empty_like(self.exp_sums)
        self.tmp_out = torch.empty(batch, s.heads, parts, s.head_size, device=dev, dtype=dt)
        self.k_scale = torch.ones(1, device=dev, dtype=torch.float32)
        self.v_scale = torch.ones(1, device=dev, dtype=torch.float32)
        self.scale = s.head_size**-0.5

    # -- pieces

    def write_kv(self, layer: int, k: Any, v: Any) -> None:
        """vLLM's reshape_and_cache for one new token per sequence."""
        s = self.w.shape
        blk, off = self.slot_blocks[layer], self.slot_offset
        self.key_caches[layer][blk, :, :, off, :] = k.reshape(
            self.batch, s.kv_heads, s.head_size // self.x_elems, self.x_elems
        )
        self.value_caches[layer][blk, :, :, off] = v.reshape(self.batch, s.kv_heads, s.head_size)

    def attention(self, lib: Any, layer: int, q: Any) -> None:
        s = self.w.shape
        common = (q, self.key_caches[layer], self.value_caches[layer], s.kv_heads, self.scale, self.block_tables[layer],
                  self.seq_lens, BLOCK_SIZE, self.context, None, "auto", self.k_scale, self.v_scale)  # fmt: skip
        if self.kernel == "v1":
            lib.v1(self.attn_out, *common)
        else:
            lib.v2(self.attn_out, self.exp_sums, self.max_logits, self.tmp_out, *common)

    def run_op(self, op: str, lib: Any, layer: int, st: dict[str, Any]) -> None:
        """One op of :data:`~.windows.LAYER_OPS` of ``layer``; ``st`` carries the activations
        (``x`` the residual stream, in and out)."""
        import torch.nn.functional as F

        s, B, w = self.w.shape, self.batch, self.w.per_layer[layer]
        if op == "norm1":
            st["h"] = self.norm(st["x"], w["norm1"])
        elif op == "qkv":
            st["qkv"] = F.linear(st["h"], w["qkv"])
        elif op == "kv":
            qkv = st["qkv"]
            self.write_kv(layer, qkv[:, s.q_size : s.q_size + s.kv_size], qkv[:, s.q_size + s.kv_size :])
        elif op == "attn":
            self.attention(self.lib_check(lib), layer, st["qkv"][:, : s.q_size].view(B, s.heads, s.head_size))
        elif op == "oproj":
            st["o"] = F.linear(self.attn_out.view(B, s.q_size), w["o_proj"])
        elif op == "add1":
            st["x"] = st["x"] + st["o"]
        elif op == "norm2":
            st["h"] = self.norm(st["x"], w["norm2"])
        elif op == "gateup":
            st["gu"] = F.linear(st["h"], w["gate_up"])
        elif op == "act":
            gu = st["gu"]
            st["a"] = F.silu(gu[:, : s.intermediate]) * gu[:, s.intermediate :]
        elif op == "down":
            st["d"] = F.linear(st["a"], w["down"])
        elif op == "add2":
            st["x"] = st["x"] + st["d"]
        else:
            raise ValueError(f"unknown op {op!r}: one of {', '.join(LAYER_OPS)}")

    def norm(self, x: Any, weight: Any) -> Any:
        import torch
        import torch.nn.functional as F

        s = self.w.shape
        rms = getattr(F, "rms_norm", None)
        if rms is not None:
            return rms(x, (s.hidden,), weight, s.rms_eps)
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + s.rms_eps)).to(x.dtype) * weight

    def step(self, lib: Any, ctl: Any = None, *, forks: Sequence[Fork] = (), join: str = "step") -> None:
        """One decode step over all layers; the result lands in ``self.out``. With ``ctl``,
        each fork of ``forks`` (:func:`~.windows.plan_forks`) launches its window's prefetch
        right before its op; the side stream is joined at ``join`` (once at the end of the
        step, or before each o_proj as well)."""
        if join not in JOIN_POINTS:
            raise ValueError(f"join must be one of {JOIN_POINTS}, not {join!r}")
        plan = forks_by_op(forks) if ctl is not None else {}
        st: dict[str, Any] = {"x": self.x0}
        for i in range(self.w.layers):
            for op in LAYER_OPS:
                if ctl is not None:
                    for f in plan.get((i, op), ()):
                        ctl.fork(f.window, i, self.batch)
                    if join == "oproj" and op == "oproj":
                        ctl.join()
                self.run_op(op, lib, i, st)
        if ctl is not None:
            ctl.join()
        self.out.copy_(st["x"])

    def attention_only(self, lib: Any) -> None:
        """Every layer's attention alone (same caches, a fixed query): the attention share."""
        for i in range(self.w.layers):
            self.attention(lib, i, self.q_static)

    def lib_check(self, lib: Any) -> Any:
        if getattr(lib, "scale_by_value", False):
            raise UsageError(
                f"{lib} takes k/v scales by value (vLLM 0.6.4): it syncs per launch and cannot be captured"
            )
        return lib

    def label(self) -> str:
        return f"{self.w.dtype_name}/auto/{self.w.shape.head_size}/{BLOCK_SIZE}"

    def add_prefetch(self, ctl: Any, windows: Sequence[Any]) -> None:
        """Register every layer's window on ``ctl`` (:class:`~.windows.Window` values): its
        tensors (the target layer's weights), its caps per batch bucket, its hint."""
        for w in windows:
            for i in range(self.w.layers):
                tensors = self.w.prefetch_tensors(i, w.name)
                if not tensors:
                    continue
                if isinstance(w.caps, int):
                    ctl.add(
                        w.name, i, tensors, cap_bytes=w.caps or None, batches=None if w.caps else {1: 0}, hint=w.hint
                    )
                else:
                    ctl.add(w.name, i, tensors, batches=dict(w.caps), hint=w.hint)

    def tail_rows(self, cap: int) -> list[tuple[int, int, int]]:
        """The in-kernel form's table at this point: per layer (its key cache's address, the
        first ``cap`` bytes of its o_proj weight), as ``(key, address, bytes)`` rows."""
        from ..prefetch.ranges import weight_ranges

        rows = []
        if cap <= 0:
            return rows
        for i in range(self.w.layers):
            key = int(self.key_caches[i].data_ptr())
            rows += [(key, a, n) for a, n in weight_ranges([self.w.per_layer[i]["o_proj"]], cap)]
        return rows
