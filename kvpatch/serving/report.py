"""The serving report: engine runs -> per workload, per arm, and the ratios between arms.

Each engine start gives one value per workload and metric (its decode step time is
already the median of that engine's steps). Across starts an arm's value is the median,
with its min..max. A ratio is the baseline's median over the variant's (above 1.00: the
variant is faster), with an interval from the rounds: in each round the two arms ran next
to each other, and the interval is the min..max of the per-round ratios
(:func:`kvpatch.gpu.stats.speedup_interval`, the one rule). Two ratios are reported:
vLLM's kernels over kvpatch's (the speedup), and vLLM's kernels over the same kernels
started again (the A/A twin: what identical code reads, i.e. the noise). An arm of another
bundle (``--bundle``) gets two more, under ``others``: vLLM's kernels over its kernels, and
the enabled bundle's over its (above 1.00: the other bundle serves faster).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

from ..gpu.stats import median, speedup_interval, verdict
from .options import KVPATCH, VLLM, VLLM_TWIN, ServingOptions, Workload

#: metric -> (the worker's key, whether larger is better)
METRICS = {"decode_ms": ("decode_ms", False), "latency_s": ("latency_s", False), "tokens_per_s": ("tokens_per_s", True)}


def _values(records: Iterable[dict[str, Any]], arm: str, w: Workload, key: str) -> dict[int, float]:
    """round -> the arm's value of ``key`` for ``w`` (one engine start a round)."""
    out = {}
    for r in records:
        if r["arm"]["name"] != arm:
            continue
        for row in r["result"]["workloads"]:
            if (row["input_len"], row["output_len"], row["batch"]) == (w.input_len, w.output_len, w.batch):
                out[r["round"]] = float(row[key])
    return out


def _spread(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    m = median(values)
    return {"n": len(values), "median": m, "min": min(values), "max": max(values),
            "spread": (max(values) - min(values)) / m if m else math.nan, "values": list(values)}  # fmt: skip


def _ratio(base: dict[int, float], var: dict[int, float], higher_better: bool) -> dict[str, Any]:
    """base over var for times (var over base for rates): > 1 means var is faster."""
    rounds = sorted(set(base) & set(var))
    if not rounds:
        return {"n": 0}
    b = [[base[r]] for r in rounds]
    v = [[var[r]] for r in rounds]
    if higher_better:
        b, v = v, b
    lo, hi = speedup_interval(b, v)
    mid = median([x[0] for x in b]) / median([x[0] for x in v])
    return {"n": len(rounds), "median": mid, "lo": lo, "hi": hi, "verdict": verdict(lo, hi)}


def build_report(options: ServingOptions, records: Sequence[dict[str, Any]], *, planned: int) -> dict[str, Any]:
    """The report of the counted ``records`` of one run (``planned``: the engine starts asked for)."""
    arms = [a.name for a in options.arms]
    others = [a.name for a in options.arms if a.bundle is not None]  # --bundle's arms
    rows = []
    for w in options.workloads:
        row: dict[str, Any] = {"workload": w.label, "input_len": w.input_len, "output_len": w.output_len,
                               "batch": w.batch, "arms": {}, "speedup": {}, "aa": {}}  # fmt: skip
        if others:
            row["others"] = {name: {"speedup": {}, "over_kvpatch": {}} for name in others}
        for metric, (key, higher) in METRICS.items():
            per = {a: _values(records, a, w, key) for a in arms}
            for a in arms:
                row["arms"].setdefault(a, {})[metric] = _spread([per[a][r] for r in sorted(per[a])])
            if KVPATCH.name in per and VLLM.name in per:
                row["speedup"][metric] = _ratio(per[VLLM.name], per[KVPATCH.name], higher)
            if VLLM.name in per and VLLM_TWIN.name in per:
                row["aa"][metric] = _ratio(per[VLLM.name], per[VLLM_TWIN.name], higher)
            for name in others:
                if VLLM.name in per:
                    row["others"][name]["speedup"][metric] = _ratio(per[VLLM.name], per[name], higher)
                if KVPATCH.name in per:
                    row["others"][name]["over_kvpatch"][metric] = _ratio(per[KVPATCH.name], per[name], higher)
        rows.append(row)
    by_arm: dict[str, Any] = {}
    for a in options.arms:
        mine = [r for r in records if r["arm"]["name"] == a.name]
        lines = sorted({(r["result"].get("plugin") or {}).get("line", "") for r in mine} - {""})
        by_arm[a.name] = {
            "kernels": a.kernels, "starts": len(mine),
            **({"bundle": a.bundle, "bundle_id": a.bundle_id} if a.bundle is not None else {}),
            "kernels_logged": sorted({k for r in mine for k in r["kernels_logged"]}),
            "plugin_lines": lines,
            "engine_start_s": _spread([r["result"]["engine_start_s"] for r in mine]),
            # per start, the grouped form's launches (None: a library without the form, or not said)
            "grouped_launches": [(r["result"].get("plugin_after") or {}).get("grouped_launches") for r in mine],
        }  # fmt: skip
    env = next((r["result"].get("environment") for r in records if r["result"].get("environment")), {})
    return {
        "model": options.model_label, "dtype": options.dtype, "fingerprint": options.fingerprint(),
        "starts_per_arm": options.starts, "engine_starts": len(records), "planned": planned,
        "complete": len(records) == planned, "arms": by_arm, "workloads": rows, "environment": env,
        "engine": {k: v for k, v in options.engine_spec().items() if k != "workloads"},
    }  # fmt: skip
