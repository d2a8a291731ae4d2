"""Options of the decode benchmark and of its weight prefetch, and their text forms.

Pure Python (no torch): the commands and the sweep parse their options here, and the
CPU tests check them.

:class:`WeightPrefetch` is one weight-prefetch configuration of the decode step: the
per-batch cap, the launch knobs of the prefetch kernel (grid, threads per CTA, chunk,
eviction hint), where in a layer the prefetch is forked and where it is joined, and
the side stream's priority. Its text form (``--wpf``, the sweep's labels) is
``key=value`` items separated by ``;``, e.g. ``cap=1:32,4:32,8:16;grid=132;hint=evict_normal``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Mapping

from ..errors import UsageError
from ..gpu.defaults import DECODE_LAYERS, DECODE_ROUNDS
from ..gpu.points import DEFAULT_BATCHES, DEFAULT_CONTEXTS  # noqa: F401 - the decode step's grid is the bench's headline grid

BLOCK_SIZE = 16
#: The variant suffix for "with weight prefetch".
WPF = "+wpf"
#: Layers per step and rounds (kvpatch.gpu.defaults says why these).
DEFAULT_LAYERS = DECODE_LAYERS
DEFAULT_ROUNDS = DECODE_ROUNDS
DEFAULT_MODELS = ("llama-3.1-8b", "llama-3.2-1b")
DEFAULT_DTYPES = ("bf16", "fp16")
#: Per-batch weight-prefetch caps in MiB (bucket bounds: batch b uses the smallest key
#: >= b; above the largest key, no prefetch). The first H200 run (decode-1, benchmarks/ARCHIVE.md)
#: measured these at 0.99x: they are the baseline the sweep (:mod:`.sweep`) starts from,
#: not a tuned value.
DEFAULT_CAPS_MIB: dict[int, int] = {1: 32, 2: 32, 4: 32, 8: 16}
MiB = 1 << 20
#: Where in a layer the prefetch is forked: right before attention (after the QKV GEMM
#: and the KV write), or before the layer's first RMSNorm (so it also overlaps the QKV GEMM).
FORK_POINTS = ("attn", "qkv")
#: Where the main stream waits for the side stream: once at the end of the step, or
#: before each layer's o_proj (o_proj then never overlaps a prefetch kernel still issuing).
JOIN_POINTS = ("step", "oproj")


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
        if not sep or not (batch.strip().isascii() and batch.strip().isdigit()) or int(batch) < 1:
            raise ValueError(f"invalid cap {item!r}: use BATCH:MIB, e.g. 1:32,4:32,8:16")
        caps[int(batch)] = _mib(cap)
    if not caps:
        raise ValueError(f"invalid cap {text!r}: use BATCH:MIB, e.g. 1:32,4:32,8:16")
    return caps


def _mib(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"invalid cap {text!r}: a number of MiB") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"invalid cap {text!r}: must be a finite number >= 0")
    return int(value * MiB) // 16 * 16


def caps_text(caps: int | Mapping[int, int]) -> str:
    """The inverse of :func:`parse_caps` (MiB)."""
    if isinstance(caps, int):
        return "off" if caps == 0 else f"{caps / MiB:g}"
    return ",".join(f"{b}:{c / MiB:g}" for b, c in sorted(caps.items())) or "off"


def cap_for_batch(caps: int | Mapping[int, int], batch: int) -> int:
    """The cap (bytes) a batch gets: the smallest bucket >= batch, 0 above them all."""
    if isinstance(caps, int):
        return caps
    bounds = sorted(b for b in caps if b >= batch)
    return caps[bounds[0]] if bounds else 0


def variant_names(libs: Iterable[str], wpf: bool = True) -> list[str]:
    """``['stock', 'patched', 'stock+wpf', 'patched+wpf']``: attention variants, then the same with prefetch."""
    names = list(libs)
    if "stock" not in names:
        raise ValueError(f"the libraries must include 'stock' (the baseline); got {', '.join(names) or 'none'}")
    names = ["stock", *[n for n in names if n != "stock"]]
    return names + ([n + WPF for n in names] if wpf else [])


def parse_ints(text: str, what: str = "list") -> list[int]:
    """``'1,4,16'`` -> ``[1, 4, 16]`` (each >= 1)."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"invalid {what} {text!r}: comma-separated integers") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"invalid {what} {text!r}: comma-separated integers >= 1")
    return values


