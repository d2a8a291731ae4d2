"""One decode point measured: each arm's step captured in a CUDA graph of its own, outputs
checked bit for bit, then interleaved rounds on kvpatch.gpu's one timer, with the controls.

An arm is an :class:`~.arms.Arm` (a library's step, with side-stream windows, their zero-byte
control, or the in-kernel form). The timing is :func:`kvpatch.gpu.timing.time_interleaved`
(event pairs; each launcher follows each equally often; a GPU-side lead so no replay waits for
the host), one call per round with the start of the order moved a slot each round; a launch's
``flush`` runs before it, outside the event pair:

* **the guard**: where any arm prefetches with ``evict_last`` at this point, every launch of
  every arm is preceded by the prefetch library's demote mode over all those ranges (each
  128-byte line back to ``evict_normal``), so lines one replay kept cannot outlive the L2's
  normal traffic into the next replay, whichever arm that is; the same work precedes every
  launch, so no arm pays for it alone. :func:`~.arms.carryover_check` shows what is left: each
  arm's time right after a hinted arm over its time after the others.
* **cold** (``--cold``): :class:`~kvpatch.gpu.flush.L2Flush` after the guard, before every launch.

Every arm's raw samples, with each round's order, stay in the point's ``raw`` (the predecessor of
every sample can be read back). Each round's wall-clock window is kept so the run's nvidia-smi
sampler (:class:`kvpatch.gpu.env.SmiSampler`) can say whether it ran throttled.

torch is imported inside functions only.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

from ..errors import UsageError
from ..gpu.stats import median, ratio_stats
from ..gpu.timing import Timer, time_interleaved
from .arms import AA, AA_TOLERANCE, Arm, carryover_check, check_arms, zero_twin
from .step import DecodeStep
from .windows import plan_forks, prefetch_bytes

#: The attention-alone launcher's name: ``attn:stock``.
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


class Guard:
    """Before a launch: the demote mode over ``ranges`` (every line back to ``evict_normal``),
    then, with ``flush``, the L2 flush; on the current stream, outside the timed pair."""

    def __init__(self, pf_lib: Any, ranges: Sequence[tuple[int, int]], device: Any, flush: Callable[[], None] | None = None,
                 grid: int = 264, threads: int = 256) -> None:  # fmt: skip
        from ..prefetch.ranges import range_table

        self.pf_lib, self.ranges, self.flush = pf_lib, list(ranges), flush
        self.bytes = sum(n for _, n in self.ranges)
        self.table = range_table(self.ranges, device) if self.ranges else None
        self.device, self.grid, self.threads = device, grid, threads
        if self.ranges and "demote" not in getattr(pf_lib, "modes", ()):
            raise UsageError(
                "the evict_last guard needs the prefetch library's demote mode (PrefetchKernelSpec(demote=True))"
            )

    def __call__(self) -> None:
        import torch

        if self.table is not None:
            stream = torch.cuda.current_stream(self.device).cuda_stream
            self.pf_lib.run(
                int(self.table.data_ptr()), len(self.ranges), self.grid, stream, mode="demote", threads=self.threads
            )
        if self.flush is not None:
            self.flush()

    def describe(self) -> dict[str, Any]:
        return {"demoted_bytes": self.bytes, "ranges": len(self.ranges), "flush": self.flush is not None}


def time_rounds(launchers: Mapping[str, Callable[[], None]], *, rounds: int, cycles: int, timer: Timer,
                flush: Mapping[str, Callable[[], None] | None]) -> tuple[dict[str, list[float]], list[dict[str, Any]]]:  # fmt: skip
    """``rounds`` rounds of :func:`~kvpatch.gpu.timing.time_interleaved` over ``launchers``,
    ``cycles`` whole carry-over cycles each (every launcher timed ``n * cycles`` times), the
    order's start moved by one slot each round. Returns each launcher's per-round median (us)
    and each round's raw record: ``{order, cycles, samples_us, t0, t1}``."""
    names = list(launchers)
    n = len(names)
    medians: dict[str, list[float]] = {x: [] for x in names}
    raw: list[dict[str, Any]] = []
    for r in range(rounds):
        order = names[r % n :] + names[: r % n]
        t0 = time.time()
        us = time_interleaved([launchers[x] for x in order], reps=n * cycles, warmup=1, timer=timer,
                              flush=[flush.get(x) for x in order])  # fmt: skip
        raw.append({"order": order, "cycles": cycles, "samples_us": dict(zip(order, us)), "t0": t0, "t1": time.time()})
        for x, samples in zip(order, us):
            medians[x].append(median(samples))
    return medians, raw


