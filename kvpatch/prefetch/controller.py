"""``PrefetchController``: L2 weight prefetches per (point, layer[, batch bucket]) on one
side stream.

Usage in a decode step (``fork`` and ``join`` eager or inside ``torch.cuda.graph`` capture
alike; ``add`` before capturing: it copies the table to the device)::

    ctl = PrefetchController(device, priority="high")
    ctl.add("attn->mlp", layer, [o_proj.weight, gate_up.weight], batches={1: 32 << 20, 4: 16 << 20})
    ...
    ctl.fork("attn->mlp", layer, batch)  # on the current stream, after the work it overlaps
    attention(...)                        # the side stream prefetches meanwhile
    ...
    ctl.join()                            # end of the step: the current stream waits

* ``add`` builds an immutable device-resident int64 table ``[rows, 2]`` per key from
  :func:`~kvpatch.prefetch.ranges.weight_ranges`; the table object keeps the tensors
  alive, so their memory cannot be freed and reused under a captured graph's feet.
* ``fork`` records an event on the current stream, makes the side stream wait on it
  (so the prefetch starts only after the work issued so far) and launches the
  prefetch kernel on the side stream.
* ``join`` makes the current stream wait on the side stream, so a captured graph
  always rejoins it; call it once per step (or after the kernel that uses the data).
* ``zero_bytes=True``: the zero-byte control. Tables are built as usual (so every launch has
  the grid the real one has) but ``fork`` launches the prefetch kernel with no rows (the
  library's ``run`` mode, :class:`~kvpatch.prefetch.kernel.PrefetchKernelSpec` ``demote=True``):
  the same events, waits, kernel node and grid, and not one byte fetched.
* ``add(..., hint=)``: a window's own eviction hint; :meth:`hinted_ranges`: what the windows
  prefetch with given hints (the ``evict_last`` lines a measurement demotes between replays).
* ``enabled=False``: every method is a no-op (nothing is created, no GPU needed), so
  call sites stay the same with prefetch off.
* Lifetime: a captured graph holds no reference to the controller. Keep it (and so its
  tables) alive as long as any graph that captured its forks may replay; dropped, its
  tables go back to torch's allocator and the graph prefetches from whatever reuses them.
* One controller serves one thread (``join`` rejoins what this controller forked).

The stream/event calls go through a small adapter (:class:`TorchCudaAPI` by default)
so tests can pass a fake and check the wiring without a GPU. torch is imported only
by that adapter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, Mapping

from ..abi import exact_int
from ..errors import ArgumentError, UsageError
from .cuda_api import TorchCudaAPI
from .ranges import count, flag, tensor_list, total_bytes, weight_ranges

#: ``priority="high"``: torch maps a priority below the device's range to its greatest.
HIGH_PRIORITY = -(1 << 16)
#: Default grid: one CTA per this many bytes, between MIN_GRID and MAX_GRID CTAs.
BYTES_PER_CTA = 1 << 20
MIN_GRID, MAX_GRID = 4, 32


def _device_name(t: Any) -> str:
    return str(getattr(t, "device", "?"))


@dataclass(frozen=True, eq=False)
class RangeTable:
    """One immutable prefetch window: the tensors (kept alive), their ranges, the device
    table the kernel reads and the grid it launches with."""

    tensors: tuple[Any, ...] = field(repr=False)
    ranges: tuple[tuple[int, int], ...] = field(repr=False)
    table: Any = field(repr=False)
    grid: int
    cap_bytes: int | None
    #: The window's own eviction hint (None: the controller's, else the library's default).
    hint: str | None = None

    @property
    def rows(self) -> int:
        return len(self.ranges)

    @property
    def bytes(self) -> int:
        return total_bytes(self.ranges)

    @property
    def table_ptr(self) -> int:
        return int(self.table.data_ptr()) if self.rows else 0


def _window_key(point: Any, layer: Any) -> tuple[Hashable, Hashable]:
    """``(point, layer)``, a window's key: UsageError where it is not hashable or is NaN (add, table, fork)."""
    try:
        hash((point, layer))
    except TypeError:
        raise UsageError(f"prefetch window {(point, layer)!r}: point and layer must be hashable (a str, an int, "
                         "a tuple)") from None  # fmt: skip
    if any(isinstance(x, float) and math.isnan(x) for x in (point, layer)):  # a key no later lookup would find
        raise UsageError(f"prefetch window {(point, layer)!r}: NaN equals nothing, not even itself: use another key")
    return point, layer


