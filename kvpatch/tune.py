"""``kvpatch tune``: sweep the template's settings on a GPU and keep the best per kernel.

Settings are chosen per *kernel*: one of the two kernels (v1, v2) of one instantiation
(query dtype, head size, block size, auto cache) of vLLM's template, named by its rule
selector (``fp16/128/16/auto/v2``); the two kernels of an instantiation compile from the
same loop but schedule it differently, and measure differently. The pieces, pure except
:func:`run_tune`:

* :func:`candidates` is the grid: every combination of ``issue``, ``scope`` and
  ``lookahead``, each a uniform configuration without rules (cache hint, size, align
  and placement stay the base's, so every kernel that calls the helper shares it).
* :func:`validation_failures` maps a validate report to, per candidate, the
  kernels where it was not bit-identical to stock.
* :func:`score` reduces a bench report to one :class:`Score` per candidate and
  kernel: the speedups over stock at the tuning points where vLLM dispatches that
  kernel (warm and cold), each point's verdict against its interval, and the
  geomean with its interval over rounds.
* :func:`choose` picks per kernel. A candidate *qualifies* when it is
  bit-identical there, its geomean interval lies above 1.00 and (policy ``strict``,
  the default) no point is slower than stock beyond noise; the qualifying one with
  the best geomean wins, else the kernel is ``off`` (compiled as stock).
  Policy ``geomean`` drops the per-point condition.
* :func:`combine` writes the picks as one configuration: the base settings, a rule
  per tuned instantiation (or one per kernel where v1 and v2 differ), and ``off``
  for every instantiation it did not measure (the ``fallback``), since nothing says
  the prefetch helps there.

:func:`run_tune` validates every candidate (bit-identical to stock on each tuned
instantiation, ALiBi on and off, GQA and MHA, both kernels), benches them side by
side on the ``tuning`` point set (never the headline or held-out sets), and returns
a :class:`TuneReport` whose configuration ``kvpatch apply --config`` takes once
written with :func:`kvpatch.config_io.dump_config`, with the machine it was tuned on.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence

from .config import DTYPES, RULE_KERNELS, PatchConfig, Selector, make_config
from .errors import UsageError
from .machine import FIELDS as MACHINE_FACTS
from .gpu.stats import SLOWER, geomean

#: The grid: (setting, values). 12 candidates.
GRID: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("issue", ("inline", "call", "split")),
    ("scope", ("cta", "kv-head")),
    ("lookahead", (1, 2)),
)
#: Settings a grid may vary (``--grid``): the three above, the runtime gates, which the
#: default grid leaves at 1 (always prefetch), and ``read`` (default grid: lane).
GRID_KEYS = ("issue", "scope", "lookahead", "min_group", "min_ctas", "min_kv_mib", "read")
POLICIES = ("strict", "geomean")
#: What an instantiation tune did not measure gets.
FALLBACKS = ("off", "base")


def candidate_name(cfg: PatchConfig) -> str:
    """``inline_kvhead_la1``: the grid settings of a configuration (``_mg2``, ``_ctas1024``,
    ``_kv64``: a runtime gate that is set; ``_warp``: read=warp)."""
    gates = (f"_mg{cfg.min_group}" if cfg.min_group != 1 else "") + (f"_ctas{cfg.min_ctas}" if cfg.min_ctas != 1 else "")
    gates += f"_kv{cfg.min_kv_mib}" if cfg.min_kv_mib else ""
    gates += "_warp" if cfg.read != "lane" else ""
    return f"{cfg.issue}_{cfg.scope.replace('-', '')}_la{cfg.lookahead}{gates}"


def parse_grid(text: str) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """``'issue=inline,call;min-group=2;min-ctas=1,1024'`` -> a grid: the default
    :data:`GRID` with the named settings' values replaced (or added, for the gates).
    Each value is checked as a configuration would check it (UsageError otherwise)."""
    grid = dict(GRID)
    seen = set()
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        key, sep, values = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in GRID_KEYS:
            raise UsageError(f"invalid --grid part {part!r}: use KEY=V1,V2 with KEY one of "
                             f"{', '.join(k.replace('_', '-') for k in GRID_KEYS)}")  # fmt: skip
        if key in seen:
            raise UsageError(f"--grid names {key.replace('_', '-')} twice")
        seen.add(key)
        vals: list[Any] = []
        for v in (x.strip() for x in values.split(",")):
            checked = getattr(make_config(**{key: v}, inherit_rules=False), key)  # the configuration's own validation
            if checked in vals:
                raise UsageError(f"--grid gives {key.replace('_', '-')}={v} twice")
            vals.append(checked)
        grid[key] = tuple(vals)
    if not seen:
        raise UsageError("--grid is empty: give KEY=V1,V2;... (e.g. 'min-group=1,2')")
    return tuple((k, grid[k]) for k in GRID_KEYS if k in grid)


def parse_grids(texts: Sequence[str]) -> list[tuple[tuple[str, tuple[Any, ...]], ...]]:
    """Repeated ``--grid`` texts -> the grids whose candidates' union is built; none: [GRID]."""
    return [parse_grid(t) for t in texts] if texts else [GRID]


