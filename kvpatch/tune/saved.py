"""Choosing again from saved tune measurements, without a GPU (``kvpatch tune --from``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable, Sequence

from ..config.machine import FIELDS as MACHINE_FACTS
from ..config.machine import Machine
from ..errors import UsageError
from .choose import check_kernel, row_kernel, score
from .grid import candidate_configs
from .report import TuneReport, dump_sets, load_sets
from .run import report_of


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


def saved_machine(data: dict, where: str) -> Machine | None:
    """A saved tune JSON's ``machine``, checked as ``[kvpatch.tuned]`` is (:meth:`Machine.from_dict`:
    a table of known facts, each a string; a one-line UsageError naming ``where`` otherwise);
    None where the run recorded none."""
    raw = data.get("machine")
    return None if raw is None else Machine.from_dict(raw, where)


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
                    owner[row_kernel(row)] = i
        info: dict[str, dict] = {}
        results, failures, exclusions = [], {}, {}
        for i, data in enumerate(runs):
            bench = data["bench"]
            if bench["baseline"] != runs[0]["bench"]["baseline"]:
                raise UsageError("the tune JSONs name different baselines")
            mine = {k for k, j in owner.items() if j == i}
            results += [row for row in bench["results"] if row_kernel(row) in mine]
            for key, acc in (("validation_failures", failures), ("exclusions", exclusions)):
                for name, sels in load_sets(data, key).items():
                    acc.setdefault(name, set()).update(s for s in sels if s in mine)
            for name, vi in bench["variant_info"].items():
                if name in info and str(info[name].get("marker")) != str(vi.get("marker")):
                    raise UsageError(f"candidate {name!r} names different configurations in two tune JSONs")
                info[name] = vi
    except (KeyError, TypeError, AttributeError, ValueError):
        raise UsageError("not a kvpatch tune JSON (no bench data, variant info or validation results)") from None
    machines = [saved_machine(d, f"machine of tune JSON {i + 1}") for i, d in enumerate(runs)]
    machines = [m for m in machines if m is not None]
    seen = {tuple(getattr(m, f) for f in MACHINE_FACTS) for m in machines}
    if len(seen) > 1:
        raise UsageError("the tune JSONs were tuned on different machines (" + " / ".join(
            ", ".join(str(x) for x in fs if x) for fs in sorted(seen, key=str)) + "): tune each machine on its own")  # fmt: skip
    last = runs[-1]
    machine = None
    if machines:
        notes = list(dict.fromkeys(m.note for m in machines if m.note))
        machine = (replace(machines[-1], note=" + ".join(notes)) if notes else machines[-1]).to_dict()
    bench = {**last["bench"], "results": results, "variant_info": info,
             "merged_from": [{"kernels": sorted(k for k, j in owner.items() if j == i),
                              "seconds": d["bench"].get("seconds"), "env": d["bench"].get("env")}
                             for i, d in enumerate(runs)]}  # fmt: skip
    return {
        **last,
        "bench": bench,
        "machine": machine,
        "validation_failures": dump_sets(failures),
        "exclusions": dump_sets(exclusions),
    }


def rechoose(data: dict, *, policy: str = "strict", fallback: str = "off", exclude: Iterable[str] = (),
             machine: Any = None, incumbent: str | None = None) -> TuneReport:  # fmt: skip
    """A :class:`TuneReport` from a saved tune JSON (:meth:`TuneReport.to_json`): the same bench
    data and validation results, chosen again under ``policy``/``fallback``, with the
    ``exclude`` patterns (:func:`parse_exclusions`) ruled out -- e.g. what ``validate --upstream``
    or the held-out set found on a kernel after tune ran. An excluded candidate is never picked
    and keeps its measured bit-identity; the report's ``exclusions`` (with those the saved JSON
    already had) record it apart from the validation failures. ``incumbent``: a candidate of the
    data that each kernel keeps unless another beats it (:func:`~kvpatch.tune.choose`)."""
    import fnmatch

    try:
        bench = data["bench"]
        failures = load_sets(data, "validation_failures")
        exclusions = load_sets(data, "exclusions")
        configs = candidate_configs(bench["variant_info"], bench["baseline"])
    except (KeyError, TypeError, AttributeError, ValueError):
        raise UsageError("not a kvpatch tune JSON (no bench data, variant info or validation results)") from None
    if not configs:
        raise UsageError("the tune JSON holds no candidates")
    for key, sets in (("validation_failures", failures), ("exclusions", exclusions)):
        for name, selectors in sets.items():
            if name not in configs and name != bench["baseline"]:
                raise UsageError(f"the tune JSON's {key} name {name!r}, which is no candidate of its bench")
            for sel in selectors:
                try:
                    check_kernel(sel)
                except ValueError:
                    raise UsageError(f"the tune JSON's {key} list {sel!r} for {name!r}: no one kernel") from None
    try:
        scores = score(bench, failures)
    except (KeyError, TypeError, AttributeError, ValueError):
        raise UsageError("the tune JSON's bench results are not what kvpatch tune writes") from None
    if not scores:
        raise UsageError("the tune JSON's bench holds no measured candidate kernel: nothing to choose from")
    unknown = sorted({s.name for s in scores} - set(configs))
    if unknown:
        raise UsageError(f"the tune JSON measured {', '.join(map(repr, unknown))} but has no configuration for it")
    if incumbent is not None and incumbent not in {s.name for s in scores}:
        raise UsageError(f"--incumbent {incumbent!r} is not a candidate the tune JSON measured "
                         f"({', '.join(sorted({s.name for s in scores}))})")  # fmt: skip
    for cand, sel in parse_exclusions(exclude):
        hits = {
            i
            for i, s in enumerate(scores)
            if fnmatch.fnmatchcase(s.name, cand) and fnmatch.fnmatchcase(s.selector, sel)
        }
        if not hits:
            raise UsageError(f"--exclude {cand}@{sel} matches no candidate and kernel of the tune data (a kernel is "
                             "named in full, dtype/head/block/cache/kernel, e.g. bf16/128/16/auto/v1; '*' matches "
                             "any part)")  # fmt: skip
        for i in hits:
            exclusions.setdefault(scores[i].name, set()).add(scores[i].selector)
    scores = [replace(s, excluded=True) if s.selector in exclusions.get(s.name, ()) else s for s in scores]
    return report_of(scores, configs, failures, bench, policy=policy, fallback=fallback, machine=machine,
                     exclusions=exclusions, incumbent=incumbent)  # fmt: skip
