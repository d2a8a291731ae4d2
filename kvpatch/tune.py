"""``kvpatch tune``: sweep the template's settings on a GPU and keep the best per dtype.

The pieces, pure except :func:`run_tune`:

* :func:`candidates` is the grid: every combination of ``issue``, ``scope``,
  ``lookahead`` and ``cache_hint`` (the settings a dtype can take on its own), each a
  uniform configuration (the same for every dtype).
* :func:`score` reduces a bench report to, per candidate and dtype, the speedups over
  stock on the kernel vLLM dispatches at each point of the ``tuning`` point set
  (:mod:`kvpatch.gpu.points`), warm and cold.
* :func:`choose` ranks, per dtype: bit-identical candidates first, then those never
  slower than stock, then by geometric mean, then by the worst point; and :func:`combine` turns the winners into one configuration:
  base settings = the bf16 winner (they serve bf16 and fp32), ``[kvpatch.fp16]`` = the
  fp16 winner, keeping the rule that the dtypes calling the helper share align and
  cache-hint.

:func:`run_tune` builds every candidate in one parallel build, validates each on the
quick matrix (bit-identical to stock, ALiBi included), benches them side by side on
the tuning set (the held-out set is never shown to tune), and returns a :class:`TuneReport` whose ``config`` ``kvpatch apply --config``
takes once written with :func:`kvpatch.config.dump_config`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

from .config import PatchConfig, make_config
from .gpu.stats import geomean

#: The grid: (setting, values). 16 candidates.
GRID: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("issue", ("inline", "call")),
    ("scope", ("cta", "kv-head")),
    ("lookahead", (1, 2)),
    ("cache_hint", ("none", "evict_last")),
)
TUNED_DTYPES = ("fp16", "bf16")


def candidates(base: PatchConfig | None = None, grid=GRID) -> dict[str, PatchConfig]:
    """``name -> uniform configuration`` for every combination of the grid."""
    base = base if base is not None else make_config()
    out: dict[str, PatchConfig] = {}
    keys = [k for k, _ in grid]
    for values in itertools.product(*(v for _, v in grid)):
        settings = dict(zip(keys, values))
        cfg = replace(base, overrides=(), **settings)
        name = "_".join(
            [settings["issue"], settings["scope"].replace("-", ""), f"la{settings['lookahead']}",
             "el" if settings["cache_hint"] == "evict_last" else "nh"]
        )  # fmt: skip
        out[name] = cfg
    return out


@dataclass(frozen=True)
class Score:
    """One candidate on one dtype: its speedups at the dispatched points, warm + cold."""

    name: str
    dtype: str
    speedups: tuple[float, ...]
    bit_identical: bool

    @property
    def worst(self) -> float:
        return min(self.speedups) if self.speedups else math.nan

    @property
    def geomean(self) -> float:
        return geomean(self.speedups) if self.speedups else math.nan

    def key(self) -> tuple:
        """Sort key, best first: bit-identical, never slower than stock, geomean, worst."""
        return (not self.bit_identical, self.worst < 1.0, -self.geomean, -self.worst)


def score(bench: dict, failures: dict[str, set[str]]) -> list[Score]:
    """Scores from a bench report's JSON dict and, per candidate, the dtypes that failed validation."""
    speedups: dict[tuple[str, str], list[float]] = {}
    for r in bench["results"]:
        if not r["dispatched"]:
            continue
        dtype = r["point"]["dtype"]
        for name, timing in r["variants"].items():
            if name != bench["baseline"]:
                speedups.setdefault((name, dtype), []).append(timing["speedup"])
    return [
        Score(name, dtype, tuple(sp), dtype not in failures.get(name, set()))
        for (name, dtype), sp in sorted(speedups.items())
    ]


def choose(scores: Iterable[Score]) -> dict[str, list[Score]]:
    """Per dtype, the candidates ranked best first."""
    ranked: dict[str, list[Score]] = {}
    for s in scores:
        ranked.setdefault(s.dtype, []).append(s)
    return {d: sorted(v, key=Score.key) for d, v in ranked.items()}