def candidates(base: PatchConfig | None = None, grids=(GRID,)) -> dict[str, PatchConfig]:
    """``name -> uniform configuration`` (no rules) for every combination of each grid,
    the union over ``grids`` (``min-kv-mib`` only with ``issue=call``, the one form it applies to)."""
    base = replace(base if base is not None else make_config(), overrides=())
    out: dict[str, PatchConfig] = {}
    for g in grids:
        keys = [k for k, _ in g]
        for values in itertools.product(*(v for _, v in g)):
            cfg = replace(base, **dict(zip(keys, values)))
            if cfg.min_kv_mib and cfg.issue != "call":
                continue
            out[candidate_name(cfg)] = cfg
    return out


def validation_failures(report: Any) -> dict[str, set[str]]:
    """``{candidate: {kernel selector, ...}}`` where it failed a validate report's cases.

    A case where stock itself failed counts against every candidate: bit-identity with
    a stock that did not run correctly proves nothing.
    """
    from .gpu.points import kernel_selector

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
    #: points whose interval lies below 1.00
    slower: int = 0
    #: per round, the speedup at each point (for the geomean's interval); may be empty
    rounds: tuple[tuple[float, ...], ...] = ()
    #: ruled out by ``--exclude`` (e.g. what validate --upstream or the held-out set found after
    #: tune ran): never picked, and shown as such rather than as not bit-identical
    excluded: bool = False

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
        if not self.bit_identical or self.excluded or not self.speedups:
            return False
        if policy == "strict" and self.slower:
            return False
        return self.geomean_interval[0] > 1.0

    def key(self) -> tuple:
        """Sort key, best first: bit-identical, fewer slower points, geomean, worst."""
        return (not self.bit_identical or self.excluded, self.slower, -self.geomean, -self.worst)


def _row_kernel(row: dict) -> str:
    """The kernel selector (``fp16/128/16/auto/v2``) of one saved bench result row."""
    from .gpu.points import kernel_selector

    p = row["point"]
    return kernel_selector(p["dtype"], p.get("head_size", 128), p.get("block_size", 16),
                           p.get("kv_cache_dtype", "auto"), row["kernel"])  # fmt: skip


def score(bench: dict, failures: dict[str, set[str]]) -> list[Score]:
    """Scores from a bench report's JSON dict and :func:`validation_failures`."""
    acc: dict[tuple[str, str], list[dict]] = {}
    for r in bench["results"]:
        if not r["dispatched"]:
            continue
        inst = _row_kernel(r)
        _check_selector(inst)
        for name, timing in r["variants"].items():
            if name != bench["baseline"]:
                acc.setdefault((name, inst), []).append(timing)
    out = []
    for (name, inst), timings in sorted(acc.items()):
        per_round = [tuple(_speedup(x) for x in (t.get("speedup_rounds") or ())) for t in timings]
        n_rounds = min(len(r) for r in per_round) if per_round else 0
        rounds = tuple(tuple(r[i] for r in per_round) for i in range(n_rounds))
        out.append(Score(name, inst, tuple(_speedup(t["speedup"]) for t in timings),
                         inst not in failures.get(name, set()), sum(t.get("verdict") == SLOWER for t in timings),
                         rounds))  # fmt: skip
    return out


