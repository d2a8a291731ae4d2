"""``kvpatch bench-decode``: a decode step shaped like a real model, four variants side by side.

Per layer (random weights, the model's real shapes, :mod:`.models`)::

    RMSNorm -> fused QKV GEMM -> write K/V of the new token into the paged cache
    -> PagedAttention (a kvpatch-built library, v1 or v2 by vLLM's rule)
    -> o_proj GEMM (+ residual) -> RMSNorm -> gate/up GEMM -> SiLU * up -> down GEMM (+ residual)

The whole step (all layers) is captured in one CUDA graph per variant. Caches use vLLM's
layouts (key ``[blocks, kv_heads, head/x, block, x]`` with ``x = 16 / element size``,
value ``[blocks, kv_heads, head, block]``), block size 16, one cache per layer and a
random (scattered) block table per layer; every sequence has ``context`` tokens, the
last of which this step writes. RoPE, embeddings and the LM head are left out.

Variants, for each attention library ``NAME`` given (``stock`` first): ``NAME`` and
``NAME+wpf``: the same step with the L2 weight prefetch forked right before each
layer's attention (this layer's o_proj, gate/up and down weights, in that order, up to
the per-batch cap) and joined once at the end of the step.

Method (issue 8): all variants of a point are timed interleaved (order rotated each
repeat) in several rounds; a variant's time is the median of its round medians, and its
spread is min..max over rounds; speedups are per-round ratios to stock. Warm: replays
back to back; cold: before each replay a buffer of 3x L2 is read and written
(``add_``). Outputs are checked first: every variant's step output must equal stock's
bit for bit (the output buffer is NaN-poisoned before each replay). GPU clocks, power
and throttle reasons are read with nvidia-smi after every round.

torch is imported inside functions only.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from .models import ModelShape, model_shape
from .report import DecodeReport

BLOCK_SIZE = 16
PARTITION_SIZE = 512
V1_MAX_SEQ_LEN = 8192
V1_MIN_PARALLELISM = 512
#: The variant suffix for "with weight prefetch".
WPF = "+wpf"
#: Default layers per step: enough that per-layer time is stable, small enough for 16k x 64.
DEFAULT_LAYERS = 8
DEFAULT_MODELS = ("llama-3.1-8b", "llama-3.2-1b")
DEFAULT_DTYPES = ("bf16", "fp16")
DEFAULT_BATCHES = (1, 4, 16, 64)
DEFAULT_CONTEXTS = (1024, 4096, 16384)
#: Per-batch weight-prefetch caps in MiB (bucket bounds: batch b uses the smallest key
#: >= b; above the largest key, no prefetch). The H200's L2 is 60 MB (50 MiB usable by
#: the compute side); at batch <= 4 the GEMMs read each weight once and are latency and
#: bandwidth bound, so warming o_proj + the start of gate/up pays; at batch 16+ the
#: weight prefetch competes with the HBM-bound attention/GEMMs (the seed turns it off
#: above batch 8).
DEFAULT_CAPS_MIB: dict[int, int] = {1: 32, 2: 32, 4: 32, 8: 16}
MiB = 1 << 20
_DTYPES = {"fp16": ("float16", 2), "bf16": ("bfloat16", 2)}


# --------------------------------------------------------------------------- pure helpers


def dispatched_kernel(num_seqs: int, num_heads: int, max_seq_len: int) -> str:
    """vLLM's rule (paged_attn.py): v1 iff max_seq_len <= 8192 and (one partition or
    num_seqs * num_heads > 512)."""
    partitions = -(-max_seq_len // PARTITION_SIZE)
    v1 = max_seq_len <= V1_MAX_SEQ_LEN and (partitions == 1 or num_seqs * num_heads > V1_MIN_PARALLELISM)
    return "v1" if v1 else "v2"


def parse_caps(text: str) -> int | dict[int, int]:
    """``--cap``: ``'1:32,4:32,8:16'`` (per-batch MiB, bucket bounds) -> bytes per batch;
    ``'24'`` -> 24 MiB at every batch; ``'off'`` or ``'0'`` -> 0 (no prefetch);
    ``'default'`` -> :data:`DEFAULT_CAPS_MIB`."""
    text = text.strip().lower()
    if text in ("off", "0", "none"):
        return 0
    if text == "default":
        return {b: c * MiB for b, c in DEFAULT_CAPS_MIB.items()}
    if ":" not in text:
        return _mib(text)
    caps: dict[int, int] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        batch, sep, cap = item.partition(":")
        if not sep or not batch.strip().isdigit() or int(batch) < 1:
            raise ValueError(f"invalid cap {item!r}: use BATCH:MIB, e.g. 1:32,4:32,8:16")
        caps[int(batch)] = _mib(cap)
    return caps


def _mib(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"invalid cap {text!r}: a number of MiB") from None
    if value < 0:
        raise ValueError(f"invalid cap {text!r}: must be >= 0")
    return int(value * MiB) // 16 * 16


def cap_for_batch(caps: int | Mapping[int, int], batch: int) -> int:
    """The cap (bytes) a batch gets: the smallest bucket >= batch, 0 above them all."""
    if isinstance(caps, int):
        return caps
    bounds = sorted(b for b in caps if b >= batch)
    return caps[bounds[0]] if bounds else 0


def point_bytes(shape: ModelShape, elem: int, batch: int, context: int, layers: int) -> int:
    """Device bytes a point needs beyond the weights: caches and activations."""
    blocks = batch * -(-context // BLOCK_SIZE) + 1
    cache = layers * blocks * BLOCK_SIZE * shape.kv_bytes_per_token(elem)
    acts = 16 * batch * (shape.qkv_out + 2 * shape.intermediate + 4 * shape.hidden) * elem * layers
    return cache + acts


def round_stats(rounds: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(rounds), "min": min(rounds), "max": max(rounds)}


def variant_names(libs: Iterable[str], wpf: bool = True) -> list[str]:
    """``['stock', 'patched', 'stock+wpf', 'patched+wpf']``: attention variants, then the same with prefetch."""
    names = list(libs)
    if "stock" not in names:
        raise ValueError(f"the libraries must include 'stock' (the baseline); got {', '.join(names) or 'none'}")
    names = ["stock", *[n for n in names if n != "stock"]]
    return names + ([n + WPF for n in names] if wpf else [])


def parse_lib_arg(text: str) -> tuple[str, str, str]:
    """``NAME=path.so:PREFIX`` -> (name, path, prefix)."""
    name, eq, rest = text.partition("=")
    path, colon, prefix = rest.rpartition(":")
    if not (eq and name and colon and path and prefix):
        raise ValueError(f"invalid library {text!r}: expected NAME=path.so:PREFIX")
    return name.strip(), path, prefix.strip()


# --------------------------------------------------------------------------- environment


_SMI_ROUND = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "clocks_event_reasons.active")
_SMI_ONCE = ("name", "driver_version", "clocks.max.sm", "clocks.max.mem", "power.limit", "memory.total")


def smi(fields: Sequence[str], index: int = 0) -> dict[str, str] | None:
    """One GPU's ``nvidia-smi --query-gpu`` values (read only), None without it."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", f"--id={index}"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    vals = [v.strip() for v in out.stdout.strip().split(",")]
    return dict(zip(fields, vals)) if out.returncode == 0 and len(vals) == len(fields) else None


