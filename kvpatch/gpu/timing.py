"""How kernels are timed: event pairs, interleaved variants, an honest L2 flush, copy bandwidth.

* :func:`time_interleaved` times several launchers in one round: warm-up launches,
  then cycles of :func:`carryover_order`, in which every launcher follows every
  launcher (itself included) equally often, so drift and what the previous kernel
  left behind (its code in the instruction cache, its lines in L2) hit all alike;
  each launch alone between a CUDA event pair. The cycles run in chunks: before each,
  a GPU-side sleep long enough for the host to queue the whole chunk, so no launch
  waits for the host (a kernel timed while the GPU waits for its launch measures the
  host); an event after the sleep proves it, and a chunk the host did not queue in
  time is timed again with a longer sleep.
* :class:`~kvpatch.gpu.flush.L2Flush` (its own module) makes "cold" cold.
* :func:`adaptive_reps`: more timed launches for short kernels (a 10 us kernel gets
  3x the launches of a >= 30 us one).

torch is imported inside functions only.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

from .stats import median

#: The GPU-side lead a chunk of launches aims for (a chunk is what the host queues in
#: about this long, at most MAX_CHUNK launches), the per-launch host cost added to the
#: warm-up's measurement (two event records), and how often a chunk is timed in all when
#: the host did not queue it in time (each time with twice the lead).
CHUNK_LEAD_S = 0.03
MAX_CHUNK = 128
EVENT_COST_S = 10e-6
LEAD_ATTEMPTS = 2

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
        #: chunks timed, chunks timed again (the host had not queued them in time), and
        #: chunks kept although the host was late on every attempt
        self.chunks = 0
        self.retried = 0
        self.host_bound = 0
        self._pool: list[Any] = []
        self._khz: int | None = None  # SM clock for the sleep's cycle count

    def events(self, n: int) -> list[Any]:
        import torch

        while len(self._pool) < n:
            self._pool.append(torch.cuda.Event(enable_timing=True) if self.cuda else HostEvent())
        return self._pool[:n]

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)

    def lead(self, seconds: float) -> Any:
        """Keep the GPU busy for ``seconds`` so the host can queue ahead of it. Returns an
        event recorded after the sleep (None without one): while ``query()`` is False the
        GPU is still sleeping, so nothing queued so far has waited for the host."""
        if not self.cuda or seconds <= 0:
            return None
        import torch

        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is None:
            return None
        if self._khz is None:  # read once: a bench sleeps before every chunk
            p = torch.cuda.get_device_properties(self.device)
            self._khz = getattr(p, "clock_rate", None) or 1_980_000
        sleep(int(seconds * self._khz * 1e3))
        done = torch.cuda.Event()
        done.record()
        return done


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
    flush: Callable[[], None] | Sequence[Callable[[], None] | None] | None = None,
) -> list[list[float]]:
    """One round: ``warmup`` untimed launches of each, then ``ceil(reps / n)`` cycles of
    :func:`carryover_order` (so each launcher is timed ``reps`` times, rounded up to a
    multiple of ``n``), each launch timed alone by an event pair; ``flush`` runs before
    each launch, outside the pair. Returns us per launcher, in the order they ran.

    The cycles run in chunks (whole cycles where one fits in MAX_CHUNK launches), each
    after a GPU-side lead of 1.3x the host's time to queue it (measured in the warm-up),
    so that every launch of the chunk is queued before the GPU reaches it. Were the GPU to catch up, each later launch
    would be timed from its start event to a kernel the host had not launched yet: for a
    20 us kernel, 2-3x its time, and more for launchers late in the cycle (before the
    chunks, one lead of at most 30 ms covered the round, and 17-library tune runs timed
    the last third of their launches that way). If the lead has ended by the time the
    chunk is queued, the chunk is timed again with twice the lead."""
    n = len(launchers)
    flushes = list(flush) if isinstance(flush, (list, tuple)) else [flush] * n
    if len(flushes) != n:
        raise ValueError(f"{len(flushes)} flushes for {n} launchers")
    cycle = carryover_order(n)
    cycles = math.ceil(reps / n)
    t0 = time.perf_counter()
    for _ in range(warmup):
        for fn, fl in zip(launchers, flushes):
            if fl is not None:
                fl()
            fn()
    host = (time.perf_counter() - t0) / max(1, warmup * n) + EVENT_COST_S
    sequence = cycle * cycles
    # a chunk: what the host queues in about CHUNK_LEAD_S, at most MAX_CHUNK launches (the
    # GPU's queue holds ~1000 commands; a host blocked on a full queue while the GPU sleeps
    # would outlast the lead), whole cycles where a cycle fits
    size = max(1, min(MAX_CHUNK, int(CHUNK_LEAD_S / (1.3 * host))))
    if size >= len(cycle):
        size -= size % len(cycle)
    out: list[list[float]] = [[] for _ in range(n)]
    for start in range(0, len(sequence), size):
        chunk = sequence[start : start + size]
        ev = timer.events(2 * len(chunk))
        for attempt in range(LEAD_ATTEMPTS):
            timer.sync()
            # the whole chunk is queued within the sleep: a GPU still asleep when the host
            # is done (lead_done not reached) cannot have waited for any launch of it
            lead_done = timer.lead(1.3 * host * len(chunk) * 2**attempt)
            for k, i in enumerate(chunk):
                if flushes[i] is not None:
                    flushes[i]()
                ev[2 * k].record()
                launchers[i]()
                ev[2 * k + 1].record()
            late = lead_done is not None and lead_done.query()
            timer.sync()
            timer.chunks += 1
            if not late:
                break
            timer.retried += 1
        else:
            timer.host_bound += 1
        for k, i in enumerate(chunk):
            out[i].append(ev[2 * k].elapsed_time(ev[2 * k + 1]) * 1e3)
    return out


def adaptive_reps(base_reps: int, kernel_us: float, *, short_us: float = SHORT_KERNEL_US,
                  max_factor: int = MAX_REPS_FACTOR) -> int:  # fmt: skip
    """``base_reps`` for kernels of >= ``short_us``; more (up to ``max_factor`` x) for shorter ones."""
    if not kernel_us > 0 or kernel_us >= short_us:
        return base_reps
    return int(base_reps * min(max_factor, math.ceil(short_us / kernel_us)))


def measure_copy_bandwidth(device: Any, nbytes: int, reps: int = 10, timer: Timer | None = None) -> dict[str, Any]:
    """A large ``dst.copy_(src)``: bytes read + written per second (median of ``reps``)."""
    import torch

    timer = timer or Timer(device)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src.random_(0, 256)
    dst = torch.empty_like(src)
    us = time_interleaved([lambda: dst.copy_(src)], reps=reps, warmup=3, timer=timer)[0]
    med = median(us)
    src = dst = None  # the buffers go back to the allocator before the next measurement
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