def combine(ranked: dict[str, list[Score]], configs: dict[str, PatchConfig]) -> tuple[PatchConfig, dict[str, str]]:
    """One configuration from the per-dtype winners, and which candidate each dtype got.

    Base settings come from the bf16 winner; fp16 gets its own table unless it won
    with the same settings. If the fp16 winner would clash with the base on the
    helper's align/hint, the next fp16 candidate that does not is taken.
    """
    from .config import OVERRIDABLE
    from .errors import UsageError

    picked: dict[str, str] = {}
    # Only a candidate that validated bit-identical may be written; a dtype with none is off.
    identical = {d: [s for s in v if s.bit_identical] for d, v in ranked.items()}
    overrides: dict[str, Any] = {"fp32": "none", "bf16": "none", "fp16": "none"}
    if identical.get("bf16"):
        base_name = identical["bf16"][0].name
    else:
        base_name = next(iter(configs))
        if "bf16" in ranked:
            overrides["bf16"] = "off"
    picked["bf16"] = base_name if overrides["bf16"] != "off" else "off"
    base = configs[base_name]
    # The candidates carry no rules; leaving "rules" out keeps the default per-instantiation
    # rules (the "off" ones that keep stock's code generation), which tune does not measure.
    plain = {k: v for k, v in base.to_toml_dict().items() if k != "rules"}
    for s in identical.get("fp16", []):
        cand = configs[s.name]
        settings = {k: getattr(cand, k) for k in OVERRIDABLE if getattr(cand, k) != getattr(base, k)}
        options = plain | overrides
        options["fp16"] = ",".join(f"{k}={'auto' if v is None else v}" for k, v in settings.items()) or "none"
        try:
            cfg = make_config(**options)
        except UsageError:
            continue
        picked["fp16"] = s.name
        return cfg, picked
    if "fp16" in ranked:
        overrides["fp16"] = "off"
        picked["fp16"] = "off"
    return make_config(**(plain | overrides)), picked


@dataclass
class TuneReport:
    config: PatchConfig
    picked: dict[str, str]
    ranked: dict[str, list[Score]]
    failures: dict[str, set[str]]
    bench: dict = field(repr=False, default_factory=dict)
    tree: str | None = None  # the tree tuned (for the next command)

    def to_json(self) -> dict:
        return {
            "config": self.config.to_toml_dict(),
            "marker": self.config.marker(),
            "picked": self.picked,
            "validation_failures": {k: sorted(v) for k, v in self.failures.items()},
            "ranking": {
                d: [
                    {"name": s.name, "bit_identical": s.bit_identical, "worst": s.worst, "geomean": s.geomean}
                    for s in v
                ]
                for d, v in self.ranked.items()
            },
            "bench": self.bench,
        }


def run_tune(libs: dict, configs: dict[str, PatchConfig], *, quick: bool, reps: int, rounds: int,
             progress=None, variant_info: dict | None = None) -> TuneReport:  # fmt: skip
    """Validate, bench on the tuning set and choose, on a GPU; ``libs`` holds 'stock' and
    one library per candidate (``quick``: the tuning set's batch 1/64 x context 1k/16k)."""
    from .gpu import bench as Bn
    from .gpu import points as P
    from .gpu import validate as V

    report = V.run_validate(libs, V.quick_matrix(), seed=0)
    failures: dict[str, set[str]] = {}
    for line in report.failures:
        name, _, rest = line.partition(":")
        dtype = rest.split("q=", 1)[1].split()[0] if "q=" in rest else "?"
        failures.setdefault(name.strip(), set()).add(dtype)
    points = P.point_set("tuning")
    if quick:
        points = [p for p in points if p.batch in (1, 64) and p.context in (1024, 16384)]
    bench = Bn.run_bench(libs, points, reps=reps, rounds=rounds, variant_info=variant_info,
                         point_set_name="tuning", progress=progress)
    data = bench.to_dict()
    ranked = choose(score(data, failures))
    config, picked = combine(ranked, configs)
    return TuneReport(config, picked, ranked, failures, data)