def parse_names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


@dataclass(frozen=True)
class WeightPrefetch:
    """One weight-prefetch configuration of the decode step (``None``: the default)."""

    caps: int | dict[int, int] = field(default_factory=lambda: {b: c * MiB for b, c in DEFAULT_CAPS_MIB.items()})
    grid: int | None = None  # CTAs (None: one per MiB, 4..32)
    threads: int | None = None  # per CTA (None: the library's, 32)
    chunk: int | None = None  # bytes per bulk prefetch (None: the library's, 4096)
    hint: str | None = None  # evict_last / evict_normal / evict_first / none (None: the library's, evict_last)
    fork: str = "attn"
    join: str = "step"
    priority: str | int = "high"

    def __post_init__(self) -> None:
        from ..prefetch.kernel import check_launch

        check_launch(self.threads, self.chunk, self.hint)
        if self.grid is not None and (isinstance(self.grid, bool) or not isinstance(self.grid, int) or self.grid < 1):
            raise UsageError(f"prefetch grid must be a positive number of CTAs, not {self.grid!r}")
        if self.fork not in FORK_POINTS:
            raise UsageError(f"unknown fork point {self.fork!r}: choose one of {', '.join(FORK_POINTS)}")
        if self.join not in JOIN_POINTS:
            raise UsageError(f"unknown join point {self.join!r}: choose one of {', '.join(JOIN_POINTS)}")
        if self.priority not in ("high", "normal") and (isinstance(self.priority, bool) or not isinstance(self.priority, int)):
            raise UsageError(f"priority must be 'high', 'normal' or an int, not {self.priority!r}")
        caps = self.caps
        if isinstance(caps, Mapping):
            object.__setattr__(self, "caps", {int(b): int(c) for b, c in sorted(caps.items())})
        elif isinstance(caps, bool) or not isinstance(caps, int) or caps < 0:
            raise UsageError(f"prefetch cap must be bytes >= 0 or {{batch: bytes}}, not {caps!r}")

    def cap(self, batch: int) -> int:
        return cap_for_batch(self.caps, batch)

    def off(self) -> bool:
        return not (self.caps if isinstance(self.caps, int) else any(self.caps.values()))

    def controller_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~kvpatch.prefetch.controller.PrefetchController`."""
        return {"priority": self.priority, "grid": self.grid, "threads": self.threads, "chunk": self.chunk, "hint": self.hint}

    def with_(self, **changes: Any) -> WeightPrefetch:
        return replace(self, **changes)

    def label(self) -> str:
        """The text form (:meth:`parse` reads it back); only what differs from the defaults."""
        base = WeightPrefetch()
        items = [f"cap={caps_text(self.caps)}"]
        for key in ("grid", "threads", "chunk", "hint", "fork", "join", "priority"):
            value = getattr(self, key)
            if value != getattr(base, key):
                items.append(f"{key}={value}")
        return ";".join(items)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["caps"] = self.caps if isinstance(self.caps, int) else {str(b): c for b, c in self.caps.items()}
        d["label"] = self.label()
        return d

    @classmethod
    def parse(cls, text: str, base: WeightPrefetch | None = None) -> WeightPrefetch:
        """``'cap=1:32,4:16;grid=132;threads=128;chunk=16384;hint=evict_normal;fork=qkv;join=step;priority=normal'``
        (any subset; the rest from ``base`` or the defaults). Raises ValueError/UsageError."""
        changes: dict[str, Any] = {}
        for item in filter(None, (p.strip() for p in text.split(";"))):
            key, sep, value = item.partition("=")
            key, value = key.strip().lower(), value.strip()
            if not sep or not value:
                raise ValueError(f"invalid weight-prefetch option {item!r}: use KEY=VALUE")
            if key == "cap":
                changes["caps"] = parse_caps(value)
            elif key in ("grid", "threads", "chunk"):
                changes[key] = None if value in ("auto", "default") else _int(key, value)
            elif key == "hint":
                changes[key] = None if value == "default" else value
            elif key in ("fork", "join"):
                changes[key] = value
            elif key == "priority":
                changes[key] = value if value in ("high", "normal") else _int(key, value)
            else:
                raise ValueError(f"unknown weight-prefetch option {key!r}: cap, grid, threads, chunk, hint, fork, join, priority")
        return replace(base or cls(), **changes)


def _int(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"invalid {key} {value!r}: an integer") from None