def _speedup(x: Any) -> float:
    """A measured speedup: a finite number > 0 (ValueError otherwise: the data is damaged)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not (0 < x < math.inf):
        raise ValueError(f"invalid speedup {x!r}")
    return float(x)


def _check_selector(text: str) -> None:
    """A measured kernel names one kernel exactly (no ``*``, every part valid)."""
    try:
        sel = Selector.parse(text)
    except UsageError:
        raise ValueError(f"invalid kernel {text!r}") from None
    if sel.specificity != 5 or sel.kernel not in RULE_KERNELS:
        raise ValueError(f"invalid kernel {text!r}")


@dataclass(frozen=True)
class Pick:
    """What :func:`choose` decided for one kernel: the winner (None: ``off``) and the ranking."""

    selector: str
    winner: Score | None
    ranked: tuple[Score, ...]

    @property
    def name(self) -> str:
        return self.winner.name if self.winner is not None else "off"


def choose(scores: Iterable[Score], policy: str = "strict") -> dict[str, Pick]:
    """Per kernel, the best qualifying candidate (see the module docstring), or off."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: choose {', '.join(POLICIES)}")
    by_inst: dict[str, list[Score]] = {}
    for s in scores:
        by_inst.setdefault(s.selector, []).append(s)
    picks = {}
    for inst, ss in sorted(by_inst.items()):
        ranked = tuple(sorted(ss, key=Score.key))
        ok = sorted((s for s in ss if s.qualifies(policy)), key=lambda s: (-s.geomean, -s.worst))
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

    def settings(pick: Pick) -> Any:
        if pick.winner is None:
            return "off"
        cand = configs[pick.winner.name]
        return {k: getattr(cand, k) for k in GRID_KEYS if k in always or getattr(cand, k) != getattr(default, k)}

    by_inst: dict[str, dict[str, Any]] = {}
    for sel, pick in picks.items():
        inst, _, kernel = sel.rpartition("/")
        by_inst.setdefault(inst, {})[kernel] = settings(pick)
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


@dataclass
class TuneReport:
    config: PatchConfig
    picks: dict[str, Pick]
    policy: str
    failures: dict[str, set[str]]
    #: the machine it ran on (kvpatch.machine.Machine)
    machine: Any = None
    #: the configuration each other policy would have written (marker text)
    alternatives: dict[str, str] = field(default_factory=dict)
    bench: dict = field(repr=False, default_factory=dict)
    tree: str | None = None  # the tree tuned (for the next command)
    #: candidate name -> the kernels ``--exclude`` ruled it out of (kept apart from ``failures``:
    #: an excluded candidate was bit-identical, and reads so when its JSON is chosen from again)
    exclusions: dict[str, set[str]] = field(default_factory=dict)

    @property
    def picked(self) -> dict[str, str]:
        return {inst: p.name for inst, p in self.picks.items()}

    def to_json(self) -> dict:
        return {
            "config": self.config.to_toml_dict(),
            "marker": self.config.marker(),
            "policy": self.policy,
            "picked": self.picked,
            "alternatives": self.alternatives,
            "machine": self.machine.to_dict() if self.machine is not None else None,
            "validation_failures": {k: sorted(v) for k, v in sorted(self.failures.items())},
            "exclusions": _dump_sets(self.exclusions),
            "ranking": {
                inst: [
                    {"name": s.name, "bit_identical": s.bit_identical, "excluded": s.excluded, "slower": s.slower, "worst": s.worst,
                     "geomean": s.geomean, "geomean_interval": list(s.geomean_interval),
                     "qualifies": s.qualifies(self.policy)}
                    for s in p.ranked
                ]
                for inst, p in self.picks.items()
            },  # fmt: skip
            "bench": self.bench,
        }