def build_graphs(step: DecodeStep, arms: Sequence[Arm], libs: Mapping[str, Any], pf_lib: Any, device: Any,
                 tails: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]:  # fmt: skip
    """Each arm's graph; the controllers they launch from (keep them alive while the graphs
    replay: a captured graph holds no reference to its range tables); what each prefetches."""
    import torch

    from ..prefetch.controller import PrefetchController

    batch, weights = step.batch, step.w
    graphs: dict[str, Any] = {}
    keep: dict[str, Any] = {}
    info: dict[str, dict[str, Any]] = {}
    sizes = {k: v.numel() * v.element_size() for k, v in weights.per_layer[0].items()}
    for arm in arms:
        lib = libs[arm.library]
        if arm.tail is not None:
            rows = step.tail_rows(arm.tail.cap(batch))
            tails[arm.library].set(rows, hint=arm.tail.hint, chunk=arm.tail.chunk,
                                   stream=torch.cuda.current_stream(device).cuda_stream)  # fmt: skip
            torch.cuda.synchronize(device)
            info[arm.name] = {"prefetch_bytes": sum(r[2] for r in rows), "rows": len(rows), "forks": 0}
        if arm.wpf is None:
            graphs[arm.name] = capture(lambda lib=lib: step.step(lib), device)
            info.setdefault(arm.name, {"prefetch_bytes": 0, "forks": 0})
            continue
        ctl = keep[arm.name] = PrefetchController(
            device, library=pf_lib, zero_bytes=arm.zero, **arm.wpf.controller_options()
        )
        windows = arm.wpf.effective_windows()
        step.add_prefetch(ctl, windows)
        forks = plan_forks(windows, weights.layers, batch)
        graphs[arm.name] = capture(
            lambda lib=lib, ctl=ctl, forks=forks, j=arm.wpf.join: step.step(lib, ctl, forks=forks, join=j), device
        )
        info[arm.name] = {"prefetch_bytes": 0 if arm.zero else prefetch_bytes(forks, sizes), "forks": len(forks),
                          "grids": sorted({t.grid for key in ctl.windows() if (t := ctl.table(*key, batch)) is not None})}  # fmt: skip
    return graphs, keep, info


def measure_point(
    step: DecodeStep,
    arms: Sequence[Arm],
    libs: Mapping[str, Any],
    pf_lib: Any,
    device: Any,
    *,
    rounds: int,
    cycles: int | None,
    round_seconds: float,
    flush: Callable[[], None],
    cold: bool,
    timer: Timer,
    guard: str = "auto",
    tails: Mapping[str, Any] | None = None,
    attention: bool = True,
) -> dict[str, Any]:
    """Time ``arms`` (the first plain stock) at one point, interleaved, after checking that
    every output equals stock's bit for bit. ``guard``: ``auto`` (demote where an arm uses
    evict_last), ``on`` (the same, stated), ``off`` (never: to show what it prevents).
    ``tails``: ``{library: WeightTail}`` of the in-kernel arms. Returns the point's dict."""
    import torch

    check_arms(arms)
    if guard not in ("auto", "on", "off"):
        raise ValueError(f"guard must be auto, on or off, not {guard!r}")
    batch, weights = step.batch, step.w
    graphs, keep, info = build_graphs(step, arms, libs, pf_lib, device, tails or {})
    attn_graphs = {f"{ATTN}stock": capture(lambda: step.attention_only(libs["stock"]), device)} if attention else {}

    # Correctness first: each arm's output equals stock's bit for bit (NaN-poisoned before each replay).
    step.step(libs["stock"])
    torch.cuda.synchronize(device)
    eager = step.out.clone()
    identical = {}
    for name, g in graphs.items():
        step.out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize(device)
        identical[name] = bool(torch.equal(step.out, eager))
    finite = bool(torch.isfinite(eager).all())

    hinted = {a.name for a in arms if "evict_last" in a.hints(batch)}
    ranges: list[tuple[int, int]] = []
    for a in arms:
        if a.name in hinted and a.name in keep:
            ranges += keep[a.name].hinted_ranges(("evict_last",), batch)
        elif a.name in hinted and a.tail is not None:
            ranges += [(r[1], r[2]) for r in step.tail_rows(a.tail.cap(batch))]
    ranges = _merge(ranges)
    use_guard = guard != "off" and bool(ranges)
    guarded = Guard(pf_lib, ranges if use_guard else [], device, flush if cold else None)
    launchers = {n: g.replay for n, g in graphs.items()}
    launchers.update({n: g.replay for n, g in attn_graphs.items()})
    cold_attn = Guard(pf_lib, ranges if use_guard else [], device, flush)  # attention alone: always cold
    flushes = {n: (cold_attn if n.startswith(ATTN) else guarded if (use_guard or cold) else None) for n in launchers}

    if cycles is None:  # whole carry-over cycles per round from one timed replay of stock
        one = max(median(time_interleaved([graphs["stock"].replay], reps=3, warmup=1, timer=timer)[0]) * 1e-6, 1e-5)
        cycles = max(1, min(4, int(round_seconds / (one * len(launchers) ** 2))))
    health = (timer.chunks, timer.retried, timer.host_bound)
    medians, raw = time_rounds(launchers, rounds=rounds, cycles=cycles, timer=timer, flush=flushes)
    stock = medians["stock"]
    out: dict[str, Any] = {}
    for arm in arms:
        times = medians[arm.name]
        st = round_stats(times)
        twin = zero_twin(arm, arms)
        out[arm.name] = {
            **arm.to_dict(),
            "step_us": st,
            "rounds_us": times,
            "tokens_per_s": batch / (st["median"] * 1e-6),
            "speedup": ratio_stats(stock, times),
            # over the same library without prefetch: what the prefetch alone gives
            "speedup_vs_library": ratio_stats(medians[arm.baseline], times) if arm.baseline != arm.name else None,
            # over its zero-byte twin: what the bytes alone give (the forks and launches the same)
            "speedup_vs_zero": ratio_stats(medians[twin], times) if twin else None,
            "per_layer_us": st["median"] / weights.layers,
            "identical_to_stock": identical[arm.name],
            "prefetch": arm.prefetches(batch),
            "hinted_evict_last": arm.name in hinted,
            **info.get(arm.name, {}),
        }
    if attn_graphs:
        att = round_stats(medians[f"{ATTN}stock"])
        out["stock"]["attention_us"] = att["median"]
        out["stock"]["attention_share"] = att["median"] / out["stock"]["step_us"]["median"]
    aa = out.get("stock" + AA)
    return {
        "model": weights.shape.name,
        "dtype": weights.dtype_name,
        "batch": batch,
        "context": step.context,
        "kernel": step.kernel,
        "layers": weights.layers,
        "arms": [a.name for a in arms],
        "cycles": cycles,
        "samples_per_round": len(launchers) * cycles,
        "layer_weight_bytes": weights.shape.layer_weight_bytes(weights.elem),
        "kv_bytes_per_layer": batch * step.context * weights.shape.kv_bytes_per_token(weights.elem),
        "finite": finite,
        "all_identical": all(identical.values()) and finite,
        "aa": (
            {
                "median": aa["speedup"]["median"],
                "min": aa["speedup"]["min"],
                "max": aa["speedup"]["max"],
                "within": abs(aa["speedup"]["median"] - 1) <= AA_TOLERANCE,
            }
            if aa
            else None
        ),  # fmt: skip
        "guard": {"mode": guard, "on": use_guard, "hinted_arms": sorted(hinted), **guarded.describe()},
        "carryover": carryover_check(raw, hinted, [a.name for a in arms]) if hinted else None,
        "timer": {
            "chunks": timer.chunks - health[0],
            "retried": timer.retried - health[1],
            "host_bound": timer.host_bound - health[2],
        },
        "variants": out,
        "raw": [{k: r[k] for k in ("order", "cycles", "samples_us")} for r in raw],
        "rounds": [{"t0": r["t0"], "t1": r["t1"]} for r in raw],
    }