def power_capped(reasons: str | None) -> bool:
    """Whether nvidia-smi's active clock-event bitmask holds SW power cap (0x4) or HW slowdown (0x8/0x40/0x80)."""
    try:
        mask = int(reasons or "0", 16)
    except ValueError:
        return False
    return bool(mask & (0x4 | 0x8 | 0x40 | 0x80))


def collect_env(device: Any, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    import torch

    dev = torch.device(device)
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    p = torch.cuda.get_device_properties(idx)
    env: dict[str, Any] = {
        "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "gpu": p.name,
        "capability": f"{p.major}.{p.minor}",
        "sm_count": p.multi_processor_count,
        "l2_bytes": int(getattr(p, "L2_cache_size", 0)),
        "memory_bytes": int(p.total_memory),
        "smi": smi(_SMI_ONCE + _SMI_ROUND, idx),
    }
    nvcc = shutil.which("nvcc")
    if nvcc:
        try:
            env["nvcc"] = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[-1]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            pass
    env.update(extra or {})
    return env


# --------------------------------------------------------------------------- the model


class DecodeWeights:
    """One model's layer weights (random, scaled so activations stay near unit size)."""

    def __init__(self, shape: ModelShape, dtype: str, layers: int, device: Any, seed: int = 0) -> None:
        import torch

        self.shape, self.dtype_name, self.layers = shape, dtype, layers
        self.dtype = getattr(torch, _DTYPES[dtype][0])
        self.elem = _DTYPES[dtype][1]
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

    def prefetch_tensors(self, layer: int) -> list[Any]:
        """What the weight prefetch pulls during layer ``layer``'s attention, in reading order."""
        w = self.per_layer[layer]
        return [w["o_proj"], w["gate_up"], w["down"]]

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
            kc = torch.randn(blocks, s.kv_heads, s.head_size // self.x_elems, BLOCK_SIZE, self.x_elems, generator=g, device=dev, dtype=torch.float32).to(dt)
            vc = torch.randn(blocks, s.kv_heads, s.head_size, BLOCK_SIZE, generator=g, device=dev, dtype=torch.float32).to(dt)
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
        self.key_caches[layer][blk, :, :, off, :] = k.reshape(self.batch, s.kv_heads, s.head_size // self.x_elems, self.x_elems)
        self.value_caches[layer][blk, :, :, off] = v.reshape(self.batch, s.kv_heads, s.head_size)

    def attention(self, lib: Any, layer: int, q: Any) -> None:
        s = self.w.shape
        common = (q, self.key_caches[layer], self.value_caches[layer], s.kv_heads, self.scale, self.block_tables[layer],
                  self.seq_lens, BLOCK_SIZE, self.context, None, "auto", self.k_scale, self.v_scale)  # fmt: skip
        if self.kernel == "v1":
            lib.v1(self.attn_out, *common)
        else:
            lib.v2(self.attn_out, self.exp_sums, self.max_logits, self.tmp_out, *common)

    def step(self, lib: Any, ctl: Any = None) -> None:
        """One decode step over all layers; the result lands in ``self.out``."""
        import torch
        import torch.nn.functional as F

        s, B = self.w.shape, self.batch
        rms = getattr(F, "rms_norm", None)

        def norm(x: Any, weight: Any) -> Any:
            if rms is not None:
                return rms(x, (s.hidden,), weight, s.rms_eps)
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + s.rms_eps)).to(x.dtype) * weight

        x = self.x0
        for i, w in enumerate(self.w.per_layer):
            qkv = F.linear(norm(x, w["norm1"]), w["qkv"])
            q = qkv[:, : s.q_size].view(B, s.heads, s.head_size)
            self.write_kv(i, qkv[:, s.q_size : s.q_size + s.kv_size], qkv[:, s.q_size + s.kv_size :])
            if ctl is not None:
                ctl.fork("attn", i, B)
            self.attention(self.lib_check(lib), i, q)
            x = x + F.linear(self.attn_out.view(B, s.q_size), w["o_proj"])
            gu = F.linear(norm(x, w["norm2"]), w["gate_up"])
            x = x + F.linear(F.silu(gu[:, : s.intermediate]) * gu[:, s.intermediate :], w["down"])
        if ctl is not None:
            ctl.join()
        self.out.copy_(x)

    def attention_only(self, lib: Any) -> None:
        """Every layer's attention alone (same caches, a fixed query): the attention share."""
        for i in range(self.w.layers):
            self.attention(lib, i, self.q_static)

    def lib_check(self, lib: Any) -> Any:
        if getattr(lib, "scale_by_value", False):
            raise ValueError(f"{lib} takes k/v scales by value (vLLM 0.6.4): it syncs per launch and cannot be captured")
        return lib

    def label(self) -> str:
        return f"{self.w.dtype_name}/auto/{self.w.shape.head_size}/{BLOCK_SIZE}"

    def add_prefetch(self, ctl: Any, caps: int | Mapping[int, int]) -> None:
        """Register each layer's window on ``ctl``: batch-bucketed caps or one cap."""
        for i in range(self.w.layers):
            tensors = self.w.prefetch_tensors(i)
            if isinstance(caps, int):
                ctl.add("attn", i, tensors, cap_bytes=caps or None, batches=None if caps else {1: 0})
            else:
                ctl.add("attn", i, tensors, batches=dict(caps))


# --------------------------------------------------------------------------- timing


def capture(fn: Callable[[], None], device: Any) -> Any:
    """Run ``fn`` once eagerly on a side stream (cuBLAS setup), then capture it in a graph."""
    import torch

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize(device)
    return graph


def time_rounds(
    launchers: Mapping[str, Callable[[], None]],
    *,
    rounds: int,
    reps: int,
    device: Any,
    flush: Callable[[], None] | None,
    flushed: Iterable[str] = (),
) -> tuple[dict[str, list[float]], list[dict[str, Any]]]:
    """Interleaved timing: per round, ``reps`` repeats of every launcher (order rotated
    per repeat and per round), each timed alone with an event pair; ``flush`` runs
    before each launch of the ``flushed`` launchers, outside the pair. Returns
    per-launcher round medians (us) and nvidia-smi readings per round."""
    import torch

    names = list(launchers)
    flushed = set(flushed)
    n = len(names)
    medians: dict[str, list[float]] = {k: [] for k in names}
    clocks: list[dict[str, Any]] = []
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps * n)]
    idx = torch.device(device).index or 0
    for r in range(rounds):
        for name in names:  # untimed warm-up of this round
            launchers[name]()
        torch.cuda.synchronize(device)
        slots: dict[str, list[int]] = {k: [] for k in names}
        for rep in range(reps):
            for j in range(n):
                name = names[(j + rep + r) % n]
                if flush is not None and name in flushed:
                    flush()
                k = rep * n + j
                events[k][0].record()
                launchers[name]()
                events[k][1].record()
                slots[name].append(k)
        torch.cuda.synchronize(device)
        for name in names:
            medians[name].append(statistics.median(events[k][0].elapsed_time(events[k][1]) * 1e3 for k in slots[name]))
        reading = smi(_SMI_ROUND, idx) or {}
        reading["power_capped"] = power_capped(reading.get("clocks_event_reasons.active"))
        clocks.append(reading)
    return medians, clocks


