"""What ``kvpatch bench-decode`` and the weight-prefetch sweep print: plain text (the decode
report's text is also written to a file with ``--text`` and diffed between runs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from ..decode.report import DecodeReport

MiB = 1 << 20


def decode_text(report: DecodeReport | dict[str, Any]) -> str:
    """A decode-step report as plain text (what ``bench-decode`` prints and ``--text`` writes):
    the machine, the arms, one line per point (speedups over stock, median [min..max] over
    rounds), the controls per point (A/A, the guard), the summary."""
    from ..decode.report import DecodeReport, env_facts

    if isinstance(report, dict):
        report = DecodeReport.from_dict(report)
    e = env_facts(report.env)
    head = [
        f"kvpatch bench-decode: {e['gpu']} (cc {e['capability']}, {e['sm_count']} SMs, "
        f"L2 {e['l2_bytes'] / MiB:.0f} MiB), {report.mode} L2, {report.layers} layers, {report.rounds} rounds",
        f"torch {e['torch']} CUDA {e['torch_cuda']}, {e['nvcc']}, driver {e['driver']}, "
        f"clocks SM {e['sm_mhz']}/{e['max_sm_mhz']} MHz mem {e['mem_mhz']} MHz, power limit {e['power_limit']} W",
        f"prefetch library: {e['prefetch_config']}; evict_last guard: {report.guard}",
    ]
    for a in report.arms or []:
        what = "plain step" if not a.get("weight_prefetch") and not a.get("tail") else ""
        if a.get("weight_prefetch"):
            what = ("zero-byte twin of " if a.get("zero") else "") + a["weight_prefetch"]["label"]
        if a.get("tail"):
            what = f"in-kernel: {a['tail']['text']}"
        head.append(f"  {a['name']}: library {a['library']}, {what}")
    head.append("speedup over stock = median [min..max] of per-round ratios; aa = stock-aa's ratio; "
                "guard = MiB demoted before every launch")  # fmt: skip
    names = [n for n in report.variants[1:]]
    cols = (
        ["model", "dtype", "B", "ctx", "kern", "stock us", "tok/s"]
        + [f"{n} x" for n in names]
        + ["attn", "guard", "same"]
    )
    rows = []
    for p in report.points:
        v = p["variants"]
        row = [p["model"], p["dtype"], str(p["batch"]), str(p["context"]), p["kernel"],
               f"{v['stock']['step_us']['median']:.1f}", f"{v['stock']['tokens_per_s']:.0f}"]  # fmt: skip
        row += [_interval(v[n]["speedup"]) if n in v else "-" for n in names]
        share = v["stock"].get("attention_share")
        guard = p.get("guard") or {}
        row += [f"{100 * share:.0f}%" if share is not None else "-",
                f"{guard.get('demoted_bytes', 0) / MiB:.0f}" if guard.get("on") else "off",
                "yes" if p["all_identical"] else "NO"]  # fmt: skip
        rows.append(row)
    lines = head + [""] + _table(cols, rows) + [""]
    lines += _decode_summary_lines(report)
    return "\n".join(lines)


def _table(cols: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    return ["  ".join(c.rjust(w) for c, w in zip(cols, widths))] + [
        "  ".join(x.rjust(w) for x, w in zip(r, widths)) for r in rows
    ]


def _interval(s: Mapping[str, float]) -> str:
    return f"{s['median']:.3f} [{s['min']:.3f}..{s['max']:.3f}]"


def _decode_summary_lines(report: DecodeReport) -> list[str]:
    """Per arm geomean / worst / verdict counts (and over its own library, its zero-byte twin),
    the A/A twin, the guard's carry-over, identity, capped rounds, skips."""
    summ = report.summary()
    baseline = {a["name"]: a.get("baseline", "stock") for a in report.arms or []}
    lines = []
    for name in report.variants[1:]:
        s = summ.get(name)
        if not s:
            continue
        line = (f"{name}: geomean {s['geomean']:.4f}x, worst median {s['min']:.4f}x, worst round-min {s['worst_round_min']:.4f}x; "
                f"faster at {s['faster']}, slower at {s['slower']}, within noise at {s['noise']} of {summ['points']} points")  # fmt: skip
        for key, label in (("vs_library", "over its library"), ("vs_zero", "over its zero-byte twin")):
            if s.get(key) and (key == "vs_zero" or baseline.get(name, "stock") != "stock"):
                line += f"; {label} {s[key]['geomean']:.4f}x (worst round-min {s[key]['worst_round_min']:.4f}x)"
        lines.append(line)
    if summ.get("aa"):
        aa = summ["aa"]
        lines.append(
            f"A/A twin: within +-0.3% at {aa['within']} of {aa['of']} points (largest deviation {100 * aa['worst']:.2f}%)"
        )
    if summ.get("carryover_stock"):
        c = summ["carryover_stock"]
        lines.append(f"evict_last carry-over: stock right after a hinted arm / after the others = {c['min']:.4f}..{c['max']:.4f} "
                     "(1.0: nothing carried over)")  # fmt: skip
    lines.append(f"fastest arm per point: {summ['best_variant_counts']}")
    lines.append(
        "bit-identical to stock at every point" if summ["all_identical"] else "OUTPUTS DIFFER FROM STOCK (see 'same')"
    )
    capped = sum(p.get("power_capped_rounds", 0) for p in report.points)
    if capped:
        lines.append(f"{capped} rounds ran power- or thermally capped (clocks in the JSON)")
    late = sum((p.get("timer") or {}).get("host_bound", 0) for p in report.points)
    if late:
        lines.append(f"{late} chunks of launches were queued late by the host on every attempt (timer in the JSON)")
    for s in report.skipped:
        lines.append(f"skipped {s['model']} {s['dtype']} B={s['batch']} ctx={s['context']}: {s['reason']}")
    return lines