def check_grid(grid: Any) -> int | None:
    """A launch grid: None (the default) or a number of CTAs, 1 .. 2**31-1 (the launcher
    takes an int; UsageError otherwise)."""
    n = exact_int(grid)
    if grid is not None and (n is None or not 1 <= n < 2**31):
        raise UsageError(f"prefetch grid must be a number of CTAs from 1 to 2**31-1, not {grid!r}")
    return n


def stream_priority(priority: Any) -> int:
    """The side stream's priority: ``'high'`` (the device's greatest), ``'normal'`` (0) or an int
    (a numpy or torch integer too) that a C ``int`` holds, which torch maps into the device's range
    (lower is higher); UsageError otherwise."""
    if isinstance(priority, str) and priority in ("high", "normal"):
        return HIGH_PRIORITY if priority == "high" else 0
    n = exact_int(priority)
    if n is None or not -(2**31) <= n < 2**31:
        raise UsageError(f"priority must be 'high', 'normal' or an int from -2**31 to 2**31-1, not {priority!r}")
    return n


def library_hint(library: Any) -> str:
    """The eviction hint a library launches with by default (its config's ``hint=``;
    ``evict_last``, the built-in default, when it says none)."""
    config = str(getattr(library, "config", "") or "")
    for item in config.split(","):
        key, _, value = item.partition("=")
        if key.strip() == "hint" and value.strip():
            return value.strip()
    return "evict_last"


def default_grid(nbytes: int) -> int:
    """CTAs for a window of ``nbytes``: one per MiB, 4 to 32."""
    return max(MIN_GRID, min(MAX_GRID, math.ceil(nbytes / BYTES_PER_CTA)))


