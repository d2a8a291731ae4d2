"""Scoring candidates from a bench report, choosing per kernel, and writing the picks as one
configuration (pure)."""

from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass, replace
from typing import Any, Hashable, Iterable

from ..config import DTYPES, RULE_KERNELS, PatchConfig, Selector, make_config
from ..config.model import GROUPING
from ..config.selector import kernel_selector
from ..dtypes import KV_CACHE_DTYPES
from ..errors import UsageError
from ..gpu.bench_report import STOCK_CODE, code_of
from ..gpu.stats import SLOWER, VERDICTS, geomean, verdict
from .grid import FALLBACKS, GRID, GRID_KEYS, POLICIES


def validation_failures(report: Any) -> dict[str, set[str]]:
    """``{candidate: {kernel selector, ...}}`` where it failed a validate report's cases.

    A case where stock itself failed counts against every candidate: bit-identity with
    a stock that did not run correctly proves nothing.
    """
    out: dict[str, set[str]] = {}
    for r in report.results:
        c = r.case
        inst = kernel_selector(c.dtype, c.head_size, c.block_size, c.kv_cache_dtype, c.kernel)
        for name, vc in r.variants.items():
            if vc.status == "fail" or r.reasons:
                out.setdefault(name, set()).add(inst)
    return out


@dataclass(frozen=True)
class Score:
    """One candidate on one kernel (``selector``: ``fp16/128/16/auto/v1``): its speedups at
    the tuning points where vLLM dispatches that kernel."""

    name: str
    selector: str
    speedups: tuple[float, ...]
    bit_identical: bool
    #: points whose interval lies below 1.00 where the candidate ran its own code
    slower: int = 0
    #: per round, the speedup at each point (for the geomean's interval); may be empty
    rounds: tuple[tuple[float, ...], ...] = ()
    #: ruled out by ``--exclude`` (e.g. what validate --upstream or the held-out set found after
    #: tune ran): never picked, and shown as such rather than as not bit-identical
    excluded: bool = False
    #: points whose interval lies below 1.00 where the candidate ran stock's own code (the
    #: kernel compiled as stock, its grouped form not taken): stock against itself, the
    #: bench's noise floor, so not held against it (:func:`kvpatch.gpu.bench_report.stock_code_of`)
    slower_stock_code: int = 0
    #: points where the candidate ran stock's own code (of ``speedups``)
    stock_points: int = 0
    #: per point (as ``speedups``): the bench result row it was measured in (its index in the
    #: report), and whether the candidate ran its own code there: what :func:`versus` pairs
    rows: tuple[int, ...] = ()
    own: tuple[bool, ...] = ()
    #: per point (as ``speedups``): which code it ran there (:func:`~kvpatch.gpu.bench_report.code_of`;
    #: None: cannot say); empty where not known at all
    code: tuple[Hashable | None, ...] = ()

    @property
    def only_stock(self) -> bool:
        """Stock's code at every point: nothing of the candidate was measured on this kernel."""
        return bool(self.speedups) and self.stock_points == len(self.speedups)

    @property
    def worst(self) -> float:
        return min(self.speedups) if self.speedups else math.nan

    @property
    def geomean(self) -> float:
        return geomean(self.speedups) if self.speedups else math.nan

    @property
    def geomean_interval(self) -> tuple[float, float]:
        """min..max over rounds of the round's geomean (the geomean itself without rounds)."""
        per_round = [geomean(r) for r in self.rounds if r and all(x > 0 for x in r)]
        if not per_round:
            return self.geomean, self.geomean
        return min(per_round), max(per_round)

    def qualifies(self, policy: str = "strict") -> bool:
        if not self.bit_identical or self.excluded or not self.speedups or self.only_stock:
            return False
        if policy == "strict" and self.slower:
            return False
        return self.geomean_interval[0] > 1.0

    def key(self) -> tuple:
        """Sort key, best first: bit-identical, measured (not stock's code everywhere), fewer slower
        points, geomean, worst."""
        return (not self.bit_identical or self.excluded, self.only_stock, self.slower, -self.geomean, -self.worst)


def row_fields(row: dict) -> tuple[str, int, int, str, str]:
    """(dtype, head size, block size, KV-cache dtype, kernel) of one saved bench result row (a
    point saved before head, block or cache were recorded is head 128, block 16, auto cache);
    ValueError for a row kvpatch's bench does not write (a size that is no int, a cache dtype
    it does not know)."""
    p = row["point"]
    head, block, kv = p.get("head_size", 128), p.get("block_size", 16), p.get("kv_cache_dtype", "auto")
    if not all(type(x) is int for x in (head, block)) or kv not in KV_CACHE_DTYPES:
        raise ValueError(f"invalid point {reprlib.repr(p)}")
    return p["dtype"], head, block, kv, row["kernel"]


def row_kernel(row: dict) -> str:
    """The kernel selector (``fp16/128/16/auto/v2``) of one saved bench result row."""
    return kernel_selector(*row_fields(row))