def tune_validate_matrix(instantiations: Iterable[tuple[str, int, int]]) -> list:
    """Each tuned (dtype, head, block): v1 and v2, a short context (17) and one over three v2
    partitions (1500), auto cache; without ALiBi GQA 8/2 and MHA 4/4 with 3 sequences, with
    ALiBi (random slopes) GQA 32/8 and MHA 16/16 with 8 (:data:`kvpatch.gpu.validate.ALIBI_HEADS`)."""
    from .gpu import validate as V

    out = []
    for dtype, head, block in sorted(set(instantiations)):
        one = dict(dtypes=(dtype,), kv_cache_dtypes=("auto",), head_sizes=(head,), block_sizes=(block,), contexts=(17, 1500))
        out += V.validate_matrix(**one, alibi=(False,))
        out += V.validate_matrix(**one, alibi=(True,), heads=V.ALIBI_HEADS, num_seqs=V.ALIBI_NUM_SEQS)
    return out


def tuned_instantiations(dtypes: Iterable[str] = (), only: Iterable[str] = ()) -> list[tuple[str, int, int]]:
    """The tuned (dtype, head, block)s, of ``dtypes`` only (if any) and picked by a selector of
    ``only`` (``dtype[/head[/block]]``; if any). UsageError for a selector that is invalid,
    names a KV cache or kernel (tune measures both kernels, auto cache), or picks none."""
    from .gpu import points as P

    sels = []
    for text in only:
        sel = Selector.parse(text)
        if sel.kv_cache is not None or sel.kernel is not None:
            raise UsageError(f"invalid --only {text!r}: give dtype[/head[/block]] (tune measures v1 and v2, auto cache)")
        sels.append(sel)
    out = [(d, h, b) for d in P.TUNING_DTYPES for h in P.TUNING_HEAD_SIZES for b in P.TUNING_BLOCK_SIZES
           if (not dtypes or d in dtypes) and (not sels or any(s.matches(d, h, b) for s in sels))]  # fmt: skip
    if not out:
        raise UsageError("--only/--dtype pick no tuned instantiation (tune measures "
                         f"{'/'.join(P.TUNING_DTYPES)} x head {'/'.join(map(str, P.TUNING_HEAD_SIZES))} x block "
                         f"{'/'.join(map(str, P.TUNING_BLOCK_SIZES))})")  # fmt: skip
    return out


def run_tune(libs: dict, configs: dict[str, PatchConfig], *, quick: bool, reps: int, rounds: int,
             policy: str = "strict", fallback: str = "off", progress=None, variant_info: dict | None = None,
             machine: Any = None, dtypes: Iterable[str] = (), only: Iterable[str] = ()) -> TuneReport:  # fmt: skip
    """Validate, bench on the tuning set and choose, on a GPU; ``libs`` holds 'stock' and
    one library per candidate (``quick``: batch 2/32 x context 512/12288 of the tuning set;
    ``dtypes``, ``only``: only the points of :func:`tuned_instantiations`)."""
    from .gpu import bench as Bn
    from .gpu import points as P
    from .gpu import validate as V

    points = P.point_set("tuning")
    if quick:
        points = [p for p in points if p.batch in (2, 32) and p.context in (512, 12288)]
    dtypes, only = list(dtypes), list(only)
    if dtypes or only:
        wanted = set(tuned_instantiations(dtypes, only))
        points = [p for p in points if (p.dtype, p.head_size, p.block_size) in wanted]
    matrix = tune_validate_matrix((p.dtype, p.head_size, p.block_size) for p in points)
    failures = validation_failures(V.run_validate(libs, matrix, seed=0))
    bench = Bn.run_bench(libs, points, reps=reps, rounds=rounds, kernels=("dispatched",), variant_info=variant_info,
                         point_set_name="tuning", progress=progress)  # fmt: skip
    data = bench.to_dict()
    return _report(score(data, failures), configs, failures, data, policy=policy, fallback=fallback, machine=machine)


