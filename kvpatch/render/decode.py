"""What ``kvpatch bench-decode`` and the weight-prefetch sweep print: plain text (the decode
report's text is also written to a file with ``--text`` and diffed between runs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from ..decode.report import DecodeReport

MiB = 1 << 20


def decode_text(report: DecodeReport | dict[str, Any]) -> str:
    """A decode-step report as plain text (what ``bench-decode`` prints and ``--text`` writes):
    the machine, one line per point (speedups median [min..max] over rounds), the summary."""
    from ..decode.report import DecodeReport, env_facts

    if isinstance(report, dict):
        report = DecodeReport.from_dict(report)
    e = env_facts(report.env)
    head = [
        f"kvpatch bench-decode: {e['gpu']} (cc {e['capability']}, {e['sm_count']} SMs, "
        f"L2 {e['l2_bytes'] / MiB:.0f} MiB), {report.mode} L2, {report.layers} layers, {report.rounds} rounds",
        f"torch {e['torch']} CUDA {e['torch_cuda']}, {e['nvcc']}, driver {e['driver']}, "
        f"clocks SM {e['sm_mhz']}/{e['max_sm_mhz']} MHz mem {e['mem_mhz']} MHz, "
        f"power limit {e['power_limit']} W",
        f"weight prefetch: {e['prefetch_config']}, priority {report.priority}, "
        f"cap per layer window: {_decode_caps_text(report.caps_bytes)}"
        + (f"; configuration {report.weight_prefetch.get('label')}" if report.weight_prefetch else ""),
        "speedup over stock = median [min..max] of per-round ratios; attn = attention's share of stock's step",
    ]
    cols = ["model", "dtype", "B", "ctx", "kern", "stock us", "tok/s"] + [f"{n} x" for n in report.variants[1:]]
    cols += ["attn", "cap MiB", "same"]
    rows = []
    for p in report.points:
        v = p["variants"]
        row = [p["model"], p["dtype"], str(p["batch"]), str(p["context"]), p["kernel"],
               f"{v['stock']['step_us']['median']:.1f}", f"{v['stock']['tokens_per_s']:.0f}"]  # fmt: skip
        row += [_interval(v[n]["speedup"]) for n in report.variants[1:]]
        row += [f"{100 * v['stock']['attention_share']:.0f}%", f"{p['cap_bytes'] / MiB:.0f}",
                "yes" if p["all_identical"] else "NO"]  # fmt: skip
        rows.append(row)
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    lines = head + ["", "  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(x.rjust(w) for x, w in zip(r, widths)) for r in rows]
    lines.append("")
    lines += _decode_summary_lines(report)
    return "\n".join(lines)


def _interval(s: dict[str, float]) -> str:
    return f"{s['median']:.3f} [{s['min']:.3f}..{s['max']:.3f}]"


def _decode_summary_lines(report: DecodeReport) -> list[str]:
    """Per variant geomean / worst / faster-slower-noise counts, identity, capped rounds, skips."""
    summ = report.summary()
    lines = []
    for name in report.variants[1:]:
        s = summ.get(name)
        if s:
            lines.append(f"{name}: geomean {s['geomean']:.3f}x, worst {s['min']:.3f}x; faster at {s['faster']}, "
                         f"slower at {s['slower']}, within noise at {s['noise']} of {summ['points']} points")  # fmt: skip
    lines.append(f"fastest variant per point: {summ['best_variant_counts']}")
    lines.append("bit-identical to stock at every point" if summ["all_identical"] else "OUTPUTS DIFFER FROM STOCK (see 'same')")
    capped = sum(p.get("power_capped_rounds", 0) for p in report.points)
    if capped:
        lines.append(f"{capped} rounds ran power- or thermally capped (clocks in the JSON)")
    for s in report.skipped:
        lines.append(f"skipped {s['model']} {s['dtype']} B={s['batch']} ctx={s['context']}: {s['reason']}")
    return lines


def _decode_caps_text(caps: int | dict[str, int]) -> str:
    if isinstance(caps, int):
        return "off" if caps == 0 else f"{caps / MiB:g} MiB at every batch"
    items = sorted((int(b), c) for b, c in caps.items())
    return ", ".join(f"B<={b}: {c / MiB:g} MiB" for b, c in items) + f", off above B={items[-1][0]}" if items else "off"


def micro_table(micro: Mapping[str, Any]) -> str:
    """Plain text table of :func:`run_micro_gemm`'s results."""
    head = f"{'gemm':<28} {'m':>3} {'weight MiB':>10} {'pf MiB':>7} {'cold us':>8} {'prefetched':>10} {'warm us':>8} {'speedup':>7}"
    lines = [f"GEMM after a {micro['idle_us']:.0f} us HBM-idle kernel, L2 flushed, {micro['dtype']}, median of {micro['trials']}", head]
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


