"""Bench reports, picks and saved tune JSONs made by hand, shaped as ``kvpatch bench`` and
``kvpatch tune --json`` write them."""

from __future__ import annotations

from kvpatch.tune import Pick, Score, TuneReport, candidates, choose, combine, score


def timing(speedup: float, rounds=None, verdict=None) -> dict:
    """One variant's result at one point: its speedup over stock, per round, and the verdict."""
    rounds = rounds or [speedup, speedup]
    v = verdict or ("slower" if max(rounds) < 1 else "faster" if min(rounds) > 1 else "noise")
    return {"speedup": speedup, "speedup_rounds": rounds, "verdict": v}


def bench_report(speedups: dict[str, dict[str, list]]) -> dict:
    """A bench report dict: speedups[variant]["dtype/head/block/auto/kernel"] = [speedup or
    (speedup, rounds)] at points where that kernel is dispatched, plus the other kernel's
    result at each point (not dispatched: ignored by score)."""
    results = []
    sels = {i for per in speedups.values() for i in per}
    for sel in sorted(sels):
        dtype, head, block, kv, kernel = sel.split("/")
        point = {"dtype": dtype, "head_size": int(head), "block_size": int(block), "kv_cache_dtype": kv}
        n = len(next(iter(speedups.values()))[sel])
        other = "v2" if kernel == "v1" else "v1"
        for i in range(n):
            variants = {"stock": {"speedup": 1.0}}
            for name, per in speedups.items():
                x = per[sel][i]
                variants[name] = timing(*x) if isinstance(x, tuple) else timing(x)
            results.append({"point": point, "kernel": kernel, "dispatched": True, "variants": variants})
            results.append({"point": point, "kernel": other, "dispatched": False,
                            "variants": {k: timing(0.1) for k in variants}})  # fmt: skip
    return {"baseline": "stock", "results": results}


def pick(inst: str, name: str | None) -> Pick:
    """``name`` picked on one kernel (None: off)."""
    s = None if name is None else Score(name, inst, (1.2,), True)
    return Pick(inst, s, (s,) if s else ())


def saved_report() -> dict:
    """What `kvpatch tune --json` writes, for two candidates on one instantiation's two kernels:
    inline is the faster on both, call is slower than stock at one v1 point."""
    configs = {k: v for k, v in candidates().items() if k in ("inline_cta_la1", "call_cta_la1")}
    bench = bench_report({"inline_cta_la1": {"bf16/256/16/auto/v1": [1.5, 1.4], "bf16/256/16/auto/v2": [1.3, 1.2]},
                          "call_cta_la1": {"bf16/256/16/auto/v1": [1.2, 0.95], "bf16/256/16/auto/v2": [1.1, 1.05]}})  # fmt: skip
    bench["variant_info"] = {"stock": {"marker": "stock"}, **{n: {"marker": c.marker()} for n, c in configs.items()}}
    picks = choose(score(bench, {}))
    return TuneReport(combine(picks, configs), picks, "strict", {}, None, {}, bench).to_json()


def saved_run(kernels: dict[str, dict[str, list]], failures=None, seconds=1.0) -> dict:
    """A saved tune JSON of one run: kernels[candidate][selector] = speedups."""
    configs = candidates()
    bench = bench_report(kernels)
    bench["variant_info"] = {"stock": {"marker": "stock"}, **{n: {"marker": configs[n].marker()} for n in kernels}}
    bench["seconds"] = seconds
    return {"bench": bench, "validation_failures": failures or {}, "machine": None}