def micro_table(micro: Mapping[str, Any]) -> str:
    """Plain text table of :func:`run_micro_gemm`'s results."""
    head = f"{'gemm':<28} {'m':>3} {'weight MiB':>10} {'pf MiB':>7} {'cold us':>8} {'prefetched':>10} {'warm us':>8} {'speedup':>7}"
    hint = f", hint {micro.get('hint') or 'default'}" + (", demoted between trials" if micro.get("demoted") else "")
    lines = [
        f"GEMM after a {micro['idle_us']:.0f} us HBM-idle kernel, L2 flushed, {micro['dtype']}{hint}, median of {micro['trials']}",
        head,
    ]
    for r in micro["results"]:
        lines.append(
            f"{r['gemm']:<28} {r['m']:>3} {r['weight_bytes'] / MiB:>10.1f} {r['prefetched_bytes'] / MiB:>7.1f} "
            f"{r['cold_us']:>8.1f} {r['prefetched_us']:>10.1f} {r['warm_us']:>8.1f} {r['speedup']:>6.2f}x"
        )
    return "\n".join(lines)


def micro_prefetch_table(micro: Mapping[str, Any]) -> str:
    """Plain text table of :func:`run_micro_prefetch`'s results."""
    lines = [
        f"prefetch kernel alone / landed (prefetch then GEMV on one stream, minus the warm GEMV) / GEMV after a "
        f"{micro['idle_us']:.0f} us idle window; L2 flushed; median of {micro['trials']}; L2 {micro['l2_bytes'] / MiB:.0f} MiB",
        f"{'MiB':>4} {'grid':>4} {'thr':>4} {'chunk':>6} {'hint':>12} {'kernel us':>9} {'issue GB/s':>10} {'fill us':>8} "
        f"{'fill GB/s':>9} {'cold us':>8} {'warm us':>8} {'idle+pf us':>10} {'x':>6}",
    ]
    for r in micro["results"]:
        lines.append(
            f"{r['bytes'] / MiB:>4.0f} {r['grid']:>4} {r['threads'] or 'def':>4} {r['chunk'] or 'def':>6} {r['hint'] or 'def':>12} "
            f"{r['kernel_us']:>9.1f} {r['issue_GBps']:>10.0f} {r['fill_us']:>8.1f} {r['fill_GBps']:>9.0f} "
            f"{r['cold_us']:>8.1f} {r['warm_us']:>8.1f} {r['after_idle_us']:>10.1f} {r['idle_speedup']:>5.2f}x"
        )
    if micro.get("skipped"):
        lines.append(f"{len(micro['skipped'])} configurations skipped (time budget)")
    return "\n".join(lines)


