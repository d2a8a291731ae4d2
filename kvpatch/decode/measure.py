"""One decode point measured: each variant's step captured in a CUDA graph, outputs checked
bit for bit, then interleaved rounds on kvpatch.gpu's one timer.

A variant is ``(name, attention library name, WeightPrefetch or None)``. The timing is
:func:`kvpatch.gpu.timing.time_interleaved` (event pairs, each launcher following each
equally often, a GPU-side lead so no replay waits for the host), one call per round with
the start of the order rotated by a slot each round; the flush is
:class:`kvpatch.gpu.flush.L2Flush`; each round's wall-clock window is kept so the run's
nvidia-smi sampler (:class:`kvpatch.gpu.env.SmiSampler`) can say whether it ran throttled.

torch is imported inside functions only.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

from ..gpu.stats import median
from ..gpu.timing import Timer, time_interleaved
from .options import WeightPrefetch
from .step import DecodeStep

#: The attention-alone launchers' names: ``attn:<library>``.
ATTN = "attn:"


def round_stats(rounds: Sequence[float]) -> dict[str, float]:
    """``{median, min, max}`` of per-round values."""
    return {"median": median(rounds), "min": min(rounds), "max": max(rounds)}


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


def time_rounds(launchers: Mapping[str, Callable[[], None]], *, rounds: int, reps: int, timer: Timer,
                flush: Callable[[], None] | None, flushed: Sequence[str] = ()) -> tuple[dict[str, list[float]], list[dict[str, float]]]:  # fmt: skip
    """``rounds`` rounds of :func:`~kvpatch.gpu.timing.time_interleaved` over ``launchers``
    (``flush`` before each launch of the ``flushed`` ones, outside the timed pair), the
    order's start moved by one slot each round. Returns each launcher's per-round median
    (us) and each round's wall-clock window ``{t0, t1}`` (epoch seconds)."""
    names = list(launchers)
    medians: dict[str, list[float]] = {n: [] for n in names}
    windows: list[dict[str, float]] = []
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        t0 = time.time()
        us = time_interleaved([launchers[n] for n in order], reps=reps, warmup=1, timer=timer,
                              flush=[flush if n in flushed else None for n in order])  # fmt: skip
        windows.append({"t0": t0, "t1": time.time()})
        for n, samples in zip(order, us):
            medians[n].append(median(samples))
    return medians, windows


