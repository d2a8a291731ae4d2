"""What each window gives and costs, kernel by kernel (GPU): the next GEMM alone, and the
window's own kernels alone, each with vs without that window's prefetch.

For a window (:mod:`.windows`) forked right before op ``P`` of layer 0 and warming the GEMM ``T``
(of layer 0, or of layer 1 for ``down->qkv``), every timed launch is set up the same way, outside
its event pair: the side stream joined, the evict_last guard (the demote mode over every range any
configuration here pulls with ``evict_last``), the clean L2 flush, then the layer's ops up to ``P``
(so L2 holds what it holds in the step: the previous GEMM's weight streaming through). Then:

* ``gemm_off`` / ``gemm_on``: the window's ops run untimed (``on``: after the fork), ``T`` timed alone;
* ``window_off`` / ``window_on``: the fork (``on``), then the window's ops timed (the residual add and
  RMSNorm, SiLU * mul, the KV write and attention...), the prefetch running beside them.

``gave = gemm_off - gemm_on`` is what the warm head saved the GEMM; ``cost = window_on - window_off``
what the prefetch beside the window's kernels cost them; ``net = gave - cost``. All launchers of one
window are interleaved on kvpatch.gpu's one timer (:func:`~kvpatch.gpu.timing.time_interleaved`),
in ``rounds`` rounds; medians over all samples, spreads over round medians. Eager ops (not graphs):
the fork must be able to run beside the timed kernels.

torch is imported inside functions only.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

from ..gpu.stats import median
from .windows import GEMM_WEIGHTS, KINDS, LAYER_OPS, STEP_WINDOWS, Window

MiB = 1 << 20


def op_path(window: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]], tuple[int, str]]:
    """``(pre, window ops, target)`` as ``(layer, op)``: the ops of layer 0 before the fork, the
    ops between the fork and the GEMM the window warms, and that GEMM."""
    kind = KINDS[window]
    seq = [(0, op) for op in LAYER_OPS] + [(1, op) for op in LAYER_OPS]
    start = seq.index((0, kind.before))
    target_layer = 1 if kind.next_layer else 0
    target = (target_layer, kind.target)
    end = seq.index(target, start)
    return seq[:start], seq[start:end], target


def configs_for(caps_mib: Sequence[float], hints: Sequence[str]) -> list[tuple[int, str]]:
    """(cap bytes, hint) pairs, caps as MiB."""
    return [(int(c * MiB) // 16 * 16, h) for c in caps_mib for h in hints]


def summarize(samples: Mapping[str, list[float]], round_medians: Mapping[str, list[float]], tag: str) -> dict[str, Any]:
    """``{tag}_us`` (median of all samples) and ``{tag}_rounds`` (the round medians)."""
    return {f"{tag}_us": median(samples[tag]), f"{tag}_rounds": round_medians[tag]}


def run_window_kernels(
    libs: Mapping[str, Any],
    *,
    model: str,
    dtype: str = "bf16",
    batches: Sequence[int] = (1, 4, 8),
    context: int = 1024,
    windows: Sequence[str] = STEP_WINDOWS,
    caps_mib: Sequence[float] = (4, 8, 16, 32),
    hints: Sequence[str] = ("evict_normal", "evict_last"),
    rounds: int = 3,
    cycles: int = 1,
    prefetch_library: Any = None,
    device: Any = "cuda",
    priority: str | int = "high",
    deadline: float | None = None,
    progress: Callable[[str], None] | None = None,
    flush: Any = None,
) -> dict[str, Any]:
    """Per batch and window: the target GEMM and the window's kernels, with vs without the
    prefetch at each (cap, hint) of ``caps_mib`` x ``hints`` (a cap larger than the weight pulls
    the whole weight). Returns ``{model, dtype, context, results: [...], skipped: [...]}``."""
    import torch

    from ..gpu.flush import L2Flush
    from ..gpu.timing import Timer, l2_bytes_of, time_interleaved
    from ..prefetch.controller import PrefetchController
    from .bench import cuda_device, prefetch_library_for
    from .measure import Guard
    from .models import model_shape
    from .step import DecodeStep, DecodeWeights

    say = progress or (lambda m: None)
    dev = cuda_device(device)
    pf_lib = prefetch_library_for(prefetch_library, dev)
    flush, timer = flush if flush is not None else L2Flush(dev, l2_bytes_of(dev)), Timer(dev)
    lib = libs["stock"]
    weights = DecodeWeights(model_shape(model), dtype, 2, dev, seed=0)
    sizes = {k: v.numel() * v.element_size() for k, v in weights.per_layer[0].items()}
    results: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []

    def one_window(step: Any, batch: int, window: str) -> None:
        """Measure one window at one batch; its closures bind these parameters, not loop variables."""
        t0 = time.perf_counter()
        pre, between, target = op_path(window)
        configs = configs_for(caps_mib, hints)
        ctls = {}
        for cap, hint in configs:
            ctl = PrefetchController(dev, priority=priority, library=pf_lib)
            step.add_prefetch(ctl, [Window(window, cap, hint)])
            ctls[(cap, hint)] = ctl
        ranges = sorted(
            {
                r
                for (cap, hint), c in ctls.items()
                if hint == "evict_last"
                for r in c.hinted_ranges(("evict_last",), batch)
            }
        )
        guard = Guard(pf_lib, _merge(ranges), dev, flush)
        st: dict[str, Any] = {}

        def run(ops: Sequence[tuple[int, str]]) -> None:
            for layer, op in ops:
                step.run_op(op, lib, layer, st)

        def setup(ctl: Any = None, through: bool = False) -> Callable[[], None]:
            def go() -> None:
                for c in ctls.values():
                    c.join()
                guard()
                st.clear()
                st["x"] = step.x0
                run(pre)
                if ctl is not None:
                    ctl.fork(window, 0, batch)
                if through:
                    run(between)

            return go

        tl, tt = target
        launchers: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
            "gemm_off": (lambda: step.run_op(tt, lib, tl, st), setup(None, True)),
            "window_off": (lambda: run(between), setup(None, False)),
        }
        for (cap, hint), ctl in ctls.items():
            tag = f"{cap // MiB if cap % MiB == 0 else cap / MiB:g}@{hint}"
            launchers[f"gemm_on:{tag}"] = (lambda: step.run_op(tt, lib, tl, st), setup(ctl, True))
            launchers[f"window_on:{tag}"] = (lambda: run(between), setup(ctl, False))
        names = list(launchers)
        n = len(names)
        samples: dict[str, list[float]] = {x: [] for x in names}
        meds: dict[str, list[float]] = {x: [] for x in names}
        for r in range(rounds):
            order = names[r % n :] + names[: r % n]
            us = time_interleaved([launchers[x][0] for x in order], reps=n * cycles, warmup=1, timer=timer,
                                  flush=[launchers[x][1] for x in order])  # fmt: skip
            for x, s in zip(order, us):
                samples[x] += s
                meds[x].append(median(s))
        for c in ctls.values():
            c.join()
        torch.cuda.synchronize(dev)
        base = {**summarize(samples, meds, "gemm_off"), **summarize(samples, meds, "window_off")}
        weight = sum(sizes[w] for w in KINDS[window].weights)
        for cap, hint in configs:
            tag = f"{cap // MiB if cap % MiB == 0 else cap / MiB:g}@{hint}"
            on_g, on_w = median(samples[f"gemm_on:{tag}"]), median(samples[f"window_on:{tag}"])
            gave, cost = base["gemm_off_us"] - on_g, on_w - base["window_off_us"]
            results.append({
                "model": model, "batch": batch, "window": window, "target": GEMM_WEIGHTS[KINDS[window].target],
                "cap_bytes": cap, "prefetched_bytes": min(cap, weight), "weight_bytes": weight, "hint": hint,
                **base, "gemm_on_us": on_g, "gemm_on_rounds": meds[f"gemm_on:{tag}"], "window_on_us": on_w,
                "window_on_rounds": meds[f"window_on:{tag}"], "gave_us": gave, "cost_us": cost, "net_us": gave - cost,
                "window_ops": [op for _, op in between],
            })  # fmt: skip
        best = max((r for r in results if r["batch"] == batch and r["window"] == window), key=lambda r: r["net_us"])
        say(f"  {model} B={batch} {window}: {base['gemm_off_us']:.1f} us GEMM, {base['window_off_us']:.1f} us window; "
            f"best {best['cap_bytes'] / MiB:g} MiB @{best['hint']}: gave {best['gave_us']:+.2f} cost {best['cost_us']:+.2f} "
            f"({time.perf_counter() - t0:.1f} s)")  # fmt: skip

    for batch in batches:
        step = DecodeStep(weights, batch, context, seed=1000 * batch + context)
        for window in windows:
            if deadline is not None and time.perf_counter() > deadline:
                skipped.append({"batch": batch, "window": window, "reason": "time budget"})
                continue
            one_window(step, batch, window)
        del step
        torch.cuda.empty_cache()
    del weights
    torch.cuda.empty_cache()
    return {"model": model, "dtype": dtype, "context": context, "rounds": rounds, "caps_mib": list(caps_mib),
            "hints": list(hints), "results": results, "skipped": skipped}  # fmt: skip


def best_configs(
    results: Sequence[Mapping[str, Any]], *, min_net_us: float = 0.0
) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (window, batch): the (cap, hint) of the largest ``net`` over the models measured
    (their ``net_us`` added), kept only if that sum is above ``min_net_us``."""
    table: dict[tuple[str, int, int, str], float] = {}
    for r in results:
        key = (r["window"], r["batch"], r["cap_bytes"], r["hint"])
        table[key] = table.get(key, 0.0) + r["net_us"]
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for (window, batch, cap, hint), net in table.items():
        cur = best.get((window, batch))
        if cur is None or net > cur["net_us"]:
            best[(window, batch)] = {"cap_bytes": cap, "hint": hint, "net_us": net}
    return {k: v for k, v in best.items() if v["net_us"] > min_net_us}


def _merge(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    from .measure import _merge as merge

    return merge(ranges)
