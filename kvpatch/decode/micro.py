"""Micro-benchmarks of the L2 weight prefetch (GPU).

* :func:`run_micro_gemm`: a GEMM right after an HBM-idle kernel, L2 flushed, with the
  weight prefetch forked before the idle kernel vs without (and fully warm). Where the
  prefetch library has the demote mode, every trial starts with it over the prefetched range
  (lines an ``evict_last`` prefetch kept could otherwise outlive the flush into the next trial).

Both time on kvpatch.gpu's one timer (:func:`~kvpatch.gpu.timing.time_interleaved`: only the
GEMM or the prefetch kernel between the event pair; the flush, the fork and the idle kernel
run before it, outside) and flush with :class:`~kvpatch.gpu.flush.L2Flush`, which leaves no
dirty line for the timed GEMM to write back.
* :func:`run_micro_prefetch`: the prefetch kernel itself across grid / threads /
  chunk / hint / bytes: how long the kernel runs (it only *issues* the bulk
  prefetches), how long until the bytes are in L2 (prefetch then the GEMM on one
  stream, minus the warm GEMM), and the GEMM after a fixed idle window.

torch is imported inside functions only.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..gpu.stats import median
from .options import MiB
from .step import DTYPES


def _setup(device: Any, prefetch_library: Any, dtype: str, idle_us: float) -> tuple:
    """What both micro-benchmarks need: the device, the prefetch library (built for this GPU
    if not given), the torch dtype, the L2 size, the flush, a timer and the idle kernel's
    ``torch.cuda._sleep`` cycles."""
    import torch

    from ..gpu.flush import L2Flush
    from ..gpu.timing import Timer, l2_bytes_of
    from .bench import cuda_device, prefetch_library_for

    dev = cuda_device(device)
    prefetch_library = prefetch_library_for(prefetch_library, dev)
    dt = getattr(torch, DTYPES[dtype][0])
    props = torch.cuda.get_device_properties(dev)
    l2 = l2_bytes_of(dev)
    khz = getattr(props, "clock_rate", None) or 1_980_000
    cycles = int(idle_us * khz / 1e3)
    return dev, prefetch_library, dt, l2, L2Flush(dev, l2), Timer(dev), cycles


def run_micro_gemm(
    prefetch_library: Any = None,
    *,
    shapes: Sequence[tuple[str, int, int]] = (
        ("llama-3.1-8b o_proj", 4096, 4096),
        ("llama-3.2-1b gate_up", 16384, 2048),
        ("llama-3.1-8b down (capped)", 4096, 14336),
    ),
    batches: Sequence[int] = (1, 4, 16),
    dtype: str = "bf16",
    cap_bytes: int | None = 32 * MiB,
    idle_us: float = 60.0,
    trials: int = 40,
    device: Any = "cuda",
    priority: str | int = "high",
    hint: str | None = None,
) -> dict[str, Any]:
    """A GEMM ``x[m, k] @ W[n, k].T`` right after an HBM-idle kernel (``torch.cuda._sleep``
    of ``idle_us``), L2 flushed before each trial; with the weight prefetch forked before
    the idle kernel vs without, interleaved in one run; plus the GEMM fully warm (run
    right before, untimed). ``hint``: the prefetch's eviction hint (None: the library's).
    Medians in us."""
    import torch

    from ..gpu.timing import time_interleaved
    from ..prefetch.controller import PrefetchController

    dev, prefetch_library, dt, l2, flush, timer, cycles = _setup(device, prefetch_library, dtype, idle_us)
    results = []
    for label, n, k in shapes:
        W = torch.randn(n, k, device=dev, dtype=torch.float32).to(dt)
        ctl = PrefetchController(dev, priority=priority, library=prefetch_library, hint=hint)
        ctl.add("gemm", 0, [W], cap_bytes=cap_bytes)
        table = ctl.table("gemm", 0)
        demote = None
        if table is not None and "demote" in getattr(prefetch_library, "modes", ()):
            from .measure import Guard

            demote = Guard(prefetch_library, list(table.ranges), dev)
        for m in batches:
            x = torch.randn(m, k, device=dev, dtype=torch.float32).to(dt)
            out = torch.empty(m, n, device=dev, dtype=dt)

            def gemm(x: Any = x, W: Any = W, out: Any = out) -> None:
                torch.mm(x, W.t(), out=out)

            def idle(prefetch: bool, ctl: Any = ctl, demote: Any = demote) -> None:  # before the timed GEMM, untimed
                if demote is not None:
                    demote()
                flush()
                if prefetch:
                    ctl.fork("gemm", 0)
                torch.cuda._sleep(cycles)
                ctl.join()

            def warm(gemm: Any = gemm, demote: Any = demote) -> None:
                if demote is not None:
                    demote()
                gemm()

            kinds = {"cold": lambda: idle(False), "prefetched": lambda: idle(True), "warm": warm}
            us = time_interleaved([gemm] * len(kinds), reps=len(kinds) * trials, warmup=3, timer=timer,
                                  flush=list(kinds.values()))  # fmt: skip
            med = {kind: median(samples) for kind, samples in zip(kinds, us)}
            results.append({
                "gemm": label, "m": m, "n": n, "k": k, "weight_bytes": W.numel() * W.element_size(),
                "prefetched_bytes": table.bytes if table else 0, **{f"{kind}_us": v for kind, v in med.items()},
                "speedup": med["cold"] / med["prefetched"],
            })  # fmt: skip
        del W, ctl
    return {"dtype": dtype, "idle_us": idle_us, "trials": trials, "l2_bytes": l2, "cap_bytes": cap_bytes,
            "hint": hint, "demoted": "demote" in getattr(prefetch_library, "modes", ()),
            "prefetch_library": prefetch_library.config, "results": results}  # fmt: skip


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

    from ..gpu.timing import time_interleaved
    from ..prefetch.controller import PrefetchController

    dev, prefetch_library, dt, l2, flush, timer, cycles = _setup(device, prefetch_library, dtype, idle_us)
    elem = torch.empty((), dtype=dt).element_size()
    x = torch.randn(1, k, device=dev, dtype=torch.float32).to(dt)
    weights: dict[int, Any] = {}
    base: dict[int, dict[str, float]] = {}
    results: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []

    def timed(before: Any, body: Any, n: int) -> float:
        """The median of ``n`` timed ``body`` calls, each after a flush and ``before`` (untimed)."""

        def ready() -> None:
            flush()
            before()

        return median(time_interleaved([body], reps=n, warmup=1, timer=timer, flush=[ready])[0])

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

        def launch_here(table: Any = table, options: dict = options, stream: int = stream) -> None:  # current stream
            prefetch_library.launch(table.table_ptr, table.rows, table.grid, stream, **options)

        def chained(gemv: Any = gemv) -> None:
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