def kernels_table(runs: Sequence[Mapping[str, Any]], best_only: bool = True) -> str:
    """:func:`~kvpatch.decode.kernels.run_window_kernels`'s results: per model, batch and window,
    the next GEMM and the window's kernels without / with the prefetch (each cap and hint, or
    the best one), what the prefetch gave the GEMM and cost the window, and the net."""
    cols = [
        "model",
        "B",
        "window",
        "GEMM",
        "MiB",
        "hint",
        "GEMM off",
        "GEMM on",
        "gave",
        "window off",
        "window on",
        "cost",
        "net",
    ]
    rows = []
    for run in runs:
        results = list(run.get("results", []))
        keys = list(dict.fromkeys((r["batch"], r["window"]) for r in results))
        for b, w in keys:
            rs = [r for r in results if r["batch"] == b and r["window"] == w]
            for r in [max(rs, key=lambda r: r["net_us"])] if best_only else rs:
                rows.append([run["model"], str(b), w, r["target"], f"{r['prefetched_bytes'] / MiB:g}", r["hint"],
                             f"{r['gemm_off_us']:.1f}", f"{r['gemm_on_us']:.1f}", f"{r['gave_us']:+.2f}",
                             f"{r['window_off_us']:.1f}", f"{r['window_on_us']:.1f}", f"{r['cost_us']:+.2f}", f"{r['net_us']:+.2f}"])  # fmt: skip
    title = ("per window, kernel by kernel (us): the next GEMM after the window, and the window's kernels, without / with "
             "its prefetch; gave = GEMM off - on, cost = window on - off" + ("; the best cap and hint per row" if best_only else ""))  # fmt: skip
    return "\n".join([title] + _table(cols, rows))


def stage_table(points: Sequence[Mapping[str, Any]], names: Sequence[str]) -> str:
    """One line per arm: speedup over stock at each point, median [min..max], and the geomean per batch."""
    from ..gpu.stats import geomean

    cols = [f"B{p['batch']}/{p['context'] // 1024}k {p['model'].split('-')[-1]}" for p in points]
    batches = sorted({p["batch"] for p in points})
    head = f"{'arm':<20} " + " ".join(f"{c:>21}" for c in cols) + "".join(f" {'geo B' + str(b):>8}" for b in batches)
    lines = [head]
    for n in names:
        cells = [(_interval(p["variants"][n]["speedup"]) if n in p["variants"] else "-") for p in points]
        geos = []
        for b in batches:
            rs = [p["variants"][n]["speedup"]["median"] for p in points if p["batch"] == b and n in p["variants"]]
            geos.append(f" {geomean(rs):>8.4f}" if rs else f" {'-':>8}")
        lines.append(f"{n:<20} " + " ".join(f"{c:>21}" for c in cells) + "".join(geos))
    same = all(p["all_identical"] for p in points)
    lines.append("bit-identical to stock at every point" if same else "OUTPUTS DIFFER FROM STOCK")
    return "\n".join(lines)


def sweep_text(
    result: Mapping[str, Any], reports: Mapping[str, Any] | None = None, kernels: Sequence[Any] | None = None
) -> str:
    """The weight-prefetch sweep as text: the pick and why, each stage's table, the log.
    ``reports``: ``{stage: decode report dict}`` (decode_<stage>.json); ``kernels``: kernels.json."""
    parts = []
    picked = result.get("picked")
    if picked:
        why = picked.get("why", {})
        lines = [f"picked weight prefetch: {picked['config']['label']}"]
        if why.get("fallback"):
            lines.append(f"  fallback: {why['fallback']}")
        for name, per in (why.get("windows") or {}).items():
            cells = ", ".join(f"B<={b}: {v['geomean']:.4f}x at {v['cap_mib']:g} MiB{' kept' if v['kept'] else ''}"
                              for b, v in per.items() if isinstance(v, dict) and v.get("points"))  # fmt: skip
            lines.append(f"  {name}: {cells or 'not measured'}")
        parts.append("\n".join(lines))
    reports = reports or {}
    for stage in ("final", "lead", "steps", "guard_off"):
        if reports.get(stage):
            title = {"final": "final: the pick with every control", "lead": "lead: the default windows with every control",
                     "steps": "steps: each window alone, and together", "guard_off": "guard off: what the guard prevents"}[stage]  # fmt: skip
            parts.append(f"== {title}\n" + decode_text(reports[stage]))
            if stage == "steps":
                parts.append(stage_table(reports[stage]["points"], reports[stage]["variants"][1:]))
    if kernels:
        parts.append(kernels_table(kernels))
    for micro in (result.get("micro") or {}).values():
        parts.append(micro_table(micro))
    if result.get("errors"):
        parts.append("errors: " + "; ".join(f"{k}: {v}" for k, v in result["errors"].items()))
    parts.append("\n".join(result.get("log", [])))
    return "\n\n".join(parts)