# --------------------------------------------------------------------------- the benchmark


def run_bench_decode(
    libs: Mapping[str, Any],
    *,
    models: Sequence[str] = DEFAULT_MODELS,
    dtypes: Sequence[str] = DEFAULT_DTYPES,
    batches: Sequence[int] = DEFAULT_BATCHES,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    layers: int = DEFAULT_LAYERS,
    rounds: int = 5,
    reps: int | None = None,
    round_seconds: float = 0.15,
    cold: bool = False,
    weight_prefetch_cap: int | Mapping[int, int] | None = None,
    prefetch_library: Any = None,
    priority: str | int = "high",
    device: Any = "cuda",
    seed: int = 0,
    memory_fraction: float = 0.85,
    json_path: str | os.PathLike[str] | None = None,
    plot_path: str | os.PathLike[str] | None = None,
    text_path: str | os.PathLike[str] | None = None,
    say: Callable[[str], None] | None = None,
) -> DecodeReport:
    """Time the model-shaped decode step for every (model, dtype, batch, context).

    ``libs``: ``{name: kvpatch.gpu.launch.Kernels}`` with ``'stock'``; each library is
    a variant, and each also runs with the weight prefetch (``NAME+wpf``).
    ``weight_prefetch_cap``: bytes per layer window: an int for every batch, a
    ``{batch: bytes}`` bucket table, ``0`` for off, ``None`` for
    :data:`DEFAULT_CAPS_MIB`. ``reps``: timed replays per variant per round (``None``:
    enough for ``round_seconds`` per round, 3..30). Points whose caches do not fit in
    ``memory_fraction`` of free memory, or whose head size a library was not built for,
    are skipped and listed with the reason. Writes JSON / PNG / text when paths are given.
    """
    import torch

    from .kernel import PrefetchLibrary, archs_for_capability, build_prefetch_library

    say = say or (lambda m: print(m, file=sys.stderr, flush=True))
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError("bench-decode needs a CUDA GPU and torch with CUDA")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    names = variant_names(libs)
    caps: int | dict[int, int]
    if weight_prefetch_cap is None:
        caps = {b: c * MiB for b, c in DEFAULT_CAPS_MIB.items()}
    elif isinstance(weight_prefetch_cap, Mapping):
        caps = {int(b): int(c) for b, c in weight_prefetch_cap.items()}
    else:
        caps = int(weight_prefetch_cap)
    for m in models:
        model_shape(m)
    bad = [d for d in dtypes if d not in _DTYPES]
    if bad:
        raise ValueError(f"bench-decode dtypes are fp16 and bf16, not {', '.join(bad)}")
    cap_major, cap_minor = torch.cuda.get_device_capability(dev)
    if isinstance(prefetch_library, PrefetchLibrary):
        pf_lib = prefetch_library
    else:
        path = prefetch_library or os.environ.get("KVPATCH_PREFETCH_LIB") or build_prefetch_library(archs_for_capability(cap_major, cap_minor))
        pf_lib = PrefetchLibrary(path)
    env = collect_env(dev, {
        "prefetch_library": {"path": str(pf_lib.path), "config": pf_lib.config},
        "attention_libraries": {k: {"path": str(getattr(v, "path", "")), "prefix": getattr(v, "prefix", ""),
                                    "configs": list(getattr(v, "configs", ()))} for k, v in libs.items()},
    })  # fmt: skip
    l2 = env["l2_bytes"] or 50 * MiB
    # Read + write 3x L2 (issue 8): before every launch when cold; before each
    # attention-alone launch always (in a step, the weights streaming through L2 evict
    # the KV cache, so warm attention alone would under-state its share).
    flush_buf = torch.empty(3 * l2, dtype=torch.uint8, device=dev)

    def flush() -> None:
        flush_buf.add_(1)
    report = DecodeReport(
        variants=names, layers=layers, rounds=rounds, mode="cold" if cold else "warm",
        caps_bytes=caps if isinstance(caps, int) else {str(b): c for b, c in caps.items()},
        env=env, points=[], skipped=[], priority=str(priority),
    )  # fmt: skip
    t_start = time.perf_counter()
    for model in models:
        shape = model_shape(model)
        for dtype in dtypes:
            label = f"{dtype}/auto/{shape.head_size}/{BLOCK_SIZE}"
            missing = [n for n, lib in libs.items() if getattr(lib, "configs", None) and label not in lib.configs]
            if missing:
                for b in batches:
                    for c in contexts:
                        report.skipped.append({"model": model, "dtype": dtype, "batch": b, "context": c,
                                               "reason": f"{', '.join(missing)} not built for {label}"})  # fmt: skip
                say(f"skip {model} {dtype}: {', '.join(missing)} not built for {label}")
                continue
            weights = DecodeWeights(shape, dtype, layers, dev, seed)
            for batch in batches:
                for context in contexts:
                    need = point_bytes(shape, weights.elem, batch, context, layers)
                    free, _ = torch.cuda.mem_get_info(dev)
                    if need > memory_fraction * free:
                        reason = f"needs {need / 2**30:.1f} GiB for caches and activations, {free / 2**30:.1f} GiB free"
                        report.skipped.append({"model": model, "dtype": dtype, "batch": batch, "context": context, "reason": reason})
                        say(f"skip {model} {dtype} B={batch} ctx={context}: {reason}")
                        continue
                    t0 = time.perf_counter()
                    point = _run_point(libs, names, weights, batch, context, caps, pf_lib, priority, dev,
                                       rounds=rounds, reps=reps, round_seconds=round_seconds, flush=flush, cold=cold,
                                       seed=seed)  # fmt: skip
                    point["seconds"] = round(time.perf_counter() - t0, 2)
                    report.points.append(point)
                    say(report.point_line(point))
                    if json_path:  # after every point: a run cut short keeps what it measured
                        report.save_json(json_path)
                    torch.cuda.empty_cache()
            del weights
            torch.cuda.empty_cache()
    report.seconds = round(time.perf_counter() - t_start, 1)
    if json_path:
        report.save_json(json_path)
    if text_path:
        from ..fsutil import write_atomic

        write_atomic(text_path, report.text_table() + "\n")
    if plot_path:
        try:
            report.plot(plot_path)
        except ImportError as e:
            say(f"no plot: {e}")
    return report


