"""The weight-prefetch sweep's constants and choices, pure (no torch): the points and stages'
settings, the arms of each stage, and how the windows of the final configuration are picked from
what the stages measured (:mod:`.sweep` runs the stages, :mod:`.stages` holds them)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from ..gpu.stats import geomean
from .arms import Arm
from .options import MiB, WeightPrefetch
from .windows import STEP_WINDOWS, TailPrefetch, Window

MODELS = ("llama-3.1-8b", "llama-3.2-1b")
DTYPE = "bf16"
BATCHES = (1, 4, 8)
CONTEXTS = (1024, 4096)
LAYERS = 8
ROUNDS = 7
STEP_ROUNDS = 7
KERNEL_CAPS_MIB = (4, 8, 16, 32)
KERNEL_ROUNDS = 4
KERNEL_HINTS = ("evict_normal", "evict_last", "evict_first")
#: A window joins the pick at a batch only where its step ratio to stock (geomean over the
#: stage's points of that batch) beats 1 by more than this.
MIN_GAIN = 0.0015
#: The in-kernel form and its side-stream twin: all of o_proj up to batch 8 (32 MiB holds the
#: 8B model's whole 32 MiB weight; the 1B model's is 8 MiB), evict_normal.
TAIL = TailPrefetch({8: 32 * MiB}, "evict_normal")
#: Each stage ends by this share of the budget (the final bench by the whole of it, less the
#: guard-off demonstration's share).
SHARES = {"lead": 0.30, "micro": 0.34, "kernels": 0.48, "steps": 0.66, "final": 0.94, "guard_off": 1.0}
MICRO_SHAPES = (
    ("llama-3.1-8b o_proj", 4096, 4096),
    ("llama-3.1-8b gate_up", 28672, 4096),
    ("llama-3.1-8b down", 4096, 14336),
)


def control_arms(libs: Sequence[str], wpf: WeightPrefetch, *, tail: TailPrefetch | None = TAIL) -> list[Arm]:
    """Stage 1's and 5's arms: stock, its A/A twin, the configuration and its zero-byte twin,
    the side-stream twin of the in-kernel form and the in-kernel form (with its zero-byte load),
    patched and patched with the configuration (the libraries that are there)."""
    arms = [Arm("stock", "stock"), Arm("stock-aa", "stock")]
    if not wpf.off():
        arms += [Arm("stock+zero", "stock", wpf, zero=True), Arm("stock+wpf", "stock", wpf)]
    if tail is not None:
        arms.append(Arm("stock+attn", "stock", WeightPrefetch(windows=(Window("attn->oproj", tail.caps, tail.hint),))))
        if "tail" in libs:  # compared with its own build's empty table where there is one
            arms.append(Arm("tail", "tail", tail=tail, baseline="tail+zero" if "tail0" in libs else "stock"))
            if "tail0" in libs:
                arms.append(Arm("tail+zero", "tail0"))
    if "patched" in libs:
        arms.append(Arm("patched", "patched"))
        if not wpf.off():
            arms.append(Arm("patched+wpf", "patched", wpf, baseline="patched"))
    return arms


def step_windows(best: Mapping[tuple[str, int], Mapping[str, Any]], batches: Sequence[int] = BATCHES,
                 windows: Sequence[str] = STEP_WINDOWS) -> dict[str, Window]:  # fmt: skip
    """Stage 4's windows from stage 3's :func:`~.kernels.best_configs` (with ``min_net_us``
    -inf: every window's best, whatever its sign): per window the hint that wins at the most
    batches (ties: the larger net), and per batch bucket that batch's cap (its best with that
    hint: the cap itself where the hint matches, else the batch's best cap)."""
    out = {}
    for w in windows:
        rows = {b: best[(w, b)] for b in batches if (w, b) in best}
        if not rows:
            continue
        votes: dict[str, tuple[int, float]] = {}
        for r in rows.values():
            n, net = votes.get(r["hint"], (0, 0.0))
            votes[r["hint"]] = (n + 1, net + r["net_us"])
        hint = max(votes, key=lambda h: votes[h])
        out[w] = Window(w, {b: int(r["cap_bytes"]) for b, r in sorted(rows.items())}, hint)
    return out


#: The launch knobs stage 4 also tries on its combination (``all:small``): few CTAs, large bulk
#: prefetches (the first sweep's grid 16 beat grid 32, 132 and 264).
SMALL = {"grid": 4, "chunk": 32768}


def step_arms(windows: Mapping[str, Window], positive: Sequence[str]) -> list[Arm]:
    """Stage 4's arms: stock, its A/A twin, each window alone (``w:<name>``), the windows of
    ``positive`` together (``all``, with its zero-byte twin ``all+zero`` where there are two or
    more) and the same with :data:`SMALL` launch knobs (``all:small``)."""
    arms = [Arm("stock", "stock"), Arm("stock-aa", "stock")]
    arms += [Arm(f"w:{name}", "stock", WeightPrefetch(windows=(w,))) for name, w in windows.items()]
    together = tuple(windows[n] for n in positive if n in windows)
    if len(together) > 1:
        combo = WeightPrefetch(windows=together)
        arms += [Arm("all+zero", "stock", combo, zero=True), Arm("all", "stock", combo)]
    if together:
        arms.append(Arm("all:small", "stock", WeightPrefetch(windows=together, **SMALL)))
    return arms


def pick_launch(points: Sequence[Mapping[str, Any]], min_gain: float = MIN_GAIN) -> dict[str, Any]:
    """:data:`SMALL` where stage 4's ``all:small`` beat its default-knob twin (``all``, else the
    one window it holds) by more than ``min_gain`` in geomean over the points, else ``{}``."""
    small = [p["variants"]["all:small"] for p in points if "all:small" in p["variants"]]
    if not small:
        return {}
    twin = "all" if all("all" in p["variants"] for p in points) else next(
        (n for n in points[0]["variants"] if n.startswith("w:") and
         _same_windows(points, n, small[0]["weight_prefetch"]["windows"])), None)  # fmt: skip
    if twin is None:
        return {}
    ours = geomean([v["speedup"]["median"] for v in small])
    theirs = geomean([p["variants"][twin]["speedup"]["median"] for p in points if twin in p["variants"]])
    return dict(SMALL) if ours > theirs * (1 + min_gain) else {}


def _same_windows(points: Sequence[Mapping[str, Any]], name: str, windows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether arm ``name`` of the points prefetches exactly ``windows`` (their dicts)."""
    mine = points[0]["variants"][name].get("weight_prefetch") or {}
    return [w["text"] for w in mine.get("windows", [])] == [w["text"] for w in windows]


def pick_windows(points: Sequence[Mapping[str, Any]], windows: Mapping[str, Window], batches: Sequence[int] = BATCHES,
                 min_gain: float = MIN_GAIN) -> tuple[WeightPrefetch | None, dict[str, Any]]:  # fmt: skip
    """The final configuration from stage 4's points: per window and batch bucket, its cap
    where the window's arm beat stock (geomean of its median ratios over that batch's points)
    by more than ``min_gain``, else 0; the windows left with no cap anywhere are dropped.
    Returns (the configuration, or None when no window passed anywhere; and why)."""
    why: dict[str, Any] = {}
    chosen = []
    for name, w in windows.items():
        caps = {}
        why[name] = {}
        for b in batches:
            rs = [p["variants"][f"w:{name}"]["speedup"]["median"] for p in points
                  if p["batch"] == b and f"w:{name}" in p["variants"]]  # fmt: skip
            score = geomean(rs) if rs else math.nan
            ok = bool(rs) and score > 1 + min_gain and w.cap(b) > 0
            caps[b] = w.cap(b) if ok else 0
            why[name][str(b)] = {"geomean": score, "points": len(rs), "cap_mib": w.cap(b) / MiB, "kept": ok}
        if any(caps.values()):
            chosen.append(Window(name, caps, w.hint))
    if not chosen:
        return None, {"windows": why, "reason": f"no window beat stock by more than {min_gain:.2%} at any batch"}
    return WeightPrefetch(windows=tuple(chosen)), {"windows": why}


def best_single(points: Sequence[Mapping[str, Any]], windows: Mapping[str, Window]) -> WeightPrefetch | None:
    """The one window whose arm had the best geomean ratio over all of stage 4's points."""
    scores = {}
    for name in windows:
        rs = [p["variants"][f"w:{name}"]["speedup"]["median"] for p in points if f"w:{name}" in p["variants"]]
        if rs:
            scores[name] = geomean(rs)
    if not scores:
        return None
    return WeightPrefetch(windows=(windows[max(scores, key=lambda n: scores[n])],))


def all_identical(result: Mapping[str, Any]) -> bool:
    """Whether every point the sweep measured was bit-identical to stock."""
    return all(s.get("all_identical", True) for s in (result.get("summaries") or {}).values())