def score(bench: dict, failures: dict[str, set[str]]) -> list[Score]:
    """Scores from a bench report's JSON dict and :func:`validation_failures`. A slower point
    where the candidate ran stock's own code (what :func:`~kvpatch.gpu.bench_report.stock_code_of`
    says from its marker and the launch the bench checked) is counted apart, not as slower."""
    ran = code_of(bench.get("variant_info") or {}, bench["baseline"])
    acc: dict[tuple[str, str], list[tuple[dict, bool, int, Hashable | None]]] = {}
    for index, r in enumerate(bench["results"]):
        if not isinstance(r["dispatched"], bool):
            raise ValueError(f"invalid dispatched {reprlib.repr(r['dispatched'])}")
        if not r["dispatched"]:
            continue
        fields = row_fields(r)
        inst = kernel_selector(*fields)
        check_kernel(inst)
        for name, timing in r["variants"].items():
            if name != bench["baseline"]:
                if timing.get("verdict") not in VERDICTS:  # any other word was read as not slower
                    raise ValueError(f"invalid verdict {reprlib.repr(timing.get('verdict'))}")
                if timing.get("grouped") is not None and not isinstance(timing["grouped"], bool):
                    raise ValueError(f"invalid grouped {reprlib.repr(timing['grouped'])}")
                code = ran(name, *fields, timing.get("grouped"))
                acc.setdefault((name, inst), []).append((timing, code != STOCK_CODE, index, code))
    out = []
    for (name, inst), rows in sorted(acc.items()):
        timings = [t for t, _, _, _ in rows]
        per_round = [tuple(_speedup(x) for x in (t.get("speedup_rounds") or ())) for t in timings]
        n_rounds = min(len(r) for r in per_round) if per_round else 0
        rounds = tuple(tuple(r[i] for r in per_round) for i in range(n_rounds))
        slow = [own for t, own, _, _ in rows if t.get("verdict") == SLOWER]
        out.append(Score(name, inst, tuple(_speedup(t["speedup"]) for t in timings),
                         inst not in failures.get(name, set()), sum(slow), rounds,
                         slower_stock_code=len(slow) - sum(slow),
                         stock_points=sum(not own for _, own, _, _ in rows), rows=tuple(i for _, _, i, _ in rows),
                         own=tuple(own for _, own, _, _ in rows), code=tuple(c for _, _, _, c in rows)))  # fmt: skip
    return out