def _run_point(libs, names, weights, batch, context, caps, pf_lib, priority, dev, *, rounds, reps, round_seconds, flush, cold, seed) -> dict[str, Any]:
    import torch

    from .controller import PrefetchController

    step = DecodeStep(weights, batch, context, seed=seed + 1000 * batch + context)
    ctl = PrefetchController(dev, priority=priority, library=pf_lib)
    step.add_prefetch(ctl, caps)
    window = ctl.table("attn", 0, batch)
    graphs: dict[str, Any] = {}
    for name in names:
        base = name.removesuffix(WPF)
        lib = libs[base]
        use = ctl if name.endswith(WPF) else None
        graphs[name] = capture(lambda lib=lib, use=use: step.step(lib, use), dev)
    attn_graphs = {f"attn:{n}": capture(lambda lib=libs[n]: step.attention_only(lib), dev) for n in libs}

    # Correctness first: each variant's output equals stock's bit for bit.
    step.step(libs["stock"])
    torch.cuda.synchronize(dev)
    eager = step.out.clone()
    outputs: dict[str, Any] = {}
    for name, g in graphs.items():
        step.out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize(dev)
        outputs[name] = step.out.clone()
    ref = outputs["stock"]
    finite = bool(torch.isfinite(ref).all())
    identical = {n: bool(torch.equal(o, ref)) for n, o in outputs.items()}

    # Replays per round from one timed replay of stock.
    if reps is None:
        t = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t[0].record()
        graphs["stock"].replay()
        t[1].record()
        torch.cuda.synchronize(dev)
        one = max(t[0].elapsed_time(t[1]) / 1e3, 1e-5)
        reps_used = max(3, min(30, int(round_seconds / (one * (len(graphs) + len(attn_graphs))))))
    else:
        reps_used = reps
    launchers = {n: g.replay for n, g in graphs.items()}
    launchers.update({n: g.replay for n, g in attn_graphs.items()})
    flushed = [n for n in launchers if cold or n.startswith("attn:")]
    medians, clocks = time_rounds(launchers, rounds=rounds, reps=reps_used, device=dev, flush=flush, flushed=flushed)
    stock = medians["stock"]
    variants: dict[str, Any] = {}
    for name in names:
        times = medians[name]
        ratios = [s / t for s, t in zip(stock, times)]
        st = round_stats(times)
        base = name.removesuffix(WPF)
        attn = round_stats(medians[f"attn:{base}"])
        variants[name] = {
            "step_us": st,
            "rounds_us": times,
            "tokens_per_s": batch / (st["median"] * 1e-6),
            "speedup": round_stats(ratios),
            "attention_us": attn["median"],
            "attention_share": attn["median"] / st["median"],
            "per_layer_us": st["median"] / weights.layers,
            "identical_to_stock": identical[name],
            "prefetch": name.endswith(WPF),
            "launches_per_step": weights.layers if (name.endswith(WPF) and window is not None) else 0,
        }
    point = {
        "model": weights.shape.name,
        "dtype": weights.dtype_name,
        "batch": batch,
        "context": context,
        "kernel": step.kernel,
        "layers": weights.layers,
        "cap_bytes": window.bytes if window is not None else 0,
        "prefetch_grid": window.grid if window is not None else 0,
        "layer_weight_bytes": weights.shape.layer_weight_bytes(weights.elem),
        "prefetchable_bytes": sum(t.numel() * t.element_size() for t in weights.prefetch_tensors(0)),
        "kv_bytes_per_layer": batch * context * weights.shape.kv_bytes_per_token(weights.elem),
        "reps": reps_used,
        "finite": finite,
        "graph_equals_eager": bool(torch.equal(eager, ref)),
        "all_identical": all(identical.values()) and finite,
        "variants": variants,
        "clocks": clocks,
        "power_capped_rounds": sum(1 for c in clocks if c.get("power_capped")),
    }
    return point