def stage_table(points: Sequence[Mapping[str, Any]], names: Sequence[str]) -> str:
    """One line per variant: speedup over the same library without prefetch at each point, median [min..max]."""
    from ..decode.sweep import score

    cols = [f"B{p['batch']}/{p['context'] // 1024}k" for p in points]
    lines = [f"{'variant':<28} " + " ".join(f"{c:>21}" for c in cols) + f" {'geo B1-4':>8} {'geo B8':>7}"]
    for n in names:
        cells = []
        for p in points:
            r = p["variants"][n].get("speedup_vs_library")
            cells.append(f"{r['median']:.3f} [{r['min']:.3f}..{r['max']:.3f}]" if r else "-")
        lines.append(f"{n:<28} " + " ".join(f"{c:>21}" for c in cells) + f" {score(points, [n], (1, 4)):>8.3f} {score(points, [n], (8,)):>7.3f}")
    same = all(p["all_identical"] for p in points)
    lines.append("bit-identical to stock at every point" if same else "OUTPUTS DIFFER FROM STOCK")
    return "\n".join(lines)


def sweep_text(result: Mapping[str, Any]) -> str:
    """The weight-prefetch sweep's ``sweep.json`` as text: the pick, each stage, the final benches, the log."""
    from ..decode.options import caps_text

    parts = []
    picked = result.get("picked")
    if picked:
        cfg, why = picked["config"], picked.get("caps_why", {})
        knobs = (result.get("knobs") or {}).get("chosen")
        caps = {int(b): c for b, c in cfg["caps"].items()} if isinstance(cfg["caps"], dict) else cfg["caps"]
        lines = [f"picked weight prefetch: {cfg['label']}  (caps per batch bucket in MiB: {caps_text(caps)})",
                 f"knobs chosen from: {knobs}"]  # fmt: skip
        lines += [f"  B<={b}: {w.get('cap_mib')} MiB ({w.get('reason')}; geomean {w.get('geomean', float('nan')):.4f}, "
                  f"worst round-max {w.get('worst_max', float('nan')):.4f})" for b, w in why.items() if isinstance(w, dict)]  # fmt: skip
        parts.append("\n".join(lines))
    if result.get("micro_prefetch"):
        parts.append(micro_prefetch_table(result["micro_prefetch"]))
    if result.get("micro_gemm"):
        parts.append(micro_table(result["micro_gemm"]))
    for stage, title in (("stage1", "stage 1: step speedup with vs without the weight prefetch (same attention library)"),
                         ("stage2", "stage 2: caps with the picked knobs")):  # fmt: skip
        st = result.get(stage) or {}
        if st.get("points"):
            parts.append(title + "\n" + stage_table(st["points"], st.get("variants", [])))
    for final in (result.get("final") or {}).values():
        if final.get("report"):
            parts.append(decode_text(final["report"]))
    parts.append("\n".join(result.get("log", [])))
    return "\n\n".join(parts)
