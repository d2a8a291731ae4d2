"""The decode benchmark's report: JSON, a plain text table, a rich table, a plot.

Imports no torch; matplotlib and rich only inside the functions that draw.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from ..gpu.stats import verdict
from .options import MiB


def verdict_of(speedup: dict[str, float]) -> str:
    """'faster' / 'slower' / 'noise' of a {median, min, max} speedup: kvpatch's one rule."""
    return verdict(speedup["min"], speedup["max"])


def fmt_interval(s: dict[str, float]) -> str:
    return f"{s['median']:.3f} [{s['min']:.3f}..{s['max']:.3f}]"


@dataclass
class DecodeReport:
    variants: list[str]
    layers: int
    rounds: int
    mode: str  # 'warm' | 'cold'
    caps_bytes: Any  # int for every batch, or {batch: bytes}
    env: dict[str, Any]
    points: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    priority: str = "high"
    seconds: float = 0.0
    micro: dict[str, Any] | None = None
    weight_prefetch: dict[str, Any] | None = None  # WeightPrefetch.to_dict(): cap and launch knobs

    # ----------------------------------------------------------------------- data

    def to_dict(self) -> dict[str, Any]:
        return {"format": "kvpatch.bench-decode/1", **asdict(self), "summary": self.summary()}

    def save_json(self, path: str | os.PathLike[str]) -> None:
        from ..fsutil import write_atomic

        write_atomic(path, json.dumps(self.to_dict(), indent=1, default=str) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecodeReport:
        keys = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in keys})

    def summary(self) -> dict[str, Any]:
        """Per variant: geomean speedup, how many points are faster / slower / within noise;
        and whether every point was bit-identical."""
        out: dict[str, Any] = {"points": len(self.points), "skipped": len(self.skipped),
                               "all_identical": all(p["all_identical"] for p in self.points)}  # fmt: skip
        for name in self.variants[1:]:
            sp = [p["variants"][name]["speedup"] for p in self.points]
            if not sp:
                continue
            geo = 1.0
            for s in sp:
                geo *= s["median"]
            verdicts = [verdict_of(s) for s in sp]
            out[name] = {
                "geomean": geo ** (1 / len(sp)),
                "min": min(s["median"] for s in sp),
                "faster": verdicts.count("faster"),
                "slower": verdicts.count("slower"),
                "noise": verdicts.count("noise"),
            }
        best = {}
        for p in self.points:
            winner = min(self.variants, key=lambda n: p["variants"][n]["step_us"]["median"])
            best[winner] = best.get(winner, 0) + 1
        out["best_variant_counts"] = best
        return out

    # ----------------------------------------------------------------------- text

    def point_line(self, p: dict[str, Any]) -> str:
        v = p["variants"]
        parts = [f"{p['model']} {p['dtype']} B={p['batch']} ctx={p['context']} {p['kernel']}:",
                 f"stock {v['stock']['step_us']['median']:.1f} us"]  # fmt: skip
        for name in self.variants[1:]:
            parts.append(f"{name} {v[name]['speedup']['median']:.3f}x")
        parts.append(f"attn {100 * v['stock']['attention_share']:.0f}%")
        parts.append(f"cap {p['cap_bytes'] / MiB:.0f} MiB")
        parts.append("identical" if p["all_identical"] else "NOT IDENTICAL")
        return " ".join(parts)

    def text_table(self) -> str:
        """A plain table: one line per point; speedups are median [min..max] over rounds."""
        e = self.env
        smi = e.get("smi") or {}
        head = [
            f"kvpatch bench-decode: {e.get('gpu', '?')} (cc {e.get('capability', '?')}, {e.get('sm_count', '?')} SMs, "
            f"L2 {e.get('l2_bytes', 0) / MiB:.0f} MiB), {self.mode} L2, {self.layers} layers, {self.rounds} rounds",
            f"torch {e.get('torch')} CUDA {e.get('torch_cuda')}, {e.get('nvcc', 'nvcc ?')}, driver {smi.get('driver_version', '?')}, "
            f"clocks SM {smi.get('clocks.sm', '?')}/{smi.get('clocks.max.sm', '?')} MHz mem {smi.get('clocks.mem', '?')} MHz, "
            f"power limit {smi.get('power.limit', '?')} W",
            f"weight prefetch: {(e.get('prefetch_library') or {}).get('config', '?')}, priority {self.priority}, "
            f"cap per layer window: {self._caps_text()}"
            + (f"; configuration {self.weight_prefetch.get('label')}" if self.weight_prefetch else ""),
            "speedup over stock = median [min..max] of per-round ratios; attn = attention's share of stock's step",
        ]
        cols = ["model", "dtype", "B", "ctx", "kern", "stock us", "tok/s"] + [f"{n} x" for n in self.variants[1:]] + ["attn", "cap MiB", "same"]
        rows = []
        for p in self.points:
            v = p["variants"]
            row = [p["model"], p["dtype"], str(p["batch"]), str(p["context"]), p["kernel"],
                   f"{v['stock']['step_us']['median']:.1f}", f"{v['stock']['tokens_per_s']:.0f}"]  # fmt: skip
            row += [fmt_interval(v[n]["speedup"]) for n in self.variants[1:]]
            row += [f"{100 * v['stock']['attention_share']:.0f}%", f"{p['cap_bytes'] / MiB:.0f}",
                    "yes" if p["all_identical"] else "NO"]  # fmt: skip
            rows.append(row)
        widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
        lines = head + ["", "  ".join(c.rjust(w) for c, w in zip(cols, widths))]
        lines += ["  ".join(x.rjust(w) for x, w in zip(r, widths)) for r in rows]
        lines.append("")
        lines += self.summary_lines()
        return "\n".join(lines)

    def summary_lines(self) -> list[str]:
        """Per variant geomean / worst / faster-slower-noise counts, identity, capped rounds, skips."""
        summ = self.summary()
        lines = []
        for name in self.variants[1:]:
            s = summ.get(name)
            if s:
                lines.append(f"{name}: geomean {s['geomean']:.3f}x, worst {s['min']:.3f}x; faster at {s['faster']}, "
                             f"slower at {s['slower']}, within noise at {s['noise']} of {summ['points']} points")  # fmt: skip
        lines.append(f"fastest variant per point: {summ['best_variant_counts']}")
        lines.append("bit-identical to stock at every point" if summ["all_identical"] else "OUTPUTS DIFFER FROM STOCK (see 'same')")
        capped = sum(p.get("power_capped_rounds", 0) for p in self.points)
        if capped:
            lines.append(f"{capped} rounds ran power- or thermally capped (clocks in the JSON)")
        for s in self.skipped:
            lines.append(f"skipped {s['model']} {s['dtype']} B={s['batch']} ctx={s['context']}: {s['reason']}")
        return lines

    def _caps_text(self) -> str:
        caps = self.caps_bytes
        if isinstance(caps, int):
            return "off" if caps == 0 else f"{caps / MiB:g} MiB at every batch"
        items = sorted((int(b), c) for b, c in caps.items())
        return ", ".join(f"B<={b}: {c / MiB:g} MiB" for b, c in items) + f", off above B={items[-1][0]}" if items else "off"

    # ----------------------------------------------------------------------- plot

    def plot(self, path: str | os.PathLike[str]) -> str:
        """One panel per (model, dtype): speedup over stock per point with min..max bars."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for p in self.points:
            groups.setdefault((p["model"], p["dtype"]), []).append(p)
        n = max(1, len(groups))
        fig, axes = plt.subplots(n, 1, figsize=(11, 3.2 * n), squeeze=False)
        for ax, ((model, dtype), pts) in zip(axes[:, 0], groups.items()):
            xs = list(range(len(pts)))
            width = 0.8 / max(1, len(self.variants) - 1)
            for j, name in enumerate(self.variants[1:]):
                sp = [p["variants"][name]["speedup"] for p in pts]
                med = [s["median"] for s in sp]
                err = [[m - s["min"] for m, s in zip(med, sp)], [s["max"] - m for m, s in zip(med, sp)]]
                ax.bar([x + (j - (len(self.variants) - 2) / 2) * width for x in xs], [m - 1 for m in med], width,
                       bottom=1, yerr=err, capsize=2, label=name)  # fmt: skip
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_xticks(xs)
            ax.set_xticklabels([f"B{p['batch']}\nctx{p['context'] // 1024}k\n{p['kernel']}" for p in pts], fontsize=7)
            ax.set_ylabel("speedup over stock")
            ax.set_title(f"{model} {dtype}: decode step, {self.layers} layers, {self.mode} L2", fontsize=9)
            ax.legend(fontsize=7, ncol=3)
        fig.suptitle(f"kvpatch bench-decode on {self.env.get('gpu', '?')} (bars: min..max over {self.rounds} rounds)", fontsize=10)
        fig.tight_layout()
        fig.savefig(str(path), dpi=120)
        plt.close(fig)
        return str(path)