#: The goal a weight-prefetch configuration is measured against (tokens/s geomean over the
#: points, from weight prefetch alone) and its stretch.
GOAL, STRETCH = 1.02, 1.05


def sweep_summary(result: Mapping[str, Any], reports: Mapping[str, Any]) -> str:
    """A few lines: each bench's arms against the goal, the controls, what did not run."""
    from ..decode.report import DecodeReport, env_facts

    e = env_facts(result.get("env") or {})
    done = [
        s
        for s in result.get("stages", [])
        if s not in (result.get("skipped_stages") or []) and s not in (result.get("errors") or {})
    ]
    lines = [f"kvpatch weight-prefetch run on {e['gpu']}: {result.get('seconds', '?')} s; stages done: {', '.join(done) or 'none'}"
             + (f"; skipped: {', '.join(result['skipped_stages'])}" if result.get("skipped_stages") else "")]  # fmt: skip
    for stage in ("final", "lead", "guard_off"):
        data = reports.get(stage)
        if not data:
            continue
        rep = DecodeReport.from_dict(data)
        s = rep.summary()
        cfg = (
            (result.get("picked") or {}).get("config", {}).get("label")
            if stage == "final"
            else (rep.weight_prefetch or {}).get("label")
        )
        lines.append(f"{stage}: {s['points']} points ({cfg or '-'}), bit-identical: {'yes' if s['all_identical'] else 'NO'}"
                     + (f", A/A within +-0.3% at {s['aa']['within']}/{s['aa']['of']} (largest {100 * s['aa']['worst']:.2f}%)" if s.get("aa") else "")
                     + (f", carry-over after evict_last {s['carryover_stock']['min']:.4f}..{s['carryover_stock']['max']:.4f}" if s.get("carryover_stock") else ""))  # fmt: skip
        baseline = {x["name"]: x.get("baseline", "stock") for x in rep.arms or []}
        for name in rep.variants[1:]:
            a = s.get(name)
            if not a or name.endswith("-aa"):
                continue
            line = f"  {name}: geomean {a['geomean']:.4f}x, worst round-min {a['worst_round_min']:.4f}x"
            if a.get("vs_zero"):
                line += f", over its zero-byte twin {a['vs_zero']['geomean']:.4f}x"
            if a.get("vs_library") and baseline.get(name, "stock") != "stock":
                line += f", over {baseline[name]} {a['vs_library']['geomean']:.4f}x"
            if name in ("stock+wpf", "tail") and stage != "guard_off":
                met = a["geomean"] >= GOAL and a["worst_round_min"] > 1.0
                line += f" -> goal {GOAL:.2f}x with every round-min > 1.00: {'met' if met else 'missed'}"
                line += f" (stretch {STRETCH:.2f}x met)" if met and a["geomean"] >= STRETCH else ""
            lines.append(line)
    g = result.get("guard_check")
    if g:
        r = g["ratio"]
        lines.append(f"guard alone ({g['demoted_bytes'] / MiB:.0f} MiB demoted) before stock: plain / after it {r['median']:.4f} "
                     f"[{r['min']:.4f}..{r['max']:.4f}] (1.0: the demote itself moves nothing)")  # fmt: skip
    for stage, err in (result.get("errors") or {}).items():
        lines.append(f"error in {stage}: {err}")
    return "\n".join(lines)
