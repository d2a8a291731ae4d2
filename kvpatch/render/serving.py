"""``kvpatch plugin bench``'s report as plain text: what ran, then one table per metric."""

from __future__ import annotations

from typing import Any

#: metric -> (heading, unit format)
_TABLES = {
    "decode_ms": ("decode step, ms (median over engine starts, min-max)", "{:.2f}"),
    "latency_s": ("whole batch, request latency, s", "{:.2f}"),
    "tokens_per_s": ("output tokens per second", "{:.0f}"),
}


def _value(d: dict[str, Any], fmt: str) -> str:
    if not d.get("n"):
        return "-"
    return f"{fmt.format(d['median'])} ({fmt.format(d['min'])}-{fmt.format(d['max'])})"


def _ratio(d: dict[str, Any]) -> str:
    if not d or not d.get("n"):
        return "-"
    return f"{d['median']:.3f} ({d['lo']:.3f}-{d['hi']:.3f})"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def serving_lines(report: dict[str, Any]) -> list[str]:
    env = report.get("environment") or {}
    engine = report.get("engine") or {}
    where = ", ".join(x for x in (f"vLLM {env.get('vllm')}" if env.get("vllm") else "", env.get("gpu", ""),
                                  f"torch {env['torch']}" if env.get("torch") else "") if x)  # fmt: skip
    weights = "dummy weights" if engine.get("dummy_weights") else "its weights"
    lines = [
        (
            f"vLLM serving, {report['model']} ({weights}), {report['dtype']}, V0 engine with the XFORMERS backend, "
            f"CUDA graphs; {where}"
        ),
        (
            f"engine starts: {report['engine_starts']} of {report['planned']} ({report['starts_per_arm']} per arm, arms "
            "alternated)" + ("" if report["complete"] else "  INCOMPLETE: run again with the same --raw to go on")
        ),
    ]
    for name, arm in report["arms"].items():
        logged = "/".join(arm["kernels_logged"]) or "nothing"
        start = arm["engine_start_s"]
        up = f"; engine up in {start['median']:.0f} s" if start.get("n") else ""
        counts = [n for n in arm.get("grouped_launches", []) if n is not None]
        grouped = (f"; grouped form launched {min(counts)}-{max(counts)} times a start (CUDA graph captures)"
                   if counts else "")  # fmt: skip
        bundle = f" (the bundle at {arm['bundle']})" if arm.get("bundle") else ""
        lines.append(
            f"  {name}: {arm['starts']} starts, {arm['kernels']}'s kernels{bundle} needed, the plugin logged "
            f"{logged}{up}" + grouped
        )
    arms = list(report["arms"])
    others = [name for name, arm in report["arms"].items() if arm.get("bundle")]  # --bundle's arms
    for metric, (heading, fmt) in _TABLES.items():
        lines += ["", heading]
        rows = [["workload", *arms, "speedup", *(f"{o} speedup" for o in others),
                 *(f"{o}/kvpatch" for o in others), "A/A"]]  # fmt: skip
        for w in report["workloads"]:
            theirs = [w["others"][o][k].get(metric, {}) for k in ("speedup", "over_kvpatch") for o in others]
            rows.append([w["workload"], *(_value(w["arms"][a][metric], fmt) for a in arms),
                         _ratio(w["speedup"].get(metric, {})), *map(_ratio, theirs),
                         _ratio(w["aa"].get(metric, {}))])  # fmt: skip
        lines += _table(rows)
    lines += [
        "",
        (
            "speedup: vLLM's kernels over kvpatch's (above 1: kvpatch faster), median and the range of the per-round "
            "ratios; A/A: vLLM's kernels over the same kernels in another engine start (identical code: the noise)."
        ),
    ]
    if others:
        lines.append("NAME speedup: vLLM's kernels over that bundle's; NAME/kvpatch: the enabled bundle's kernels "
                     "over that bundle's (above 1: that bundle faster), each from the same rounds.")  # fmt: skip
    if report.get("raw"):
        lines.append(f"engine runs and logs: {report['raw']}")
    return lines