def measure_point(
    step: DecodeStep,
    variants: Sequence[tuple[str, str, WeightPrefetch | None]],
    libs: Mapping[str, Any],
    pf_lib: Any,
    device: Any,
    *,
    rounds: int,
    reps: int | None,
    round_seconds: float,
    flush: Callable[[], None],
    cold: bool,
    timer: Timer,
) -> dict[str, Any]:
    """Time ``variants`` (the first must be ``('stock', 'stock', None)``) on one point,
    interleaved, after checking that every output equals stock's bit for bit. Returns the
    point's dict (see the JSON); its ``rounds`` are the rounds' wall-clock windows."""
    import torch

    from ..prefetch.controller import PrefetchController

    if not variants or variants[0][:2] != ("stock", "stock") or variants[0][2] is not None:
        raise ValueError("the first variant must be ('stock', 'stock', None)")
    batch, weights = step.batch, step.w
    graphs: dict[str, Any] = {}
    windows: dict[str, Any] = {}
    # A captured graph keeps no Python reference: each controller (its device range tables)
    # must live as long as the graphs that launch from them are replayed, i.e. this call.
    controllers: dict[str, Any] = {}
    for name, lib_name, wpf in variants:
        lib = libs[lib_name]
        if wpf is None:
            graphs[name] = capture(lambda lib=lib: step.step(lib), device)
            continue
        ctl = controllers[name] = PrefetchController(device, library=pf_lib, **wpf.controller_options())
        step.add_prefetch(ctl, wpf.caps)
        windows[name] = ctl.table("attn", 0, batch)
        graphs[name] = capture(lambda lib=lib, ctl=ctl, wpf=wpf: step.step(lib, ctl, fork=wpf.fork, join=wpf.join), device)
    attn_libs = sorted({lib_name for _, lib_name, _ in variants}, key=lambda n: n != "stock")
    attn_graphs = {f"{ATTN}{n}": capture(lambda lib=libs[n]: step.attention_only(lib), device) for n in attn_libs}

    # Correctness first: each variant's output equals stock's bit for bit.
    step.step(libs["stock"])
    torch.cuda.synchronize(device)
    eager = step.out.clone()
    outputs: dict[str, Any] = {}
    for name, g in graphs.items():
        step.out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize(device)
        outputs[name] = step.out.clone()
    ref = outputs["stock"]
    finite = bool(torch.isfinite(ref).all())
    identical = {n: bool(torch.equal(o, ref)) for n, o in outputs.items()}

    if reps is None:  # replays per round from one timed replay of stock
        one = max(time_interleaved([graphs["stock"].replay], reps=1, warmup=1, timer=timer)[0][0] * 1e-6, 1e-5)
        reps = max(3, min(30, int(round_seconds / (one * (len(graphs) + len(attn_graphs))))))
    launchers = {n: g.replay for n, g in graphs.items()}
    launchers.update({n: g.replay for n, g in attn_graphs.items()})
    # cold: before every launch; attention alone: always (in a step, the weights streaming
    # through L2 evict the KV cache, so warm attention alone would under-state its share)
    flushed = [n for n in launchers if cold or n.startswith(ATTN)]
    medians, rounds_at = time_rounds(launchers, rounds=rounds, reps=reps, timer=timer, flush=flush, flushed=flushed)
    stock = medians["stock"]
    out: dict[str, Any] = {}
    for name, lib_name, wpf in variants:
        times = medians[name]
        st = round_stats(times)
        attn = round_stats(medians[f"{ATTN}{lib_name}"])
        window = windows.get(name)
        out[name] = {
            "library": lib_name,
            "step_us": st,
            "rounds_us": times,
            "tokens_per_s": batch / (st["median"] * 1e-6),
            "speedup": round_stats([s / t for s, t in zip(stock, times)]),
            # over the same attention library without the prefetch: what the prefetch alone gives
            "speedup_vs_library": round_stats([b / t for b, t in zip(medians[lib_name], times)]) if lib_name in medians else None,
            "attention_us": attn["median"],
            "attention_share": attn["median"] / st["median"],
            "per_layer_us": st["median"] / weights.layers,
            "identical_to_stock": identical[name],
            "prefetch": wpf is not None,
            "weight_prefetch": wpf.to_dict() if wpf is not None else None,
            "cap_bytes": window.bytes if window is not None else 0,
            "prefetch_grid": window.grid if window is not None else 0,
            "launches_per_step": weights.layers if window is not None else 0,
        }
    first = next((out[n] for n, _, w in variants if w is not None), None)
    return {
        "model": weights.shape.name,
        "dtype": weights.dtype_name,
        "batch": batch,
        "context": step.context,
        "kernel": step.kernel,
        "layers": weights.layers,
        "cap_bytes": first["cap_bytes"] if first else 0,
        "prefetch_grid": first["prefetch_grid"] if first else 0,
        "layer_weight_bytes": weights.shape.layer_weight_bytes(weights.elem),
        "prefetchable_bytes": sum(t.numel() * t.element_size() for t in weights.prefetch_tensors(0)),
        "kv_bytes_per_layer": batch * step.context * weights.shape.kv_bytes_per_token(weights.elem),
        "reps": reps,
        "finite": finite,
        "graph_equals_eager": bool(torch.equal(eager, ref)),
        "all_identical": all(identical.values()) and finite,
        "variants": out,
        "rounds": rounds_at,
    }


def close_rounds(point: dict[str, Any], sampler: Any) -> None:
    """Fill a point's ``clocks`` (one nvidia-smi window summary per round, after the
    sampler stopped) and ``power_capped_rounds``."""
    clocks = [(sampler.window(w["t0"], w["t1"]) if sampler is not None else None) or {} for w in point.get("rounds", [])]
    point["clocks"] = clocks
    point["power_capped_rounds"] = sum(1 for c in clocks if c.get("flagged"))