# --------------------------------------------------------------------------- GEMM micro-benchmark


def run_micro_gemm(
    prefetch_library: Any = None,
    *,
    shapes: Sequence[tuple[str, int, int]] = (("llama-3.1-8b o_proj", 4096, 4096), ("llama-3.2-1b gate_up", 16384, 2048), ("llama-3.1-8b down (capped)", 4096, 14336)),
    batches: Sequence[int] = (1, 4, 16),
    dtype: str = "bf16",
    cap_bytes: int | None = 32 * MiB,
    idle_us: float = 60.0,
    trials: int = 40,
    device: Any = "cuda",
    priority: str | int = "high",
) -> dict[str, Any]:
    """A GEMM ``x[m, k] @ W[n, k].T`` right after an HBM-idle kernel (``torch.cuda._sleep``
    of ``idle_us``), L2 flushed (read + write of 3x L2) before each trial; with the
    weight prefetch forked before the idle kernel vs without, interleaved in one run;
    plus the GEMM fully warm (run twice, the second timed). Medians in us."""
    import torch

    from .controller import PrefetchController
    from .kernel import PrefetchLibrary, archs_for_capability, build_prefetch_library

    dev = torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    major, minor = torch.cuda.get_device_capability(dev)
    if not isinstance(prefetch_library, PrefetchLibrary):
        prefetch_library = PrefetchLibrary(prefetch_library or os.environ.get("KVPATCH_PREFETCH_LIB") or build_prefetch_library(archs_for_capability(major, minor)))
    dt = getattr(torch, _DTYPES[dtype][0])
    props = torch.cuda.get_device_properties(dev)
    l2 = int(getattr(props, "L2_cache_size", 0)) or 50 * MiB
    flush_buf = torch.empty(3 * l2, dtype=torch.uint8, device=dev)
    khz = getattr(props, "clock_rate", None) or 1_980_000
    cycles = int(idle_us * khz / 1e3)
    results = []
    for label, n, k in shapes:
        W = torch.randn(n, k, device=dev, dtype=torch.float32).to(dt)
        ctl = PrefetchController(dev, priority=priority, library=prefetch_library)
        ctl.add("gemm", 0, [W], cap_bytes=cap_bytes)
        table = ctl.table("gemm", 0)
        for m in batches:
            x = torch.randn(m, k, device=dev, dtype=torch.float32).to(dt)
            out = torch.empty(m, n, device=dev, dtype=dt)
            ev = [[torch.cuda.Event(enable_timing=True) for _ in range(2)] for _ in range(3 * trials)]
            for _ in range(3):  # warm-up: cuBLAS handle, heuristics
                torch.mm(x, W.t(), out=out)
            torch.cuda.synchronize(dev)
            slots: dict[str, list[int]] = {"cold": [], "prefetched": [], "warm": []}
            for t in range(trials):
                order = ("cold", "prefetched") if t % 2 == 0 else ("prefetched", "cold")
                for kind in order:
                    flush_buf.add_(1)
                    if kind == "prefetched":
                        ctl.fork("gemm", 0)
                    torch.cuda._sleep(cycles)
                    ctl.join()
                    i = len(slots["cold"]) + len(slots["prefetched"]) + len(slots["warm"])
                    ev[i][0].record()
                    torch.mm(x, W.t(), out=out)
                    ev[i][1].record()
                    slots[kind].append(i)
                torch.mm(x, W.t(), out=out)
                i = len(slots["cold"]) + len(slots["prefetched"]) + len(slots["warm"])
                ev[i][0].record()
                torch.mm(x, W.t(), out=out)
                ev[i][1].record()
                slots["warm"].append(i)
            torch.cuda.synchronize(dev)
            us = {kind: statistics.median(ev[i][0].elapsed_time(ev[i][1]) * 1e3 for i in idx) for kind, idx in slots.items()}
            results.append({
                "gemm": label, "m": m, "n": n, "k": k, "weight_bytes": W.numel() * W.element_size(),
                "prefetched_bytes": table.bytes if table else 0, **{f"{kind}_us": v for kind, v in us.items()},
                "speedup": us["cold"] / us["prefetched"],
            })  # fmt: skip
        del W, ctl
    return {"dtype": dtype, "idle_us": idle_us, "trials": trials, "l2_bytes": l2, "cap_bytes": cap_bytes,
            "prefetch_library": prefetch_library.config, "results": results}  # fmt: skip