def _report(scores: list[Score], configs: dict[str, PatchConfig], failures: dict[str, set[str]], bench: dict, *,
            policy: str, fallback: str, machine: Any, exclusions: dict[str, set[str]] | None = None) -> TuneReport:  # fmt: skip
    """Choose under ``policy``, combine, and note what each other policy would have written."""
    picks = choose(scores, policy)
    config = combine(picks, configs, fallback=fallback)
    alternatives = {p: combine(choose(scores, p), configs, fallback=fallback).marker() for p in POLICIES if p != policy}
    return TuneReport(config, picks, policy, failures, machine, alternatives, bench, exclusions=exclusions or {})


def candidate_configs(variant_info: dict[str, dict], baseline: str = "stock") -> dict[str, PatchConfig]:
    """``{name: configuration}`` of every library but ``baseline``, from its marker
    (:func:`kvpatch.config_io.config_from_marker`; UsageError for one that has none)."""
    from .config_io import config_from_marker

    return {n: config_from_marker(str(i.get("marker", ""))) for n, i in variant_info.items() if n != baseline}


# --------------------------------------------------------------------------- choosing again, without a GPU


def parse_exclusions(items: Iterable[str]) -> list[tuple[str, str]]:
    """``['inline_*@bf16/256/16/auto/v1']`` -> ``[('inline_*', 'bf16/256/16/auto/v1')]``: shell
    patterns of candidate names and kernel selectors to rule out (:func:`rechoose`)."""
    out = []
    for item in items:
        cand, sep, sel = str(item).partition("@")
        if not sep or not cand.strip() or not sel.strip():
            raise UsageError(f"invalid --exclude {item!r}: use CANDIDATE@SELECTOR, e.g. 'inline_*@bf16/256/16/auto/v1'")
        out.append((cand.strip(), sel.strip()))
    return out


def _load_sets(data: dict, key: str) -> dict[str, set[str]]:
    """A saved tune JSON's ``validation_failures`` or ``exclusions`` (candidate name -> a list of
    kernel selectors; absent: none) as sets."""
    raw = data.get(key, {})
    if not isinstance(raw, dict):
        raise ValueError(f"{key} is not an object")
    out = {}
    for name, sels in raw.items():
        if not isinstance(sels, list) or not all(isinstance(x, str) for x in sels):
            raise ValueError(f"{key}[{name!r}] is not a list of kernels")
        out[str(name)] = set(sels)
    return out


def _dump_sets(sets: dict[str, set[str]]) -> dict[str, list[str]]:
    """What :func:`_load_sets` reads: names and selectors sorted, empty sets left out."""
    return {k: sorted(v) for k, v in sorted(sets.items()) if v}


