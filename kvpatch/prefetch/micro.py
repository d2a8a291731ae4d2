"""Micro-benchmarks of the L2 weight prefetch (GPU).

* :func:`run_micro_gemm`: a GEMM right after an HBM-idle kernel, L2 flushed, with the
  weight prefetch forked before the idle kernel vs without (and fully warm).
* :func:`run_micro_prefetch`: the prefetch kernel itself across grid / threads /
  chunk / hint / bytes: how long the kernel runs (it only *issues* the bulk
  prefetches), how long until the bytes are in L2 (prefetch then the GEMM on one
  stream, minus the warm GEMM), and the GEMM after a fixed idle window.

torch is imported inside functions only.
"""

from __future__ import annotations

import os
import statistics
from typing import Any, Mapping, Sequence

from .options import MiB
from .step import _DTYPES


def _setup(device: Any, prefetch_library: Any, dtype: str, idle_us: float) -> tuple:
    """What both micro-benchmarks need: the device, the prefetch library (built for this GPU
    if not given), the torch dtype, the L2 size, a 3x-L2 flush buffer and the idle kernel's
    ``torch.cuda._sleep`` cycles."""
    import torch

    from .kernel import PrefetchLibrary, archs_for_capability, build_prefetch_library

    dev = torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if not isinstance(prefetch_library, PrefetchLibrary):
        major, minor = torch.cuda.get_device_capability(dev)
        prefetch_library = PrefetchLibrary(prefetch_library or os.environ.get("KVPATCH_PREFETCH_LIB") or build_prefetch_library(archs_for_capability(major, minor)))
    dt = getattr(torch, _DTYPES[dtype][0])
    props = torch.cuda.get_device_properties(dev)
    l2 = int(getattr(props, "L2_cache_size", 0)) or 50 * MiB
    flush_buf = torch.empty(3 * l2, dtype=torch.uint8, device=dev)
    khz = getattr(props, "clock_rate", None) or 1_980_000
    cycles = int(idle_us * khz / 1e3)
    return dev, prefetch_library, dt, l2, flush_buf, cycles


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

    dev, prefetch_library, dt, l2, flush_buf, cycles = _setup(device, prefetch_library, dtype, idle_us)
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