class PrefetchController:
    """L2 prefetch launches per (point, layer[, batch bucket]) on one side stream.

    ``device``: the CUDA device (``'cuda'``, ``'cuda:1'``, a ``torch.device``).
    ``priority``: ``'high'`` (the device's greatest stream priority, so prefetch CTAs
    are scheduled ahead of the main stream's queued ones), ``'normal'`` (0) or an int
    (torch's convention: lower is higher). ``library``: a
    :class:`~kvpatch.prefetch.kernel.PrefetchLibrary`, a path to one, or ``None``
    (``$KVPATCH_PREFETCH_LIB`` or a build for this GPU). ``api``: the stream/event
    adapter (tests pass a fake). Launch knobs (``None``: the default): ``grid`` CTAs
    for every window (default :func:`default_grid` of the window's bytes; ``add(grid=)``
    still wins), ``threads`` per CTA, ``chunk`` bytes per bulk prefetch and the
    eviction ``hint`` (see :meth:`~kvpatch.prefetch.kernel.PrefetchLibrary.launch`).
    Raises :class:`UsageError` on a GPU older than sm_80 or a knob out of range.
    """

    def __init__(
        self,
        device: Any = "cuda",
        priority: str | int = "high",
        enabled: bool = True,
        library: Any = None,
        *,
        api: Any = None,
        grid: int | None = None,
        threads: int | None = None,
        chunk: int | None = None,
        hint: str | None = None,
        zero_bytes: bool = False,
    ) -> None:
        from .kernel import check_launch

        check_launch(threads, chunk, hint)
        self.grid = check_grid(grid)
        if not isinstance(enabled, bool):  # 'false' from an environment variable is truthy
            raise UsageError(f"enabled must be True or False, not {enabled!r}")
        if not isinstance(zero_bytes, bool):
            raise UsageError(f"zero_bytes must be True or False, not {zero_bytes!r}")
        #: Forks launch the prefetch kernel with no rows (the zero-byte control).
        self.zero_bytes = zero_bytes
        #: Keyword arguments of every launch (only the knobs that were set).
        knobs = (("threads", threads), ("chunk", chunk), ("hint", hint))
        self.launch_options = {k: v for k, v in knobs if v is not None}
        self.enabled = bool(enabled)
        self._tables: dict[tuple[Hashable, Hashable], dict[int | None, RangeTable]] = {}
        self._events: dict[tuple[Hashable, Hashable], Any] = {}
        self.pending = False
        self.launches = 0  # forks that launched (eager calls and captures alike)
        if not self.enabled:
            self.device = str(device)
            self.api = self.stream = self.library = None
            self.priority = None
            return
        self.api = api or TorchCudaAPI()
        self.device = self.api.normalize(device)
        major, minor = self.api.capability(self.device)
        if (major, minor) < (8, 0):
            raise UsageError(
                f"L2 weight prefetch needs compute capability 8.0 or newer (prefetch.global.L2 on sm_80/89, "
                f"cp.async.bulk.prefetch on sm_90+); {self.device} has {major}.{minor}: pass enabled=False"
            )
        self.priority = stream_priority(priority)
        self.stream = self.api.new_stream(self.device, self.priority)
        if library is None or isinstance(library, str) or hasattr(library, "__fspath__"):
            from .kernel import load_prefetch_library

            library = load_prefetch_library(library, capability=(major, minor))
        elif not callable(getattr(library, "launch", None)):
            raise UsageError(f"library must be a path or a loaded PrefetchLibrary, not {type(library).__name__}")
        if zero_bytes and "prefetch" not in getattr(library, "modes", ()):
            raise UsageError("zero_bytes=True launches the prefetch kernel with no rows: the library needs the run mode "
                             "(build it with PrefetchKernelSpec(demote=True))")  # fmt: skip
        self.library = library

    # ----------------------------------------------------------------------- tables

    def add(
        self,
        point: Hashable,
        layer: Hashable,
        tensors: Iterable[Any],
        cap_bytes: int | None = None,
        batches: Iterable[int] | Mapping[int, int | None] | None = None,
        *,
        merge: bool = False,
        grid: int | None = None,
        hint: str | None = None,
    ) -> None:
        """Register the window ``(point, layer)``: prefetch ``tensors`` (in the order the
        next kernels read them) when it is forked.

        ``batches``: ``None``: one table for every batch size, capped at ``cap_bytes``.
        An iterable of batch sizes: a table (capped at ``cap_bytes``) for those only.
        A mapping ``{batch: cap}``: a cap per batch (``None``: uncapped; ``0``: no
        prefetch at that batch). Batch keys are bucket bounds: ``fork(..., batch=b)``
        uses the smallest key >= b and launches nothing above the largest key. Batches
        with the same cap share one table.

        ``hint``: this window's eviction hint (over the controller's ``hint``).

        Raises ``ValueError`` for a tensor not on the controller's device or a window
        added twice, and what :func:`weight_ranges` raises (non-positive cap ...);
        :class:`UsageError` for a point or layer that is not hashable, a ``merge`` that is not
        a bool, ``cap_bytes`` beside a mapping (its caps are the caps), and for no tensors or
        no batches (a window that would never launch).
        """
        from .kernel import check_launch

        check_grid(grid)
        check_launch(hint=hint)
        flag(merge, "merge")
        key = _window_key(point, layer)
        if cap_bytes is not None and isinstance(batches, Mapping):
            raise UsageError(f"prefetch window {key}: cap_bytes={cap_bytes!r} beside batches={{batch: cap}}: "
                             "give each batch its cap in the mapping")  # fmt: skip
        if not self.enabled:
            return
        if key in self._tables:
            raise ArgumentError(f"prefetch window {key} was already added; tables are immutable")
        tensors = tuple(tensor_list(tensors, f"prefetch window {key}"))
        if not tensors:
            raise UsageError(f"prefetch window {key}: no tensors (a window that would never launch)")
        wrong = sorted({_device_name(t) for t in tensors if _device_name(t) != self.device})
        if wrong:
            on = ", ".join(wrong)
            raise ArgumentError(f"prefetch window {key}: tensors on {on}, this controller prefetches on {self.device}")
        if cap_bytes is not None:
            cap_bytes = count(cap_bytes, f"prefetch window {key}: cap_bytes", minimum=1)
        if batches is None:
            caps: dict[int | None, int | None] = {None: cap_bytes}
        elif isinstance(batches, Mapping):
            caps = {count(b, f"prefetch window {key}: batch", minimum=1):
                    (None if c is None else count(c, f"prefetch window {key}: cap of batch {b!r}", minimum=0))
                    for b, c in batches.items()}  # fmt: skip
        elif isinstance(batches, (str, bytes)) or not isinstance(batches, Iterable):
            what = "batches must be None, batch sizes or {batch: cap}"
            raise ArgumentError(f"prefetch window {key}: {what}, not {batches!r}")
        else:
            caps = {count(b, f"prefetch window {key}: batch", minimum=1): cap_bytes for b in batches}
        if not caps:
            raise UsageError(
                f"prefetch window {key}: batches {batches!r} names no batch (a window that would never launch)"
            )
        shared: dict[int | None, RangeTable | None] = {}
        tables: dict[int | None, RangeTable] = {}
        for batch, cap in sorted(caps.items(), key=lambda kv: (kv[0] is not None, kv[0] or 0)):
            if cap == 0:
                continue
            if cap not in shared:
                ranges = tuple(weight_ranges(tensors, cap, merge=merge))
                if ranges:
                    nbytes = total_bytes(ranges)
                    table = self.api.make_table(ranges, self.device)
                    launch_grid = grid if grid is not None else self.grid
                    launch_grid = default_grid(nbytes) if launch_grid is None else launch_grid
                    shared[cap] = RangeTable(tensors, ranges, table, launch_grid, cap, hint)
                else:
                    shared[cap] = None
            if shared[cap] is not None:
                tables[batch] = shared[cap]  # type: ignore[assignment]
        # Buckets with no table stay as bounds, so a batch between them does not fall
        # through to a larger bucket.
        self._tables[key] = {b: tables.get(b) for b in caps}  # type: ignore[misc]
        if key not in self._events:
            self._events[key] = self.api.new_event()

    def table(self, point: Hashable, layer: Hashable, batch: int | None = None) -> RangeTable | None:
        """The table ``fork(point, layer, batch)`` would launch, or ``None``."""
        if not self.enabled:
            return None
        key = _window_key(point, layer)
        if batch is not None:
            batch = count(batch, f"prefetch window {key}: batch", minimum=1)
        buckets = self._tables.get(key)
        if not buckets:
            return None
        if None in buckets:
            return buckets[None]
        if batch is None:
            raise ArgumentError(f"prefetch window {key} has per-batch tables: pass batch=")
        bounds = sorted(b for b in buckets if b is not None and b >= batch)
        return buckets[bounds[0]] if bounds else None

    def windows(self) -> list[tuple[Hashable, Hashable]]:
        return list(self._tables)

    def effective_hint(self, table: RangeTable) -> str:
        """The hint a table's launches use: its own, the controller's, else the library's default."""
        if table.hint is not None:
            return table.hint
        if "hint" in self.launch_options:
            return self.launch_options["hint"]
        return library_hint(self.library)

    def hinted_ranges(self, hints: Iterable[str] = ("evict_last",), batch: int | None = None) -> list[tuple[int, int]]:
        """The ranges that forks at ``batch`` (None: at any batch) prefetch with one of
        ``hints`` (a list of hint names: UsageError for a str or an unknown name), each byte
        once, sorted by address."""
        from .kernel import HINTS

        if isinstance(hints, (str, bytes)) or not isinstance(hints, Iterable):
            raise UsageError(f"hinted_ranges: hints must be a list of hint names (['evict_last']), not {hints!r}")
        wanted = list(hints)
        unknown = [h for h in wanted if h not in HINTS]
        if unknown:
            raise UsageError(f"hinted_ranges: unknown hint {unknown[0]!r}: choose from {', '.join(HINTS)}")
        spans: list[tuple[int, int]] = []
        for key, buckets in self._tables.items():
            tables = [self.table(*key, batch)] if batch is not None else list(buckets.values())
            for t in tables:
                if t is not None and self.effective_hint(t) in wanted:
                    spans += [(a, a + n) for a, n in t.ranges]
        merged: list[list[int]] = []
        for lo, hi in sorted(spans):
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        return [(lo, hi - lo) for lo, hi in merged]

    # ----------------------------------------------------------------------- launches

    def fork(self, point: Hashable, layer: Hashable, batch: int | None = None) -> bool:
        """Launch the window's prefetch on the side stream after the current stream's
        work so far. Returns whether it launched (no table for this batch: False)."""
        if not self.enabled:
            return False
        table = self.table(point, layer, batch)
        if table is None:
            return False
        api = self.api
        current = api.current_stream(self.device)
        event = self._events[point, layer]
        event.record(current)
        self.stream.wait_event(event)
        self.pending = True
        options = dict(self.launch_options)
        if table.hint is not None:
            options["hint"] = table.hint
        with api.device_guard(self.device):
            if self.zero_bytes:
                self.library.run(table.table_ptr, 0, table.grid, api.handle(self.stream), mode="prefetch", **options)
            else:
                self.library.launch(table.table_ptr, table.rows, table.grid, api.handle(self.stream), **options)
        self.launches += 1
        return True

    def join(self) -> None:
        """The current stream waits for every prefetch forked so far (no-op if none)."""
        if not self.enabled or not self.pending:
            return
        self.api.current_stream(self.device).wait_stream(self.stream)
        self.pending = False

    def __repr__(self) -> str:
        windows = len(self._tables)
        state = f"{self.device}, priority {self.priority}, {windows} windows" if self.enabled else "disabled"
        return f"PrefetchController({state})"