def micro_table(micro: Mapping[str, Any]) -> str:
    """Plain text table of :func:`run_micro_gemm`'s results."""
    head = f"{'gemm':<28} {'m':>3} {'weight MiB':>10} {'pf MiB':>7} {'cold us':>8} {'prefetched':>10} {'warm us':>8} {'speedup':>7}"
    lines = [f"GEMM after a {micro['idle_us']:.0f} us HBM-idle kernel, L2 flushed, {micro['dtype']}, median of {micro['trials']}", head]
    for r in micro["results"]:
        lines.append(
            f"{r['gemm']:<28} {r['m']:>3} {r['weight_bytes'] / MiB:>10.1f} {r['prefetched_bytes'] / MiB:>7.1f} "
            f"{r['cold_us']:>8.1f} {r['prefetched_us']:>10.1f} {r['warm_us']:>8.1f} {r['speedup']:>6.2f}x"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- python -m kvpatch.prefetch.decode


EXIT_MISMATCH = 6


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    """The same as ``kvpatch bench-decode``, for machines without the CLI's dependencies."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m kvpatch.prefetch.decode", description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", action="append", default=[], help="NAME=PATH.so:PREFIX (repeatable; 'stock' required)")
    ap.add_argument("--libs-file", help="a libs.txt of NAME=PATH:PREFIX lines (paths relative to the current directory)")
    ap.add_argument("--models", type=_names, default=list(DEFAULT_MODELS))
    ap.add_argument("--dtypes", type=_names, default=list(DEFAULT_DTYPES))
    ap.add_argument("--batches", type=_ints, default=list(DEFAULT_BATCHES))
    ap.add_argument("--contexts", type=_ints, default=list(DEFAULT_CONTEXTS))
    ap.add_argument("--layers", type=int, default=DEFAULT_LAYERS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--cap", type=parse_caps, default=None, help="per-batch MiB '1:32,4:32,8:16', one MiB value, 'off' or 'default'")
    ap.add_argument("--cold", action="store_true", help="flush L2 (read+write 3x L2) before every step")
    ap.add_argument("--prefetch-lib", default=None)
    ap.add_argument("--micro", action="store_true", help="also run the GEMM micro-benchmark (into the JSON)")
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--plot", dest="plot_path")
    ap.add_argument("--text", dest="text_path")
    a = ap.parse_args(argv)

    from ..gpu.launch import Kernels

    specs = [parse_lib_arg(x) for x in a.lib]
    if a.libs_file:
        with open(a.libs_file, encoding="utf-8") as f:
            specs += [parse_lib_arg(line.strip()) for line in f if line.strip() and not line.startswith("#")]
    libs = {name: Kernels(path, prefix) for name, path, prefix in specs}
    report = run_bench_decode(
        libs, models=a.models, dtypes=a.dtypes, batches=a.batches, contexts=a.contexts, layers=a.layers,
        rounds=a.rounds, reps=a.reps, cold=a.cold, weight_prefetch_cap=a.cap, prefetch_library=a.prefetch_lib,
    )  # fmt: skip
    if a.micro:
        report.micro = run_micro_gemm(a.prefetch_lib)
    if a.json_path:
        report.save_json(a.json_path)
    text = report.text_table() + ("\n\n" + micro_table(report.micro) if report.micro else "")
    if a.text_path:
        from ..fsutil import write_atomic

        write_atomic(a.text_path, text + "\n")
    if a.plot_path:
        try:
            report.plot(a.plot_path)
        except ImportError as e:
            print(f"no plot: {e}", file=sys.stderr)
    print(text)
    return 0 if report.summary()["all_identical"] else EXIT_MISMATCH


if __name__ == "__main__":
    sys.exit(main())
