"""How kernels are timed: event pairs, interleaved variants, an honest L2 flush, copy bandwidth.

* :func:`time_interleaved` times several launchers in one round: warm-up launches,
  then cycles of :func:`carryover_order`, in which every launcher follows every
  launcher (itself included) equally often, so drift and what the previous kernel
  left behind (its code in the instruction cache, its lines in L2) hit all alike;
  each launch alone between a CUDA event pair; a GPU-side sleep first lets the host
  queue the whole round ahead, so small kernels are not timed with host launch gaps.
* :class:`L2Flush` makes "cold" cold: it READS and WRITES a buffer of at least twice
  the L2 (``buf.add_(1)``), then READS it once more (a sum), so the L2 ends full of
  clean lines of that buffer: the KV data is gone from L2, and no dirty line is left
  to be written back while the timed kernel runs (a ``zero_()`` flush leaves the L2
  full of dirty lines).
* :func:`adaptive_reps`: more timed launches for short kernels (a 10 us kernel gets
  3x the launches of a >= 30 us one).

torch is imported inside functions only.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

from .stats import median

#: Upper bound of the GPU-side lead before a round, and the per-launch host cost
#: added to the warm-up's measurement (two event records).
MAX_LEAD_S = 0.03
EVENT_COST_S = 10e-6

#: Kernels shorter than this get proportionally more timed launches (up to MAX_REPS_FACTOR x).
SHORT_KERNEL_US = 30.0
MAX_REPS_FACTOR = 4


class HostEvent:
    """A stand-in for ``torch.cuda.Event`` on the CPU (tests: ops are synchronous)."""

    def __init__(self) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: "HostEvent") -> float:
        return (end.t - self.t) * 1e3  # ms, like torch.cuda.Event


class Timer:
    """CUDA events on a CUDA device; a host clock for the CPU."""

    def __init__(self, device: Any) -> None:
        import torch

        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._pool: list[Any] = []

    def events(self, n: int) -> list[Any]:
        import torch

        while len(self._pool) < n:
            self._pool.append(torch.cuda.Event(enable_timing=True) if self.cuda else HostEvent())
        return self._pool[:n]

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)

    def lead(self, seconds: float) -> None:
        """Keep the GPU busy for ``seconds`` so the host can queue ahead of it."""
        if not self.cuda or seconds <= 0:
            return
        import torch

        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is None:
            return
        p = torch.cuda.get_device_properties(self.device)
        khz = getattr(p, "clock_rate", None) or 1_980_000
        sleep(int(seconds * khz * 1e3))


def carryover_order(n: int) -> list[int]:
    """A cyclic order of ``n`` launchers, ``n * n`` long, in which each launcher directly
    follows each launcher, itself included, exactly once (a de Bruijn sequence of order 2:
    the Lyndon words of length 1 and 2 over ``range(n)``, concatenated in lexicographic order).

    A plain rotation puts launcher ``i`` after ``i - 1`` almost always. The bench's A/A
    control showed why that matters: stock's kernel timed right after the same kernel (the
    A/A variant, next to it in the rotation) ran up to 0.5% faster than after another
    library's, so the A/A came out "slower" than stock at a quarter of the points."""
    if n < 1:
        raise ValueError("no launchers")
    order = []
    for a in range(n):
        order.append(a)
        for b in range(a + 1, n):
            order += [a, b]
    return order


def time_interleaved(
    launchers: Sequence[Callable[[], None]],
    *,
    reps: int,
    warmup: int,
    timer: Timer,
    flush: Callable[[], None] | None = None,
) -> list[list[float]]:
    """One round: ``warmup`` untimed launches of each, then ``ceil(reps / n)`` cycles of
    :func:`carryover_order` (so each launcher is timed ``reps`` times, rounded up to a
    multiple of ``n``), each launch timed alone by an event pair; ``flush`` runs before
    each launch, outside the pair. Returns us per launcher, in the order they ran."""
    n = len(launchers)
    cycle = carryover_order(n)
    sequence = cycle * math.ceil(reps / n)
    t0 = time.perf_counter()
    for _ in range(warmup):
        for fn in launchers:
            if flush is not None:
                flush()
            fn()
    host = (time.perf_counter() - t0) / max(1, warmup * n) + EVENT_COST_S
    timer.sync()
    ev = timer.events(2 * len(sequence))
    timer.lead(min(MAX_LEAD_S, 1.3 * host * len(sequence)))
    for k, i in enumerate(sequence):
        if flush is not None:
            flush()
        ev[2 * k].record()
        launchers[i]()
        ev[2 * k + 1].record()
    timer.sync()
    out: list[list[float]] = [[] for _ in range(n)]
    for k, i in enumerate(sequence):
        out[i].append(ev[2 * k].elapsed_time(ev[2 * k + 1]) * 1e3)
    return out


def adaptive_reps(base_reps: int, kernel_us: float, *, short_us: float = SHORT_KERNEL_US,
                  max_factor: int = MAX_REPS_FACTOR) -> int:  # fmt: skip
    """``base_reps`` for kernels of >= ``short_us``; more (up to ``max_factor`` x) for shorter ones."""
    if not kernel_us > 0 or kernel_us >= short_us:
        return base_reps
    return int(base_reps * min(max_factor, math.ceil(short_us / kernel_us)))


class L2Flush:
    """Evict the L2 before a cold launch: read+write then read a buffer of >= 2x L2.

    ``nbytes`` defaults to 3x the L2 (at least 2x L2 + 1 MiB). The buffer is float32;
    its values only count up, so it never turns into a pattern the hardware could
    skip. Call the object to flush (asynchronously, on the current stream)."""

    def __init__(self, device: Any, l2_bytes: int, nbytes: int | None = None) -> None:
        import torch

        if nbytes is not None and nbytes < 2 * l2_bytes:
            raise ValueError(f"an L2 flush buffer must be >= 2x the L2 ({2 * l2_bytes} bytes), not {nbytes}")
        self.nbytes = int(nbytes or max(3 * l2_bytes, 2 * l2_bytes + 2**20))
        self.buf = torch.zeros(self.nbytes // 4, dtype=torch.float32, device=device)
        self.sink = torch.zeros((), dtype=torch.float32, device=device)

    def __call__(self) -> None:
        import torch

        self.buf.add_(1.0)  # read + write every line
        torch.sum(self.buf, dim=0, out=self.sink)  # read it again: the dirty lines are written back here, not in the kernel

    @property
    def method(self) -> str:
        return f"buf.add_(1) then sum(buf) over {self.nbytes} bytes (read+write, then read)"


def measure_copy_bandwidth(device: Any, nbytes: int, reps: int = 10, timer: Timer | None = None) -> dict[str, Any]:
    """A large ``dst.copy_(src)``: bytes read + written per second (median of ``reps``)."""
    import torch

    timer = timer or Timer(device)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src.random_(0, 256)
    dst = torch.empty_like(src)
    us = time_interleaved([lambda: dst.copy_(src)], reps=reps, warmup=3, timer=timer)[0]
    med = median(us)
    del src, dst
    return {"bytes": nbytes, "bytes_moved": 2 * nbytes, "median_us": med, "samples_us": us,
            "bytes_per_s": 2 * nbytes / (med * 1e-6)}  # fmt: skip


def l2_bytes_of(device: Any, default: int = 50 * 2**20) -> int:
    import torch

    d = torch.device(device)
    if d.type == "cuda":
        v = getattr(torch.cuda.get_device_properties(d), "L2_cache_size", 0)
        if v:
            return int(v)
    return default
