"""The arms of a decode-step measurement and the arithmetic of its controls. Pure (no torch).

An :class:`Arm` is one CUDA graph a point times: an attention library's step, with or without
a weight-prefetch configuration. Besides the arms that prefetch, a point holds the controls a
win must survive:

* ``stock-aa``, the A/A twin: stock's step captured a second time, in a graph of its own, timed
  as one more variant. Its ratio to stock is what the method reads as no difference: a point
  whose A/A twin strays beyond +-0.3% says the measurement, not the prefetch, moved.
* ``<lib>+zero``, the zero-byte arm of ``<lib>+wpf``: the same forks, joins and prefetch-kernel
  launches (the kernel launched with no rows: same node, same grid, no byte fetched;
  :class:`~kvpatch.prefetch.controller.PrefetchController` ``zero_bytes``), so ``+wpf`` over
  ``+zero`` is what the bytes gave and ``+zero`` over the library's plain arm what the graph's
  extra branches cost.
* ``tail+zero``: the in-kernel form's library (a second load of it) with an empty table.

:func:`by_predecessor` splits a round's samples by the arm that ran just before, from the order
:func:`kvpatch.gpu.timing.time_interleaved` runs them in: it shows whether what one arm leaves in
L2 (``evict_last`` lines) speeds up the next, which the guard (demoting those lines between
replays) exists to prevent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ..errors import UsageError
from ..gpu.stats import median
from .options import WeightPrefetch
from .windows import TailPrefetch

#: Suffixes of the arms' names.
WPF, ZERO, AA = "+wpf", "+zero", "-aa"
#: The A/A twin's ratio to stock the method accepts (per point, median of rounds).
AA_TOLERANCE = 0.003


@dataclass(frozen=True)
class Arm:
    """One graph of a point: ``library``'s step, with ``wpf`` (side-stream windows; ``zero``:
    its zero-byte control) or ``tail`` (the in-kernel form: ``library`` is a weight-tail build
    whose table the point sets). ``baseline``: the arm it is compared with besides stock (the
    same library without prefetch; for ``+wpf`` also its ``+zero`` twin, :attr:`twin_of`)."""

    name: str
    library: str
    wpf: WeightPrefetch | None = None
    zero: bool = False
    tail: TailPrefetch | None = None
    baseline: str = "stock"

    def __post_init__(self) -> None:
        if self.zero and self.wpf is None:
            raise ValueError(f"arm {self.name}: a zero-byte arm needs the configuration it mirrors")
        if self.wpf is not None and self.tail is not None:
            raise ValueError(f"arm {self.name}: side-stream windows or the in-kernel form, not both")

    def prefetches(self, batch: int) -> bool:
        """Whether its step fetches any weight byte at ``batch``."""
        if self.tail is not None:
            return self.tail.cap(batch) > 0
        return self.wpf is not None and not self.zero and self.wpf.cap(batch) > 0

    def hints(self, batch: int) -> set[str]:
        """The eviction hints its prefetches use at ``batch`` (empty: none fetched)."""
        if not self.prefetches(batch):
            return set()
        if self.tail is not None:
            return {self.tail.hint}
        wpf = self.wpf
        assert wpf is not None
        return {w.hint or wpf.hint or "evict_last" for w in wpf.effective_windows() if w.cap(batch) > 0}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "library": self.library, "zero": self.zero, "baseline": self.baseline,
                "weight_prefetch": self.wpf.to_dict() if self.wpf is not None else None,
                "tail": self.tail.to_dict() if self.tail is not None else None}  # fmt: skip


def default_arms(libs: Iterable[str], wpf: WeightPrefetch | None, *, aa: bool = True, zero: bool = True,
                 tail: TailPrefetch | None = None, tail_libs: Sequence[str] = ("tail", "tail0")) -> list[Arm]:  # fmt: skip
    """What ``kvpatch bench-decode`` times at each point: ``stock``, ``stock-aa``, each other
    attention library; with weight prefetch ``stock+zero``, ``stock+wpf`` and ``<lib>+wpf``; with
    ``tail`` and a ``tail`` library the in-kernel form (``tail``; ``tail+zero`` where a ``tail0``
    library, a second load of the same build, is given)."""
    names = list(libs)
    if "stock" not in names:
        raise UsageError(f"the libraries must include 'stock' (the baseline); got {', '.join(names) or 'none'}")
    plain = [n for n in names if n != "stock" and n not in tail_libs]
    arms = [Arm("stock", "stock")]
    if aa:
        arms.append(Arm("stock" + AA, "stock"))
    arms += [Arm(n, n) for n in plain]
    on = wpf is not None and not wpf.off()
    if on and zero:
        arms.append(Arm("stock" + ZERO, "stock", wpf, zero=True))
    if on:
        arms.append(Arm("stock" + WPF, "stock", wpf))
    if tail is not None and tail_libs[0] in names:
        twin = len(tail_libs) > 1 and tail_libs[1] in names  # the same build, its table empty
        arms.append(Arm(tail_libs[0], tail_libs[0], tail=tail, baseline=tail_libs[0] + ZERO if twin else "stock"))
        if twin:
            arms.append(Arm(tail_libs[0] + ZERO, tail_libs[1]))
    if on:
        arms += [Arm(n + WPF, n, wpf, baseline=n) for n in plain]
    check_arms(arms)
    return arms


def check_arms(arms: Sequence[Arm]) -> None:
    """:class:`UsageError` unless the first arm is plain stock, names are unique and every baseline
    is measured (a ``--lib`` named like one of the arms kvpatch adds, ``stock-aa``, is refused here)."""
    if not arms or arms[0].name != "stock" or arms[0].library != "stock" or arms[0].wpf or arms[0].tail:
        raise UsageError("the first arm must be plain stock: Arm('stock', 'stock')")
    names = [a.name for a in arms]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"arm name(s) given twice: {', '.join(twice)}")
    known = set(names)
    missing = sorted({a.baseline for a in arms} - known)
    if missing:
        raise UsageError(f"arms compared with arms not measured: {', '.join(missing)}")


def zero_twin(arm: Arm, arms: Sequence[Arm]) -> str | None:
    """The zero-byte arm with the same library and configuration as ``arm`` (None: none)."""
    if arm.zero or arm.wpf is None:
        return None
    return next((a.name for a in arms if a.zero and a.library == arm.library and a.wpf == arm.wpf), None)


# --------------------------------------------------------------------------- per-round arithmetic


def sequence_of(n: int, cycles: int) -> list[int]:
    """The launcher indices in the order one :func:`~kvpatch.gpu.timing.time_interleaved` round
    times them (after its warm-up, which runs 0..n-1)."""
    from ..gpu.timing import carryover_order

    return carryover_order(n) * cycles


def by_predecessor(
    order: Sequence[str], cycles: int, samples: Sequence[Sequence[float]]
) -> dict[str, dict[str, list[float]]]:
    """``{launcher: {predecessor: [us, ...]}}`` for one round: ``order`` the launchers as passed,
    ``samples[i]`` launcher ``order[i]``'s samples in the order timed. The first launch's
    predecessor is the warm-up's last launcher."""
    n = len(order)
    seq = sequence_of(n, cycles)
    seen = [0] * n
    out: dict[str, dict[str, list[float]]] = {name: {} for name in order}
    for pos, i in enumerate(seq):
        prev = seq[pos - 1] if pos else n - 1
        if seen[i] < len(samples[i]):
            out[order[i]].setdefault(order[prev], []).append(samples[i][seen[i]])
        seen[i] += 1
    return out


