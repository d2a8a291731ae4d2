"""The decode benchmark's report: data, JSON, its summary and a plot (its tables are
:mod:`kvpatch.render`'s).

Imports no torch; matplotlib only inside the function that draws.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from ..gpu.stats import geomean as _geomean
from ..gpu.stats import verdict

MiB = 1 << 20


def verdict_of(speedup: dict[str, float]) -> str:
    """'faster' / 'slower' / 'noise' of a {median, min, max} speedup: kvpatch's one rule."""
    return verdict(speedup["min"], speedup["max"])


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
    weight_prefetch: dict[str, Any] | None = None  # WeightPrefetch.to_dict(): windows and launch knobs
    arms: list[dict[str, Any]] = field(default_factory=list)  # Arm.to_dict() of each variant
    guard: str = "auto"
    tail: dict[str, Any] | None = None  # TailPrefetch.to_dict() of the in-kernel arm

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
        """Per arm: geomean speedup over stock, the worst point's median and round-minimum
        ratio, how many points are faster / slower / within noise, the same over its own
        library and its zero-byte twin; the A/A twin's largest deviation; whether every point
        was bit-identical; the guard and the carry-over it left."""
        out: dict[str, Any] = {"points": len(self.points), "skipped": len(self.skipped),
                               "all_identical": all(p["all_identical"] for p in self.points)}  # fmt: skip
        for name in self.variants[1:]:
            pts = [p for p in self.points if name in p["variants"]]
            sp = [p["variants"][name]["speedup"] for p in pts]
            if not sp:
                continue
            verdicts = [verdict_of(s) for s in sp]
            entry = {
                "geomean": _geomean([s["median"] for s in sp]),
                "min": min(s["median"] for s in sp),
                "worst_round_min": min(s["min"] for s in sp),
                "faster": verdicts.count("faster"),
                "slower": verdicts.count("slower"),
                "noise": verdicts.count("noise"),
            }
            for key, label in (("speedup_vs_library", "vs_library"), ("speedup_vs_zero", "vs_zero")):
                other = [p["variants"][name].get(key) for p in pts]
                if other and all(other):
                    entry[label] = {
                        "geomean": _geomean([o["median"] for o in other]),
                        "worst_round_min": min(o["min"] for o in other),
                    }
            out[name] = entry
        aa = [p["aa"] for p in self.points if p.get("aa")]
        if aa:
            out["aa"] = {
                "worst": max(abs(a["median"] - 1) for a in aa),
                "within": sum(a["within"] for a in aa),
                "of": len(aa),
            }
        carry = [c for p in self.points if (c := p.get("carryover")) and "stock" in c]
        if carry:
            out["carryover_stock"] = {
                "max": max(c["stock"]["ratio"] for c in carry),
                "min": min(c["stock"]["ratio"] for c in carry),
            }
        best = {}
        for p in self.points:
            winner = min(p["variants"], key=lambda n: p["variants"][n]["step_us"]["median"])
            best[winner] = best.get(winner, 0) + 1
        out["best_variant_counts"] = best
        return out

    def point_line(self, p: dict[str, Any]) -> str:
        """One measured point as a progress line: stock's step time, each arm's median speedup."""
        v = p["variants"]
        parts = [f"{p['model']} {p['dtype']} B={p['batch']} ctx={p['context']} {p['kernel']}:",
                 f"stock {v['stock']['step_us']['median']:.1f} us"]  # fmt: skip
        parts += [f"{name} {v[name]['speedup']['median']:.3f}x" for name in self.variants[1:] if name in v]
        if "attention_share" in v["stock"]:
            parts.append(f"attn {100 * v['stock']['attention_share']:.0f}%")
        if p.get("guard", {}).get("on"):
            parts.append(f"guard {p['guard']['demoted_bytes'] / MiB:.0f} MiB")
        parts.append("identical" if p["all_identical"] else "NOT IDENTICAL")
        return " ".join(parts)

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
                sp = [
                    p["variants"][name]["speedup"] if name in p["variants"] else {"median": 1.0, "min": 1.0, "max": 1.0}
                    for p in pts
                ]
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
        fig.suptitle(
            f"kvpatch bench-decode on {env_facts(self.env)['gpu']} (bars: min..max over {self.rounds} rounds)",
            fontsize=10,
        )
        fig.tight_layout()
        from ..gpu.plot import save_figure

        return save_figure(fig, path)


def env_facts(env: dict[str, Any]) -> dict[str, Any]:
    """The machine facts a decode report's tables show, from its ``env``: the snapshot of
    :func:`kvpatch.gpu.env.collect_env` (``gpu`` a table, ``nvidia_smi`` a list), or the flat
    form of reports written before it (``gpu`` a name, ``smi`` a table)."""
    gpu = env.get("gpu")
    smi_rows = env.get("nvidia_smi")
    smi = (smi_rows[0] if isinstance(smi_rows, list) and smi_rows else None) or env.get("smi") or {}
    if isinstance(gpu, dict):
        name, cap, sms = gpu.get("name", "?"), gpu.get("capability", "?"), gpu.get("sm_count", "?")
        l2 = env.get("l2_bytes") or gpu.get("L2_cache_size", 0)
    else:
        name, cap, sms, l2 = gpu or "?", env.get("capability", "?"), env.get("sm_count", "?"), env.get("l2_bytes", 0)
    return {
        "gpu": name,
        "capability": cap,
        "sm_count": sms,
        "l2_bytes": l2 or 0,
        "torch": env.get("torch"),
        "torch_cuda": env.get("torch_cuda"),
        "nvcc": env.get("nvcc", "nvcc ?"),
        "driver": smi.get("driver_version", "?"),
        "sm_mhz": smi.get("clocks.sm", "?"),
        "max_sm_mhz": smi.get("clocks.max.sm", "?"),
        "mem_mhz": smi.get("clocks.mem", "?"),
        "power_limit": smi.get("power.limit", "?"),
        "prefetch_config": (env.get("prefetch_library") or {}).get("config", "?"),
    }
