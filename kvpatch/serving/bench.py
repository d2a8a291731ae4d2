"""The serving benchmark's run: the schedule of engine starts, each run and checked, kept in
one folder, resumable, under an optional time budget.

The folder holds one ``<slot>.json`` per engine start that counted (and every start's
``.log``). Run again on the same folder with the same settings and only the missing
starts run: a run cut short (an interrupt, a budget, a machine taken back) loses at most
the engine start in flight. A folder holding runs of other settings is refused.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import BuildError, GpuCheckError, UsageError
from ..fsutil.files import write_atomic
from ..fsutil.reading import parse_json, read_regular
from ..gpu.stats import median
from ..progress import QUIET, Progress
from .engine import Worker, run_slot
from .options import ServingOptions
from .report import build_report
from .schedule import Slot, pending, schedule

MANIFEST = "bench.json"
#: The most a file of a --raw folder may hold (a run's record is kilobytes); a larger one, or one
#: that is no regular file (a FIFO there blocked the resume forever), counts as damaged.
RAW_LIMIT = 64 << 20
DEFAULT_WORKER = Worker()


def saved_runs(options: ServingOptions, folder: Path, slots: list[Slot]) -> dict[str, dict[str, Any]]:
    """The counted runs already in ``folder`` for ``slots``; UsageError when the folder holds
    another benchmark's."""
    ours = fingerprints(options, _spec_models(folder))
    manifest = folder / MANIFEST
    if manifest.exists():
        try:
            theirs = parse_json(read_regular(manifest, limit=RAW_LIMIT)).get("fingerprint")
        except (OSError, ValueError, AttributeError):
            theirs = None
        if theirs not in ours:
            raise UsageError(f"{folder} holds the engine runs of another benchmark (other model, dtype, workloads or "
                             "arms): give another --raw folder, or the settings it was made with")  # fmt: skip
    out = {}
    for s in slots:
        p = folder / f"{s.name}.json"
        if not p.exists():
            continue
        try:
            rec = parse_json(read_regular(p, limit=RAW_LIMIT))
        except (OSError, ValueError):
            continue  # damaged: run it again
        if isinstance(rec, dict) and rec.get("fingerprint") in ours and not rec.get("problems"):
            out[s.name] = rec
    return out


def fingerprints(options: ServingOptions, models: Iterable[str]) -> set[str]:
    """The fingerprints runs of these settings may carry: this kvpatch's, and the ones a kvpatch
    before :meth:`ServingOptions.fingerprint` named a shipped shape wrote, which hashed the
    model's path (``models``: the paths the runs' own ``<slot>.spec.json`` recorded; only with
    the same settings otherwise do they match)."""
    return {options.fingerprint(), *(options.fingerprint(model=m) for m in models)}


def _spec_models(folder: Path) -> set[str]:
    """The model paths the engine starts in ``folder`` were given (their ``<slot>.spec.json``)."""
    paths = set()
    for spec in folder.glob("*.spec.json"):
        try:
            model = parse_json(read_regular(spec, limit=RAW_LIMIT)).get("model")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(model, str):
            paths.add(model)
    return paths


def run_bench(options: ServingOptions, folder: Path, *, worker: Worker = DEFAULT_WORKER, progress: Progress = QUIET,
              budget_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:  # fmt: skip
    """Every engine start of the schedule not yet in ``folder``, then the report over all of
    them. Stops early, leaving the report incomplete, when the next start would likely end
    past ``budget_s``. A start that fails or does not count stops the run: BuildError when the
    engine failed, GpuCheckError when it ran but not what its arm needs."""
    folder.mkdir(parents=True, exist_ok=True)
    slots = schedule(options.arms, options.starts)
    done = saved_runs(options, folder, slots)
    write_atomic(folder / MANIFEST, json.dumps({"fingerprint": options.fingerprint(), "spec": options.engine_spec(),
                                                "arms": [a.name for a in options.arms]}, indent=1) + "\n")  # fmt: skip
    todo = pending(slots, done)
    if done:
        progress.say(f"{len(done)} of {len(slots)} engine starts already in {folder}; running the other {len(todo)}")
    t0, took = clock(), []
    for slot in todo:
        if budget_s is not None and took and clock() - t0 + median(took) > budget_s:
            progress.say(f"stopping: another engine start would end past the {budget_s:.0f} s budget "
                         f"({len(done)} of {len(slots)} done; run again with the same --raw to go on)")  # fmt: skip
            break
        progress.say(f"engine start {len(done) + 1} of {len(slots)}: {slot.arm.name}, round {slot.round + 1}")
        record = run_slot(slot, options, folder, worker=worker, progress=progress, clock=clock)
        took.append(record["seconds"])
        if record["problems"]:
            error = GpuCheckError if record["result"] is not None else BuildError
            raise error(f"engine start {slot.name}: {record['problems'][0]} (log: {folder / (slot.name + '.log')})")
        done[slot.name] = record
    records = [done[s.name] for s in slots if s.name in done]
    report = build_report(options, records, planned=len(slots))
    report["raw"] = str(folder)
    return report
