"""The decode step's weight-prefetch windows: where in a layer a prefetch is forked, which
weight it pulls, how much of it per batch bucket, and with which eviction hint.

Pure Python (no torch): the step (:mod:`.step`) runs :data:`LAYER_OPS` in order and forks a
window's prefetch right before the op the window names; :func:`plan_forks` says, for a
configuration and a batch, which forks a step makes and what each pulls. The CPU tests check it.

A window's weight is the *next* GEMM's: the prefetch overlaps the small kernels before that GEMM
(the residual add and RMSNorm, SiLU * mul, the KV write and attention), when HBM has little to
do, and pulls the head of the weight (the first rows: the GEMM's first CTAs read them first) up
to the window's cap. ``down->qkv`` pulls the next layer's QKV weight and has no fork after the
last layer: in a model the next step's first layer is far away (final norm, LM head, sampling),
and a fork there would warm the *next replay*, which in an interleaved measurement may be another
variant's.

Text form of a window (``--wpf`` items, the sweep's labels): ``NAME=CAPS[@HINT]``, caps as
:func:`parse_caps` reads them (``1:12,4:12,8:8`` MiB per batch bucket, or one MiB value
for every batch), e.g. ``oproj->gateup=1:12,8:8@evict_normal``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import UsageError

#: The ops of one decoder layer, in the order the step runs them (``kv``: the new token's K/V
#: written into the paged cache; ``add1``/``add2``: the residual adds; ``act``: SiLU * up).
LAYER_OPS = ("norm1", "qkv", "kv", "attn", "oproj", "add1", "norm2", "gateup", "act", "down", "add2")
#: The GEMM ops and the weight each reads.
GEMM_WEIGHTS = {"qkv": "qkv", "oproj": "o_proj", "gateup": "gate_up", "down": "down"}
#: Eviction hints a window may name (the prefetch kernel's).
HINTS = ("evict_last", "evict_normal", "evict_first", "none")
MiB = 1 << 20
#: The first form's per-batch caps in MiB (bucket bounds: batch b uses the smallest key >= b;
#: above the largest key, no prefetch). The first H200 run (decode-1, benchmarks/ARCHIVE.md)
#: measured these at 0.99x; ``cap=default`` still names them.
DEFAULT_CAPS_MIB: dict[int, int] = {1: 32, 2: 32, 4: 32, 8: 16}


@dataclass(frozen=True)
class WindowKind:
    """Where a window forks (right before op ``before``) and what it pulls (``weights``, in
    reading order, of this layer or, with ``next_layer``, of the next one)."""

    name: str
    before: str
    weights: tuple[str, ...]
    next_layer: bool = False
    about: str = ""

    @property
    def target(self) -> str:
        """The GEMM op whose weight the window warms (the first it pulls)."""
        return next(op for op, w in GEMM_WEIGHTS.items() if w == self.weights[0])


#: Every window the step can fork, by name. The last two are the first form of the runtime
#: (one window per layer pulling o_proj, gate/up and down, forked before attention or before
#: the layer's first RMSNorm): ``WeightPrefetch(caps=..., fork=...)`` still means them.
KINDS: dict[str, WindowKind] = {k.name: k for k in (
    WindowKind("norm->qkv", "norm1", ("qkv",), about="before the layer's first RMSNorm (after the previous residual add)"),
    WindowKind("attn->oproj", "attn", ("o_proj",), about="before attention (after the KV write)"),
    WindowKind("oproj->gateup", "add1", ("gate_up",), about="after the o_proj GEMM (before its residual add and RMSNorm)"),
    WindowKind("norm->gateup", "norm2", ("gate_up",), about="before the second RMSNorm (after the residual add)"),
    WindowKind("gateup->down", "act", ("down",), about="after the gate/up GEMM (before SiLU * mul)"),
    WindowKind("down->qkv", "add2", ("qkv",), next_layer=True,
               about="after the down GEMM (before its residual add and the next layer's RMSNorm): the next layer's QKV"),
    WindowKind("attn", "attn", ("o_proj", "gate_up", "down"), about="first form: before attention, o_proj + gate/up + down"),
    WindowKind("layer", "norm1", ("o_proj", "gate_up", "down"), about="first form: before the first RMSNorm, o_proj + gate/up + down"),
)}  # fmt: skip
#: The windows of the step proper (not the first form), in the order their forks come in a layer.
STEP_WINDOWS = ("norm->qkv", "attn->oproj", "oproj->gateup", "norm->gateup", "gateup->down", "down->qkv")
#: The first form's window for each of its fork points (``WeightPrefetch.fork``).
LEGACY = {"attn": "attn", "qkv": "layer"}


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
        text_batch, sep, cap = item.partition(":")
        try:
            batch = int(text_batch) if sep and text_batch.strip().isascii() and text_batch.strip().isdigit() else 0
        except ValueError:  # thousands of digits: int() refuses them
            batch = 0
        if batch < 1:
            raise UsageError(f"invalid cap {item!r}: use BATCH:MIB, e.g. 1:32,4:32,8:16")
        if batch in caps:
            raise UsageError(f"invalid cap {text!r}: batch {batch} given twice")
        caps[batch] = _mib(cap)
    if not caps:
        raise UsageError(f"invalid cap {text!r}: use BATCH:MIB, e.g. 1:32,4:32,8:16")
    return caps


#: The largest cap: 1 TiB, far beyond any GPU's L2 (a typo, refused before it overflows).
MAX_CAP_MIB = 1 << 20


def _mib(text: str) -> int:
    """A cap in MiB (ASCII digits, one '.' at most: no sign, exponent, '_' or other digits) as
    bytes, a multiple of 16; a positive cap under 16 bytes, which would be none, is refused."""
    t = text.strip()
    if not (t.isascii() and t.count(".") <= 1 and t.replace(".", "").isdigit()):
        raise UsageError(f"invalid cap {text!r}: a number of MiB >= 0 (digits, one '.' at most)")
    value = float(t)
    if value > MAX_CAP_MIB:
        raise UsageError(f"invalid cap {text!r}: at most {MAX_CAP_MIB} MiB")
    out = int(value * MiB) // 16 * 16
    if value > 0 and out == 0:
        raise UsageError(f"invalid cap {text!r}: under 16 bytes, no prefetch; give 0 or off for none")
    return out


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


def cap_for(caps: int | Mapping[int, int], batch: int) -> int:
    """Bytes a batch gets: one cap for every batch, or the smallest bucket >= batch (0 above them all)."""
    if isinstance(caps, int):
        return caps
    bounds = sorted(b for b in caps if b >= batch)
    return int(caps[bounds[0]]) if bounds else 0


@dataclass(frozen=True)
class Window:
    """One window of a configuration: its kind's name, its cap (bytes; one for every batch or
    ``{batch bucket: bytes}``) and its eviction hint (None: the configuration's)."""

    name: str
    caps: Any
    hint: str | None = None

    def __post_init__(self) -> None:
        if self.name not in KINDS:
            raise UsageError(f"unknown prefetch window {self.name!r}: choose one of {', '.join(KINDS)}")
        if self.hint is not None and self.hint not in HINTS:
            raise UsageError(f"unknown hint {self.hint!r} for window {self.name}: choose one of {', '.join(HINTS)}")
        caps = self.caps
        if isinstance(caps, Mapping):
            bad = [
                (b, c)
                for b, c in caps.items()
                if isinstance(b, bool) or isinstance(c, bool) or int(b) < 1 or int(c) < 0
            ]
            if bad:
                raise UsageError(f"window {self.name}: caps must be {{batch >= 1: bytes >= 0}}, not {dict(caps)!r}")
            object.__setattr__(self, "caps", {int(b): int(c) for b, c in sorted(caps.items())})
        elif isinstance(caps, bool) or not isinstance(caps, int) or caps < 0:
            raise UsageError(f"window {self.name}: cap must be bytes >= 0 or {{batch: bytes}}, not {caps!r}")

    @property
    def kind(self) -> WindowKind:
        return KINDS[self.name]

    def cap(self, batch: int) -> int:
        return cap_for(self.caps, batch)

    def with_(self, **changes: Any) -> Window:
        from dataclasses import replace

        return replace(self, **changes)

    def text(self) -> str:
        return f"{self.name}={caps_text(self.caps)}" + (f"@{self.hint}" if self.hint else "")

    @classmethod
    def parse(cls, name: str, value: str) -> Window:
        """``('oproj->gateup', '1:12,8:8@evict_normal')`` -> a Window (UsageError, one line)."""
        caps_part, at, hint = value.partition("@")
        return cls(name.strip(), parse_caps(caps_part), hint.strip() if at else None)

    def to_dict(self) -> dict[str, Any]:
        caps = self.caps if isinstance(self.caps, int) else {str(b): c for b, c in self.caps.items()}
        return {"name": self.name, "caps": caps, "hint": self.hint, "text": self.text()}


@dataclass(frozen=True)
class Fork:
    """One fork of a step: in ``layer``, right before op ``before``, window ``window`` pulls
    ``weights`` of layer ``target_layer``, up to ``cap`` bytes, with ``hint``."""

    layer: int
    before: str
    window: str
    target_layer: int
    weights: tuple[str, ...]
    cap: int
    hint: str | None


def plan_forks(windows: Sequence[Window], layers: int, batch: int) -> list[Fork]:
    """The forks a step of ``layers`` layers makes at ``batch``, in the order it makes them
    (layer by layer, op by op; windows before the same op in the order given). A window whose
    cap at this batch is 0, or whose weights would be the next layer's after the last, makes none.
    Raises :class:`UsageError` for a window given twice."""
    names = [w.name for w in windows]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"prefetch window(s) given twice: {', '.join(twice)}")
    if layers < 1 or batch < 1:
        raise ValueError(f"layers and batch must be >= 1, not {layers}/{batch}")
    forks = []
    for layer in range(layers):
        for op in LAYER_OPS:
            for w in windows:
                k = w.kind
                if k.before != op or w.cap(batch) == 0:
                    continue
                target = layer + 1 if k.next_layer else layer
                if target >= layers:
                    continue
                forks.append(Fork(layer, op, w.name, target, k.weights, w.cap(batch), w.hint))
    return forks


