"""Draw a bench report: speedup over stock of the kernel vLLM dispatches, per point.

One panel per dtype x mode (warm / cold), one series per variant, error bars from
the speedup interval the report carries (min..max over rounds), a 1.0 line; points
whose whole interval lies below 1.00 are drawn hollow and red-edged. Works from a :class:`BenchReport`
or from its JSON (``to_dict()`` or a file written by ``--json``), so an old run can
be redrawn. matplotlib (Agg) is imported inside :func:`plot_bench` only.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..errors import UsageError

#: What ``--plot`` draws, by the file's ending: formats matplotlib writes without a display.
PLOT_FORMATS = ("png", "pdf", "svg")


def plot_format(path: str | os.PathLike[str]) -> str:
    """The format ``path``'s ending names (one of :data:`PLOT_FORMATS`), else a one-line
    :class:`UsageError`: checked before the run, not found out after it."""
    suffix = os.path.splitext(os.fspath(path))[1].lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        raise UsageError(f"--plot {os.fspath(path)!r}: give a file ending in "
                         f"{', '.join('.' + f for f in PLOT_FORMATS)}")  # fmt: skip
    return suffix


def save_figure(fig: Any, path: str | os.PathLike[str]) -> str:
    """Write a figure to ``path`` in the format its ending names, as every output is written (in
    one rename, through links), and close it."""
    import io

    from ..fsutil import write_atomic

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=plot_format(path), dpi=120)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    write_atomic(path, buf.getvalue())
    return str(path)


#: Speedup ticks on the log axis (matplotlib shows those inside the data's range).
Y_TICKS = (0.25, 0.33, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


def _as_dict(report: Any) -> dict[str, Any]:
    if isinstance(report, dict):
        return report
    if isinstance(report, (str, os.PathLike)):
        with open(report) as f:
            return json.load(f)
    return report.to_dict()


def speedup_series(report: Any, *, dispatched_only: bool = True) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (dtype, mode): ``labels`` (one per point, kernel included), and per
    variant (baseline excluded) ``speedup``, ``lo`` and ``hi`` lists aligned with them."""
    d = _as_dict(report)
    base = d["baseline"]
    others = [v for v in d["variants"] if v != base]
    panels: dict[tuple[str, str], dict[str, Any]] = {}
    shapes = {_shape(r["point"]) for r in d["results"]}
    for r in d["results"]:
        if dispatched_only and not r["dispatched"]:
            continue
        pt = r["point"]
        key = (pt["dtype"], r["mode"])
        panel = panels.setdefault(
            key, {"labels": [], "series": {v: {"speedup": [], "lo": [], "hi": []} for v in others}}
        )
        ctx = pt["context"]
        ctx_s = f"{ctx // 1024}k" if ctx % 1024 == 0 else str(ctx)
        prefix = f"{_shape(pt)}\n" if len(shapes) > 1 else ""
        panel["labels"].append(f"{prefix}B{pt['batch']}\n{ctx_s}\n{r['kernel']}")
        for v in others:
            t = r["variants"].get(v)
            s = panel["series"][v]
            if t is None:
                s["speedup"].append(float("nan"))
                s["lo"].append(float("nan"))
                s["hi"].append(float("nan"))
                continue
            sp = float(t["speedup"])
            rounds = [float(x) for x in t.get("speedup_rounds") or [sp]]
            s["speedup"].append(sp)
            s["lo"].append(float(t.get("speedup_lo", min(rounds))))
            s["hi"].append(float(t.get("speedup_hi", max(rounds))))
    return panels


def _shape(pt: dict[str, Any]) -> str:
    """A short label of a point's shape: ``32/8 h128 b16`` (+ ``fp8``)."""
    s = f"{pt.get('num_heads', 32)}/{pt.get('num_kv_heads', 8)} h{pt.get('head_size', 128)} b{pt.get('block_size', 16)}"
    return s + (f" {pt['kv_cache_dtype']}" if pt.get("kv_cache_dtype", "auto") != "auto" else "")


def plot_bench(report: Any, path: str | os.PathLike[str], *, title: str | None = None) -> str:
    """Write the PNG to ``path``; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    d = _as_dict(report)
    panels = speedup_series(d)
    dtypes = list(dict.fromkeys(k[0] for k in panels)) or ["-"]
    modes = list(dict.fromkeys(k[1] for k in panels)) or ["-"]
    width_in = max(5.5, 0.35 * max((len(p["labels"]) for p in panels.values()), default=12))
    fig, axes = plt.subplots(
        len(dtypes), len(modes), figsize=(width_in * len(modes), 3.6 * len(dtypes)), squeeze=False, sharey="row"
    )
    others = [v for v in d["variants"] if v != d["baseline"]]
    n = max(1, len(others))
    width = 0.8 / n
    for i, dt in enumerate(dtypes):
        for j, mode in enumerate(modes):
            ax = axes[i][j]
            panel = panels.get((dt, mode))
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set_title(f"{dt} {mode}", fontsize=10)
            if panel is None:
                continue
            xs = list(range(len(panel["labels"])))
            for k, v in enumerate(others):
                s = panel["series"][v]
                pos = [x - 0.4 + width * (k + 0.5) for x in xs]
                err = [
                    [max(0.0, sp - lo) for sp, lo in zip(s["speedup"], s["lo"])],
                    [max(0.0, hi - sp) for sp, hi in zip(s["speedup"], s["hi"])],
                ]
                line = ax.errorbar(pos, s["speedup"], yerr=err, fmt="o", ms=4, capsize=2, lw=0.8, label=v)
                slow = [(x, y) for x, y, hi in zip(pos, s["speedup"], s["hi"]) if hi < 1.0]
                if slow:
                    ax.plot(
                        [x for x, _ in slow],
                        [y for _, y in slow],
                        "o",
                        ms=7,
                        mfc="none",
                        mec="red",
                        color=line[0].get_color(),
                    )
            ax.set_xticks(xs)
            ax.set_xticklabels(panel["labels"], fontsize=7)
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(FixedLocator(Y_TICKS))
            ax.yaxis.set_minor_locator(NullLocator())
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}x"))
            ax.grid(axis="y", alpha=0.3)
            if j == 0:
                ax.set_ylabel(f"speedup over {d['baseline']}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="upper right", fontsize=8)
    gpu = (d.get("env") or {}).get("gpu", {}).get("name", "")
    pset = d.get("point_set", "custom")
    fig.suptitle(
        title
        or f"kvpatch bench ({pset} set): kernel vLLM dispatches {('(' + gpu + ')') if gpu else ''}"
        "; bars: min..max over rounds",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 0.92, 0.95))
    return save_figure(fig, path)