def guard_check(step: DecodeStep, libs: Mapping[str, Any], pf_lib: Any, device: Any, wpf: Any, *, timer: Timer,
                rounds: int = 5, cycles: int = 4) -> dict[str, Any]:  # fmt: skip
    """Whether the guard itself moves stock: two captures of stock's step interleaved, one
    after the demote over ``wpf``'s evict_last ranges, one after nothing, with no arm that
    prefetches (no line is evict_last). ``ratio`` (plain / after the demote, per round) near 1:
    the demote neither warms nor slows what follows it."""
    from ..prefetch.controller import PrefetchController

    ctl = PrefetchController(device, library=pf_lib, **wpf.controller_options())
    step.add_prefetch(ctl, wpf.effective_windows())
    guard = Guard(pf_lib, _merge(ctl.hinted_ranges(("evict_last",), step.batch)), device)
    graphs = {
        "after_demote": capture(lambda: step.step(libs["stock"]), device),
        "plain": capture(lambda: step.step(libs["stock"]), device),
    }
    medians, raw = time_rounds({k: g.replay for k, g in graphs.items()}, rounds=rounds, cycles=cycles, timer=timer,
                               flush={"after_demote": guard, "plain": None})  # fmt: skip
    return {"model": step.w.shape.name, "batch": step.batch, "context": step.context, **guard.describe(),
            "after_demote_us": round_stats(medians["after_demote"]), "plain_us": round_stats(medians["plain"]),
            "ratio": ratio_stats(medians["plain"], medians["after_demote"]),
            "raw": [{k: r[k] for k in ("order", "cycles", "samples_us")} for r in raw]}  # fmt: skip


def _merge(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(address, bytes) ranges, each byte once, sorted."""
    merged: list[list[int]] = []
    for lo, n in sorted(ranges):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], lo + n)
        else:
            merged.append([lo, lo + n])
    return [(lo, hi - lo) for lo, hi in merged]


def close_rounds(point: dict[str, Any], sampler: Any) -> None:
    """Fill a point's ``clocks`` (one nvidia-smi window summary per round, after the
    sampler stopped) and ``power_capped_rounds``."""
    clocks = [
        (sampler.window(w["t0"], w["t1"]) if sampler is not None else None) or {} for w in point.get("rounds", [])
    ]
    point["clocks"] = clocks
    point["power_capped_rounds"] = sum(1 for c in clocks if c.get("flagged"))