def forks_by_op(forks: Sequence[Fork]) -> dict[tuple[int, str], list[Fork]]:
    """``{(layer, op): [forks made right before it]}``: what the step looks up per op."""
    out: dict[tuple[int, str], list[Fork]] = {}
    for f in forks:
        out.setdefault((f.layer, f.before), []).append(f)
    return out


def prefetch_bytes(forks: Sequence[Fork], weight_bytes: Mapping[str, int]) -> int:
    """Bytes a step's forks pull at most: each fork's cap, or less where its weights are smaller."""
    return sum(min(f.cap, sum(weight_bytes[w] for w in f.weights)) for f in forks)


def parse_windows(text: str) -> tuple[Window, ...]:
    """``'oproj->gateup=12@evict_normal;gateup->down=1:8,8:4'`` -> windows (UsageError, one line)."""
    out = []
    for item in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, value = item.partition("=")
        if not sep or not value.strip():
            raise UsageError(
                f"invalid prefetch window {item!r}: use NAME=CAPS[@HINT], e.g. oproj->gateup=12@evict_normal"
            )
        out.append(Window.parse(name, value))
    return tuple(out)


def windows_text(windows: Sequence[Window]) -> str:
    return ";".join(w.text() for w in windows)


@dataclass(frozen=True)
class TailPrefetch:
    """The in-kernel form: the attention kernel's tail prefetches the head of the layer's
    o_proj weight, each CTA its share (a library built with ``weight_tail``; see
    :mod:`kvpatch.prefetch.tail`). ``caps``: bytes per batch bucket (or one for every batch),
    ``hint``: the eviction hint, ``chunk``: bytes per bulk prefetch (CTA c takes chunks c,
    c + CTAs, ...)."""

    caps: Any
    hint: str = "evict_normal"
    chunk: int = 65536  # one CTA's thread 0 issues them: few, large bulk prefetches

    def __post_init__(self) -> None:
        Window("attn->oproj", self.caps, self.hint)  # the same checks as the side-stream window's
        if isinstance(self.caps, Mapping):
            object.__setattr__(self, "caps", {int(b): int(c) for b, c in sorted(self.caps.items())})
        if (
            isinstance(self.chunk, bool)
            or not isinstance(self.chunk, int)
            or not (16 <= self.chunk <= 1_048_560)
            or self.chunk % 16
        ):
            raise UsageError(f"tail chunk {self.chunk!r}: a multiple of 16 from 16 to 1048560")

    def cap(self, batch: int) -> int:
        return cap_for(self.caps, batch)

    def text(self) -> str:
        return f"tail={caps_text(self.caps)}@{self.hint}" + (f";chunk={self.chunk}" if self.chunk != 65536 else "")

    def to_dict(self) -> dict[str, Any]:
        caps = self.caps if isinstance(self.caps, int) else {str(b): c for b, c in self.caps.items()}
        return {"caps": caps, "hint": self.hint, "chunk": self.chunk, "text": self.text()}