def carryover_check(rounds: Sequence[Mapping[str, Any]], hinted: Iterable[str], of: Iterable[str]) -> dict[str, Any]:
    """Whether arms ran faster right after an arm that prefetched with ``evict_last``: per arm
    of ``of``, the median of its samples after a ``hinted`` arm over the median after any other
    (``>1``: slower after them, ``<1``: faster). ``rounds``: each round's ``order``, ``cycles``
    and ``samples_us`` (as :func:`by_predecessor` takes them)."""
    hinted = set(hinted)
    after: dict[str, dict[str, list[float]]] = {}
    for r in rounds:
        for name, preds in by_predecessor(r["order"], r["cycles"], [r["samples_us"][n] for n in r["order"]]).items():
            d = after.setdefault(name, {"hinted": [], "other": []})
            for p, xs in preds.items():
                d["hinted" if p in hinted and p != name else "other"].extend(xs)
    out: dict[str, Any] = {"hinted_arms": sorted(hinted)}
    for name in of:
        d = after.get(name)
        if not d or not d["hinted"] or not d["other"]:
            continue
        out[name] = {"after_hinted_us": median(d["hinted"]), "after_other_us": median(d["other"]),
                     "ratio": median(d["hinted"]) / median(d["other"]), "n_hinted": len(d["hinted"]),
                     "n_other": len(d["other"])}  # fmt: skip
    return out