def merge_tune_data(runs: Sequence[dict]) -> dict:
    """Several saved tune JSONs as one: each kernel's measurements and validation results
    come from the last run that measured it (a later run re-tunes its kernels: with other
    candidates, or measured again), every other kernel's from the runs before. Each kernel
    is chosen among candidates timed side by side with stock in one run; no speedup of one
    run is compared with another run's. A candidate name two runs use must name the same
    configuration, and runs must come from one machine (GPU, driver, nvcc, arch and flags, where
    they record them): UsageError otherwise. The merged run's machine note joins theirs."""
    try:
        owner: dict[str, int] = {}
        for i, data in enumerate(runs):
            for row in data["bench"]["results"]:
                if row["dispatched"]:  # what score() reads
                    owner[_row_kernel(row)] = i
        info: dict[str, dict] = {}
        results, failures, exclusions = [], {}, {}
        for i, data in enumerate(runs):
            bench = data["bench"]
            if bench["baseline"] != runs[0]["bench"]["baseline"]:
                raise UsageError("the tune JSONs name different baselines")
            mine = {k for k, j in owner.items() if j == i}
            results += [row for row in bench["results"] if _row_kernel(row) in mine]
            for key, acc in (("validation_failures", failures), ("exclusions", exclusions)):
                for name, sels in _load_sets(data, key).items():
                    acc.setdefault(name, set()).update(s for s in sels if s in mine)
            for name, vi in bench["variant_info"].items():
                if name in info and str(info[name].get("marker")) != str(vi.get("marker")):
                    raise UsageError(f"candidate {name!r} names different configurations in two tune JSONs")
                info[name] = vi
    except (KeyError, TypeError, AttributeError, ValueError):
        raise UsageError("not a kvpatch tune JSON (no bench data, variant info or validation results)") from None
    machines = [d.get("machine") for d in runs if isinstance(d.get("machine"), dict)]
    seen = {tuple(m.get(f) for f in MACHINE_FACTS) for m in machines}
    if len(seen) > 1:
        raise UsageError("the tune JSONs were tuned on different machines (" + " / ".join(
            ", ".join(str(x) for x in fs if x) for fs in sorted(seen, key=str)) + "): tune each machine on its own")  # fmt: skip
    last = runs[-1]
    machine = last.get("machine")
    if machines:
        notes = list(dict.fromkeys(str(m["note"]) for m in machines if m.get("note")))
        machine = {**machines[-1], **({"note": " + ".join(notes)} if notes else {})}
    bench = {**last["bench"], "results": results, "variant_info": info,
             "merged_from": [{"kernels": sorted(k for k, j in owner.items() if j == i),
                              "seconds": d["bench"].get("seconds"), "env": d["bench"].get("env")}
                             for i, d in enumerate(runs)]}  # fmt: skip
    return {**last, "bench": bench, "machine": machine,
            "validation_failures": _dump_sets(failures), "exclusions": _dump_sets(exclusions)}


def rechoose(data: dict, *, policy: str = "strict", fallback: str = "off", exclude: Iterable[str] = (),
             machine: Any = None) -> TuneReport:  # fmt: skip
    """A :class:`TuneReport` from a saved tune JSON (:meth:`TuneReport.to_json`): the same bench
    data and validation results, chosen again under ``policy``/``fallback``, with the
    ``exclude`` patterns (:func:`parse_exclusions`) ruled out -- e.g. what ``validate --upstream``
    or the held-out set found on a kernel after tune ran. An excluded candidate is never picked
    and keeps its measured bit-identity; the report's ``exclusions`` (with those the saved JSON
    already had) record it apart from the validation failures."""
    import fnmatch

    try:
        bench = data["bench"]
        failures = _load_sets(data, "validation_failures")
        exclusions = _load_sets(data, "exclusions")
        configs = candidate_configs(bench["variant_info"], bench["baseline"])
    except (KeyError, TypeError, AttributeError, ValueError):
        raise UsageError("not a kvpatch tune JSON (no bench data, variant info or validation results)") from None
    if not configs:
        raise UsageError("the tune JSON holds no candidates")
    try:
        scores = score(bench, failures)
    except (KeyError, TypeError, AttributeError, ValueError):
        raise UsageError("the tune JSON's bench results are not what kvpatch tune writes") from None
    if not scores:
        raise UsageError("the tune JSON's bench holds no measured candidate kernel: nothing to choose from")
    unknown = sorted({s.name for s in scores} - set(configs))
    if unknown:
        raise UsageError(f"the tune JSON measured {', '.join(map(repr, unknown))} but has no configuration for it")
    for cand, sel in parse_exclusions(exclude):
        hits = {i for i, s in enumerate(scores) if fnmatch.fnmatchcase(s.name, cand) and fnmatch.fnmatchcase(s.selector, sel)}
        if not hits:
            raise UsageError(f"--exclude {cand}@{sel} matches no candidate and kernel of the tune data")
        for i in hits:
            exclusions.setdefault(scores[i].name, set()).add(scores[i].selector)
    scores = [replace(s, excluded=True) if s.selector in exclusions.get(s.name, ()) else s for s in scores]
    return _report(scores, configs, failures, bench, policy=policy, fallback=fallback, machine=machine, exclusions=exclusions)
