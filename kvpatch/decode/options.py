"""Options of the decode benchmark and of its weight prefetch, and their text forms.

Pure Python (no torch): the commands and the sweep parse their options here, and the
CPU tests check them.

:class:`WeightPrefetch` is one weight-prefetch configuration of the decode step: its windows
(:mod:`.windows`: where in a layer each prefetch is forked, which weight it pulls, its cap per
batch bucket and its eviction hint), the launch knobs of the prefetch kernel (grid, threads per
CTA, chunk, the default eviction hint), where the side stream is joined, and its priority. Its
text form (``--wpf``, the sweep's labels) is ``key=value`` items separated by ``;``, a window
being ``NAME=CAPS[@HINT]``, e.g. ``oproj->gateup=1:12,8:8;gateup->down=8@evict_normal;grid=16``.
The first form of the runtime (one window per layer: o_proj, gate/up and down up to ``cap``,
forked before attention or before the first RMSNorm) is still ``cap=...;fork=attn|qkv``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

from ..config.model import whole_number
from ..errors import UsageError
from ..gpu.defaults import DECODE_LAYERS
from ..gpu.points import DEFAULT_BATCHES, DEFAULT_CONTEXTS  # noqa: F401 - the decode step's grid is the bench's headline grid
from .windows import (  # noqa: F401 - the caps' text forms live with the windows; re-exported
    DEFAULT_CAPS_MIB,
    LEGACY,
    MiB,
    Window,
    cap_for_batch,
    caps_text,
    parse_caps,
    parse_windows,
    windows_text,
)

BLOCK_SIZE = 16
#: The variant suffix for "with weight prefetch".
WPF = "+wpf"
#: Layers per step and rounds (kvpatch.gpu.defaults says why these).
DEFAULT_LAYERS = DECODE_LAYERS
#: Interleaved rounds: 7 (a weight-prefetch effect of 1-2% must clear the round-to-round spread).
DEFAULT_ROUNDS = 7
DEFAULT_MODELS = ("llama-3.1-8b", "llama-3.2-1b")
DEFAULT_DTYPES = ("bf16", "fp16")
#: The default windows: the heads of gate/up, down and the next layer's QKV weights, from forks
#: after o_proj, gate/up and down, up to batch 8 (12/8/12 MiB, the library's evict_last). On the
#: H200 with every control (benchmarks/evidence/weight-prefetch/) they pay on the 7-8B steps
#: (Llama-3.1-8B 1.006-1.030x, Qwen2.5-7B 1.027-1.041x) and cost on Llama-3.2-1B's
#: (0.985-0.993x); the sweep's own pick from single windows did no better (1.000x geomean).
DEFAULT_WINDOWS: tuple[Window, ...] = (
    Window("oproj->gateup", {8: 12 * MiB}),
    Window("gateup->down", {8: 8 * MiB}),
    Window("down->qkv", {8: 12 * MiB}),
)
#: Where in a layer the prefetch is forked: right before attention (after the QKV GEMM
#: and the KV write), or before the layer's first RMSNorm (so it also overlaps the QKV GEMM).
FORK_POINTS = ("attn", "qkv")
#: Where the main stream waits for the side stream: once at the end of the step, or
#: before each layer's o_proj (o_proj then never overlaps a prefetch kernel still issuing).
JOIN_POINTS = ("step", "oproj")


def parse_ints(text: str, what: str = "list") -> list[int]:
    """``'1,4,16'`` -> ``[1, 4, 16]`` (each >= 1)."""
    try:
        values = [whole_number(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"invalid {what} {text!r}: comma-separated integers") from None
    if not values or any(v < 1 for v in values):
        raise UsageError(f"invalid {what} {text!r}: comma-separated integers >= 1")
    return values


def parse_names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


@dataclass(frozen=True)
class WeightPrefetch:
    """One weight-prefetch configuration of the decode step (``WeightPrefetch()``: the default
    windows). ``windows`` empty: the first form, ``caps`` from a fork at ``fork``."""

    windows: tuple[Window, ...] = DEFAULT_WINDOWS
    caps: int | dict[int, int] = 0  # the first form: bytes per layer window (0: none)
    grid: int | None = None  # CTAs (None: one per MiB, 4..32)
    threads: int | None = None  # per CTA (None: the library's, 32)
    chunk: int | None = None  # bytes per bulk prefetch (None: the library's, 4096)
    hint: str | None = (
        None  # the windows' default hint: evict_last / evict_normal / evict_first / none (None: the library's, evict_last)
    )
    fork: str = "attn"  # the first form's fork point
    join: str = "step"
    priority: str | int = "high"

    def __post_init__(self) -> None:
        from ..prefetch.controller import check_grid, stream_priority
        from ..prefetch.kernel import check_launch

        check_launch(self.threads, self.chunk, self.hint)
        check_grid(self.grid)
        if self.fork not in FORK_POINTS:
            raise UsageError(f"unknown fork point {self.fork!r}: choose one of {', '.join(FORK_POINTS)}")
        if self.join not in JOIN_POINTS:
            raise UsageError(f"unknown join point {self.join!r}: choose one of {', '.join(JOIN_POINTS)}")
        stream_priority(self.priority)
        caps = self.caps
        if isinstance(caps, Mapping):
            object.__setattr__(self, "caps", {int(b): int(c) for b, c in sorted(caps.items())})
        elif isinstance(caps, bool) or not isinstance(caps, int) or caps < 0:
            raise UsageError(f"prefetch cap must be bytes >= 0 or {{batch: bytes}}, not {caps!r}")
        windows = tuple(self.windows)
        if any(not isinstance(w, Window) for w in windows):
            raise UsageError("windows must be kvpatch.decode.windows.Window values")
        names = [w.name for w in windows]
        if len(set(names)) != len(names):
            raise UsageError(f"a prefetch window is given twice: {', '.join(names)}")
        if windows and (self.caps if isinstance(self.caps, int) else any(self.caps.values())):
            if windows != DEFAULT_WINDOWS:
                raise UsageError("give either windows or the first form's cap, not both")
            windows = ()  # WeightPrefetch(caps=...): the first form, as before the windows
        object.__setattr__(self, "windows", windows)

    def effective_windows(self) -> tuple[Window, ...]:
        """The windows the step forks: ``windows``, or the first form's one window per layer."""
        if self.windows:
            return self.windows
        return (Window(LEGACY[self.fork], self.caps),) if not self.off() else ()

    def cap(self, batch: int) -> int:
        """Bytes all windows of one layer pull at most at ``batch`` (caps added up)."""
        return sum(w.cap(batch) for w in self.effective_windows())

    def off(self) -> bool:
        def none(caps: Any) -> bool:
            return caps == 0 if isinstance(caps, int) else not any(caps.values())

        return all(none(w.caps) for w in self.windows) if self.windows else none(self.caps)

    def hints(self) -> set[str]:
        """The eviction hints its windows launch with (None: the library's default)."""
        return {w.hint or self.hint or "evict_last" for w in self.effective_windows()}

    def controller_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~kvpatch.prefetch.controller.PrefetchController`."""
        return {
            "priority": self.priority,
            "grid": self.grid,
            "threads": self.threads,
            "chunk": self.chunk,
            "hint": self.hint,
        }

    def with_(self, **changes: Any) -> WeightPrefetch:
        return replace(self, **changes)

    def label(self) -> str:
        """The text form (:meth:`parse` reads it back); only what differs from the defaults."""
        base = WeightPrefetch()
        items = [windows_text(self.windows)] if self.windows else [f"cap={caps_text(self.caps)}"]
        for key in ("grid", "threads", "chunk", "hint", "fork", "join", "priority"):
            value = getattr(self, key)
            if value != getattr(base, key) and not (key == "fork" and self.windows):
                items.append(f"{key}={value}")
        return ";".join(items)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["caps"] = self.caps if isinstance(self.caps, int) else {str(b): c for b, c in self.caps.items()}
        d["windows"] = [w.to_dict() for w in self.windows]
        d["label"] = self.label()
        return d

    @classmethod
    def parse(cls, text: str, base: WeightPrefetch | None = None) -> WeightPrefetch:
        """``'oproj->gateup=1:12,8:8@evict_normal;gateup->down=8;grid=132;threads=128;chunk=16384;hint=evict_normal;
        join=step;priority=normal'``, or the first form ``'cap=1:32,4:16;fork=qkv'`` (any subset; the rest from
        ``base`` or the defaults; windows given replace the base's). Raises UsageError, one line."""
        changes: dict[str, Any] = {}
        windows: list[Window] = []
        seen: set[str] = set()
        for item in filter(None, (p.strip() for p in text.split(";"))):
            key, sep, value = item.partition("=")
            key, value = key.strip().lower(), value.strip()
            if not sep or not value:
                raise UsageError(f"invalid weight-prefetch option {item!r}: use KEY=VALUE")
            if key in seen and "->" not in key:  # a window given twice is refused with the windows
                raise UsageError(f"weight-prefetch option {key!r} given twice")
            seen.add(key)
            if _is_window(key):
                windows += parse_windows(item)
            elif key == "cap":
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
                raise UsageError(f"unknown weight-prefetch option {key!r}: a window (NAME=CAPS[@HINT]), cap, grid, threads, "
                                 "chunk, hint, fork, join, priority")  # fmt: skip
        if windows and ("caps" in changes or "fork" in changes):
            raise UsageError("give either windows or the first form's cap/fork, not both")
        if windows:
            changes["windows"], changes["caps"] = tuple(windows), 0
        elif "caps" in changes or "fork" in changes:  # the first form: its caps, the base's or the first default
            changes["windows"] = ()
            if "caps" not in changes:
                first = base is not None and not base.windows and not base.off()
                changes["caps"] = base.caps if first else {b: c * MiB for b, c in DEFAULT_CAPS_MIB.items()}
        return replace(base or cls(), **changes)


def _is_window(key: str) -> bool:
    """Whether an item's key names a window (``oproj->gateup``, or a first-form name)."""
    return "->" in key or key in LEGACY.values()


def gives_windows(text: str) -> bool:
    """Whether a :meth:`WeightPrefetch.parse` text gives windows of its own."""
    return any(_is_window(item.partition("=")[0].strip().lower()) for item in text.split(";") if item.strip())


def _int(key: str, value: str) -> int:
    """A whole number as a count is written (ASCII digits: '+5', '1_0' and '٣' are none)."""
    try:
        return whole_number(value)
    except ValueError:
        raise UsageError(f"invalid {key} {value!r}: an integer (ASCII digits)") from None