def run_micro_prefetch(
    prefetch_library: Any = None,
    *,
    configs: Sequence[Mapping[str, Any]] = (),
    dtype: str = "bf16",
    k: int = 4096,
    idle_us: float = 40.0,
    trials: int = 12,
    device: Any = "cuda",
    priority: str | int = "high",
    deadline: float | None = None,
) -> dict[str, Any]:
    """The prefetch kernel across ``configs`` (dicts of ``bytes``, ``grid``, ``threads``,
    ``chunk``, ``hint``; ``None`` values: the library's defaults). Per config, medians
    over ``trials`` (L2 flushed before each measurement, kinds interleaved), in us:

    * ``kernel_us``: the prefetch kernel alone (it only issues; the fills go on after it);
    * ``chained_us``: the prefetch kernel then the GEMV ``x[1, k] @ W[n, k].T`` over the
      same bytes on one stream; ``fill_us = chained_us - warm_us`` is about how long the
      bytes take to land, ``fill_GBps = bytes / fill_us`` the rate the prefetch achieves;
    * ``after_idle_us``: the GEMV after the prefetch ran on the side stream during an
      ``idle_us`` HBM-idle kernel (what the decode step hopes for).

    Per byte size also ``cold_us`` (GEMV after a flush) and ``warm_us`` (GEMV run twice,
    the second timed). ``deadline`` (``time.perf_counter()`` value): configs left when
    it passes are skipped (listed)."""
    import time

    import torch

    from .controller import PrefetchController

    dev, prefetch_library, dt, l2, flush_buf, cycles = _setup(device, prefetch_library, dtype, idle_us)
    elem = torch.empty((), dtype=dt).element_size()
    x = torch.randn(1, k, device=dev, dtype=torch.float32).to(dt)
    weights: dict[int, Any] = {}
    base: dict[int, dict[str, float]] = {}
    results: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []

    def timed(before: Any, body: Any, n: int) -> float:
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for e in ev:
            flush_buf.add_(1)
            before()
            e[0].record()
            body()
            e[1].record()
        torch.cuda.synchronize(dev)
        return statistics.median(a.elapsed_time(b) * 1e3 for a, b in ev)

    nothing = lambda: None  # noqa: E731
    for cfg in configs:
        if deadline is not None and time.perf_counter() > deadline:
            skipped.append(dict(cfg))
            continue
        nbytes = int(cfg["bytes"])
        n = max(16, nbytes // (k * elem))
        if nbytes not in weights:
            W = weights[nbytes] = torch.randn(n, k, device=dev, dtype=torch.float32).to(dt)
            out = torch.empty(1, n, device=dev, dtype=dt)
            gemv = lambda W=W, out=out: torch.mm(x, W.t(), out=out)  # noqa: E731
            for _ in range(3):
                gemv()
            cold = timed(nothing, gemv, trials)
            warm = timed(gemv, gemv, trials)  # the first (untimed) run warms L2 for the second
            base[nbytes] = {"cold_us": cold, "warm_us": warm, "gemv": gemv}  # type: ignore[dict-item]
        W = weights[nbytes]
        gemv = base[nbytes]["gemv"]  # type: ignore[assignment]
        ctl = PrefetchController(dev, priority=priority, library=prefetch_library, grid=cfg.get("grid"),
                                 threads=cfg.get("threads"), chunk=cfg.get("chunk"), hint=cfg.get("hint"))  # fmt: skip
        ctl.add("w", 0, [W])
        table = ctl.table("w", 0)
        stream = torch.cuda.current_stream(dev).cuda_stream

        options = dict(ctl.launch_options)

        def launch_here(table: Any = table, options: dict = options) -> None:  # on the current stream
            prefetch_library.launch(table.table_ptr, table.rows, table.grid, stream, **options)

        def chained() -> None:
            launch_here()
            gemv()

        def fork_idle(ctl: Any = ctl) -> None:
            ctl.fork("w", 0)
            torch.cuda._sleep(cycles)
            ctl.join()

        kernel_us = timed(nothing, launch_here, trials)
        chained_us = timed(nothing, chained, trials)
        after_idle_us = timed(fork_idle, gemv, trials)
        warm = base[nbytes]["warm_us"]
        fill = max(chained_us - warm, 1e-3)
        results.append({
            "bytes": nbytes, "grid": table.grid, "threads": cfg.get("threads"), "chunk": cfg.get("chunk"),
            "hint": cfg.get("hint"), "kernel_us": kernel_us, "issue_GBps": nbytes / kernel_us / 1e3,
            "chained_us": chained_us, "fill_us": fill, "fill_GBps": nbytes / fill / 1e3,
            "after_idle_us": after_idle_us, "cold_us": base[nbytes]["cold_us"], "warm_us": warm,
            "idle_speedup": base[nbytes]["cold_us"] / after_idle_us,
        })  # fmt: skip
    return {"dtype": dtype, "k": k, "idle_us": idle_us, "trials": trials, "l2_bytes": l2,
            "prefetch_library": prefetch_library.config, "results": results, "skipped": skipped}  # fmt: skip


def micro_prefetch_table(micro: Mapping[str, Any]) -> str:
    """Plain text table of :func:`run_micro_prefetch`'s results."""
    lines = [
        f"prefetch kernel alone / landed (prefetch then GEMV on one stream, minus the warm GEMV) / GEMV after a "
        f"{micro['idle_us']:.0f} us idle window; L2 flushed; median of {micro['trials']}; L2 {micro['l2_bytes'] / MiB:.0f} MiB",
        f"{'MiB':>4} {'grid':>4} {'thr':>4} {'chunk':>6} {'hint':>12} {'kernel us':>9} {'issue GB/s':>10} {'fill us':>8} "
        f"{'fill GB/s':>9} {'cold us':>8} {'warm us':>8} {'idle+pf us':>10} {'x':>6}",
    ]
    for r in micro["results"]:
        lines.append(
            f"{r['bytes'] / MiB:>4.0f} {r['grid']:>4} {r['threads'] or 'def':>4} {r['chunk'] or 'def':>6} {r['hint'] or 'def':>12} "
            f"{r['kernel_us']:>9.1f} {r['issue_GBps']:>10.0f} {r['fill_us']:>8.1f} {r['fill_GBps']:>9.0f} "
            f"{r['cold_us']:>8.1f} {r['warm_us']:>8.1f} {r['after_idle_us']:>10.1f} {r['idle_speedup']:>5.2f}x"
        )
    if micro.get("skipped"):
        lines.append(f"{len(micro['skipped'])} configurations skipped (time budget)")
    return "\n".join(lines)