def _speedup(x: Any) -> float:
    """A measured speedup: a finite number > 0 (ValueError otherwise: the data is damaged)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not (0 < x < math.inf):
        raise ValueError(f"invalid speedup {x!r}")
    return float(x)


def check_kernel(text: str) -> None:
    """A measured kernel names one kernel exactly (no ``*``, every part valid)."""
    try:
        sel = Selector.parse(text)
    except UsageError:
        raise ValueError(f"invalid kernel {text!r}") from None
    if sel.specificity != 5 or sel.kernel not in RULE_KERNELS:
        raise ValueError(f"invalid kernel {text!r}")


@dataclass(frozen=True)
class Versus:
    """One candidate against another (the incumbent) on one kernel, point by point in the same
    rounds: each point's interval is min..max over rounds of the ratio of their speedups over
    stock in that round (stock's time cancels: the incumbent's median over the candidate's, the
    bench's own interval), and its verdict the bench's (:func:`~kvpatch.gpu.stats.verdict`).
    Without two rounds of both, a point has its one ratio: any ratio below 1.00 is slower."""

    #: points whose interval lies below 1.00, not counting those where both ran the same code
    #: (stock's, or the same SASS of their own: :func:`same_code`): the bench's noise floor
    slower: int
    geomean: float
    geomean_interval: tuple[float, float]
    points: int
    #: points whose interval lies below 1.00 where both ran the same code (not in ``slower``)
    slower_same_code: int = 0

    @property
    def beats(self) -> bool:
        """Faster than the incumbent: no point slower and the geomean's interval above 1.00."""
        return bool(self.points) and not self.slower and self.geomean_interval[0] > 1.0


def versus(challenger: Score, incumbent: Score) -> Versus:
    """``challenger`` against ``incumbent`` (:class:`Versus`) at the bench rows both were measured in."""
    where = {row: j for j, row in enumerate(incumbent.rows)}
    pairs = [(i, where[row]) for i, row in enumerate(challenger.rows) if row in where]
    n = min(len(challenger.rounds), len(incumbent.rounds))
    per_round = [[challenger.rounds[r][i] / incumbent.rounds[r][j] for i, j in pairs] for r in range(n)]
    ratios = [challenger.speedups[i] / incumbent.speedups[j] for i, j in pairs]
    slower = same = 0
    for k, (i, j) in enumerate(pairs):
        lo, hi = (min(r[k] for r in per_round), max(r[k] for r in per_round)) if n >= 2 else (ratios[k], ratios[k])
        if verdict(lo, hi) == SLOWER:
            if same_code(challenger, i, incumbent, j):
                same += 1
            else:
                slower += 1
    if not pairs:
        return Versus(0, math.nan, (math.nan, math.nan), 0)
    g = geomean(ratios)
    interval = (min(map(geomean, per_round)), max(map(geomean, per_round))) if n >= 2 else (g, g)
    return Versus(slower, g, interval, len(pairs), same)


def same_code(a: Score, i: int, b: Score, j: int) -> bool:
    """Whether ``a`` at its point ``i`` and ``b`` at its point ``j`` ran the same code: both stock's,
    or both the same SASS of their own by the digests their builds recorded
    (:func:`~kvpatch.gpu.bench_report.code_of`); not where either cannot say."""
    if not (a.own[i] or b.own[j]):
        return True
    if not (a.code and b.code):
        return False
    return a.code[i] is not None and a.code[i] == b.code[j]


@dataclass(frozen=True)
class Pick:
    """What :func:`choose` decided for one kernel: the winner (None: ``off``) and the ranking."""

    selector: str
    winner: Score | None
    ranked: tuple[Score, ...]

    @property
    def name(self) -> str:
        return self.winner.name if self.winner is not None else "off"


def choose(scores: Iterable[Score], policy: str = "strict", incumbent: str | None = None) -> dict[str, Pick]:
    """Per kernel, the best qualifying candidate (see the module docstring), or off. With an
    ``incumbent`` (a candidate's name) that qualifies on a kernel, it stays there unless a
    qualifying candidate :attr:`Versus.beats` it (then the best of those)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: choose {', '.join(POLICIES)}")
    by_inst: dict[str, list[Score]] = {}
    for s in scores:
        by_inst.setdefault(s.selector, []).append(s)
    picks = {}
    for inst, ss in sorted(by_inst.items()):
        ranked = tuple(sorted(ss, key=Score.key))
        ok = sorted((s for s in ss if s.qualifies(policy)), key=lambda s: (-s.geomean, -s.worst))
        held = next((s for s in ok if s.name == incumbent), None)
        if held is not None:
            ok = [s for s in ok if s is not held and versus(s, held).beats] + [held]
        picks[inst] = Pick(inst, ok[0] if ok else None, ranked)
    return picks


def combine(picks: dict[str, Pick], configs: dict[str, PatchConfig], *, fallback: str = "off") -> PatchConfig:
    """One configuration: the base settings; per tuned instantiation one rule
    (``fp16/128/16/auto``) when its two kernels got the same pick, else one per kernel
    (``.../v1``, ``.../v2``; a kernel tune did not measure gets the other's); and for
    every other instantiation ``fallback``: ``off`` (a rule per dtype) or ``base`` (the
    base settings). No other rule survives."""
    if fallback not in FALLBACKS:
        raise ValueError(f"unknown fallback {fallback!r}: choose {', '.join(FALLBACKS)}")
    # the candidates' shared settings, with every key a grid may vary at kvpatch's base values
    default = make_config()
    base = replace(next(iter(configs.values())), overrides=(), **{k: getattr(default, k) for k in GRID_KEYS})
    plain = {k: v for k, v in base.to_toml_dict().items() if k not in ("rules", "inherit_rules", *DTYPES)}
    always = {k for k, _ in GRID}  # the default grid's keys always; a gate only where it is set (the base has it at 1)

    def settings(pick: Pick, sel: Selector) -> Any:
        """What the winner gives this kernel: its settings there (a candidate with rules, such as
        the shipped table with ``group``, by the rule that selects the kernel)."""
        if pick.winner is None:
            return "off"
        cand = configs[pick.winner.name].resolve(sel.dtype, sel.head_size, sel.block_size, sel.kv_cache, sel.kernel)
        if cand.off:
            grouping = {k: getattr(cand, k) for k in GROUPING if getattr(cand, k) != getattr(default, k)}
            return {"off": True, **grouping} if grouping else "off"
        return {k: getattr(cand, k) for k in GRID_KEYS if k in always or getattr(cand, k) != getattr(default, k)}

    by_inst: dict[str, dict[str, Any]] = {}
    for sel, pick in picks.items():
        inst, _, kernel = sel.rpartition("/")
        by_inst.setdefault(inst, {})[kernel] = settings(pick, Selector.parse(sel))
    rules: dict[str, Any] = {}
    for inst, per_kernel in sorted(by_inst.items()):
        values = list(per_kernel.values())
        if all(v == values[0] for v in values):
            rules[inst] = values[0]
        else:
            for kernel, value in per_kernel.items():
                rules[f"{inst}/{kernel}"] = value
    dtypes = {d: ("off" if fallback == "off" else "none") for d in DTYPES}
    return make_config(**plain, **dtypes, rules=rules, inherit_rules=False)
