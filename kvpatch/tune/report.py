"""What ``kvpatch tune`` reports: the configuration, the picks and the measurements (its JSON
is what ``tune --from`` chooses again from)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config import PatchConfig
from .choose import Pick, Score, Versus, versus


@dataclass
class TuneReport:
    config: PatchConfig
    picks: dict[str, Pick]
    policy: str
    failures: dict[str, set[str]]
    #: the machine it ran on (kvpatch.config.Machine)
    machine: Any = None
    #: the configuration each other policy would have written (marker text)
    alternatives: dict[str, str] = field(default_factory=dict)
    bench: dict = field(repr=False, default_factory=dict)
    tree: str | None = None  # the tree tuned (for the next command)
    #: candidate name -> the kernels ``--exclude`` ruled it out of (kept apart from ``failures``:
    #: an excluded candidate was bit-identical, and reads so when its JSON is chosen from again)
    exclusions: dict[str, set[str]] = field(default_factory=dict)
    #: the candidate each kernel kept unless another beat it (:func:`~kvpatch.tune.choose`), if any
    incumbent: str | None = None

    @property
    def picked(self) -> dict[str, str]:
        return {inst: p.name for inst, p in self.picks.items()}

    def versus_incumbent(self, inst: str, s: Score) -> Versus | None:
        """``s`` against the incumbent on kernel ``inst`` (None: no incumbent measured there, or ``s`` is it)."""
        held = next((x for x in self.picks[inst].ranked if x.name == self.incumbent), None)
        return None if held is None or s is held else versus(s, held)

    def to_json(self) -> dict:
        return {
            "config": self.config.to_toml_dict(),
            "marker": self.config.marker(),
            "policy": self.policy,
            "incumbent": self.incumbent,
            "picked": self.picked,
            "alternatives": self.alternatives,
            "machine": self.machine.to_dict() if self.machine is not None else None,
            "validation_failures": {k: sorted(v) for k, v in sorted(self.failures.items())},
            "exclusions": dump_sets(self.exclusions),
            "ranking": {
                inst: [
                    {
                        "name": s.name,
                        "bit_identical": s.bit_identical,
                        "excluded": s.excluded,
                        "slower": s.slower,
                        "slower_stock_code": s.slower_stock_code,
                        "worst": s.worst,
                        "geomean": s.geomean,
                        "geomean_interval": list(s.geomean_interval),
                        "qualifies": s.qualifies(self.policy),
                        **_versus_json(self.versus_incumbent(inst, s)),
                    }
                    for s in p.ranked
                ]
                for inst, p in self.picks.items()
            },  # fmt: skip
            "bench": self.bench,
        }


def _versus_json(v: Versus | None) -> dict:
    """A ranking entry's comparison with the incumbent (nothing where there is none)."""
    if v is None:
        return {}
    return {"versus_incumbent": {"slower": v.slower, "slower_same_code": v.slower_same_code, "geomean": v.geomean,
                                 "geomean_interval": list(v.geomean_interval), "beats": v.beats}}  # fmt: skip


def load_sets(data: dict, key: str) -> dict[str, set[str]]:
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


def dump_sets(sets: dict[str, set[str]]) -> dict[str, list[str]]:
    """What :func:`load_sets` reads: names and selectors sorted, empty sets left out."""
    return {k: sorted(v) for k, v in sorted(sets.items()) if v}
