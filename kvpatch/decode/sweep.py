"""Tune the L2 weight prefetch on the GPU in one unattended run, then bench the pick.

``kvpatch bench-decode-sweep --libs-file libs.txt --out DIR`` (GPU, a maintainer's
command: hidden from ``--help``; what ``scripts/gpu_pf_sweep.sh`` runs) does, within a
time budget:

1. **micro** (:func:`~.micro.run_micro_prefetch`): the prefetch kernel alone across
   bytes x grid x threads x chunk (and hints at 32 MiB): how long it issues, how fast
   the bytes land in L2, and the GEMV after a 40 us idle window with vs without it.
2. **stage 1**: the decode step of Llama-3.1-8B bf16 (8 layers, batch 1/4/8 x context
   1k/4k, 3 rounds) with stock, patched and one ``stock+wpf`` variant per
   configuration of :func:`stage1_configs`: the first run's configuration (``base``)
   and one knob changed at a time from ``g132`` (grid 132): grid/threads, chunk,
   hint, caps, fork before the QKV GEMM, join before o_proj, stream priority.
3. **pick the knobs** (:func:`pick_knobs`): per knob the value whose configuration has
   the best geomean of ``speedup_vs_library`` (the step with vs without the prefetch,
   same attention library) over batch 1 and 4.
4. **stage 2**: those knobs with caps 8/16/24/32/48 MiB, stock+wpf and patched+wpf,
   same points; :func:`pick_caps` gives each batch bucket (1, 4, 8) the cap with the best
   geomean over both libraries, or 0 (off) unless that geomean is > 1 and no point is
   slower beyond its spread (round max < 1).
5. **final**: :func:`~.bench.run_bench_decode` with the picked configuration:
   Llama-3.1-8B bf16+fp16 and Llama-3.2-1B bf16, batch 1/4/16/64 x context
   1k/4k/16k, 4 variants, warm, 5 rounds (held-out style: the pick saw only 8B bf16
   at batch 1/4/8 and 1k/4k, with 3 rounds).

Everything lands in ``DIR``: ``sweep.json`` after every stage, ``decode_*.json/png`` (the
command writes the tables, ``sweep.txt``, from ``sweep.json`` at the end).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..gpu.stats import geomean
from .options import MiB, WeightPrefetch, caps_text

SWEEP_MODEL = "llama-3.1-8b"
SWEEP_DTYPE = "bf16"
SWEEP_BATCHES = (1, 4, 8)
SWEEP_CONTEXTS = (1024, 4096)
SWEEP_LAYERS = 8
STAGE2_CAPS_MIB = (8, 16, 24, 32, 48)
#: A speedup must beat 1 by this much to count as a win when picking a knob over g132's value.
MIN_GAIN = 0.001


def stage1_configs() -> dict[str, WeightPrefetch]:
    """The first run's configuration and one-knob changes from grid 132 (caps: MiB at every batch)."""
    base = WeightPrefetch(caps=32 * MiB)
    g = base.with_(grid=132)
    return {
        "base": base,  # the first H200 run at batch <= 4: 32 MiB, 32 CTAs x 32 threads, 4 KiB, evict_last
        "g132": g,
        "g132t128": g.with_(threads=128),
        "g264": base.with_(grid=264),
        "g16": base.with_(grid=16),
        "g132c16k": g.with_(chunk=16384),
        "g132normal": g.with_(hint="evict_normal"),
        "g132none": g.with_(hint="none"),
        "g132first": g.with_(hint="evict_first"),
        "g132cap8": g.with_(caps=8 * MiB),
        "g132cap16": g.with_(caps=16 * MiB),
        "g132cap48": g.with_(caps=48 * MiB),
        "g132qkv": g.with_(fork="qkv"),
        "g132joino": g.with_(join="oproj"),
        "g132lowprio": g.with_(priority="normal"),
    }


def micro_configs() -> list[dict[str, Any]]:
    """Bytes x grid x threads x chunk at evict_last, plus the hints at 32 MiB."""
    out = []
    for nbytes in (8, 16, 32, 48):
        for grid in (8, 32, 132, 264):
            for threads in (32, 128):
                for chunk in (4096, 16384):
                    out.append({"bytes": nbytes * MiB, "grid": grid, "threads": threads, "chunk": chunk, "hint": "evict_last"})
    for grid in (32, 132):
        for hint in ("evict_normal", "evict_first", "none"):
            out.append({"bytes": 32 * MiB, "grid": grid, "threads": 32, "chunk": 4096, "hint": hint})
    return out


# --------------------------------------------------------------------------- scoring (pure)


def ratios(points: Sequence[Mapping[str, Any]], variant: str, batches: Sequence[int]) -> list[dict[str, float]]:
    """``speedup_vs_library`` (median/min/max over rounds) of ``variant`` at the points of ``batches``."""
    out = []
    for p in points:
        v = p["variants"].get(variant)
        if p["batch"] in batches and v and v.get("speedup_vs_library"):
            out.append(v["speedup_vs_library"])
    return out


def score(points: Sequence[Mapping[str, Any]], variants: Sequence[str], batches: Sequence[int]) -> float:
    """Geomean of the median ``speedup_vs_library`` of ``variants`` over the points of ``batches``."""
    medians = [r["median"] for name in variants for r in ratios(points, name, batches)]
    return geomean(medians) if medians else math.nan


def pick_knobs(points: Sequence[Mapping[str, Any]], configs: Mapping[str, WeightPrefetch], batches: Sequence[int] = (1, 4)) -> tuple[WeightPrefetch, dict[str, Any]]:
    """Per knob, the value of the best-scoring configuration (stage 1 names, see
    :func:`stage1_configs`); a one-knob change from ``g132`` wins only by more than
    :data:`MIN_GAIN`. Returns the combined configuration (caps still 32 MiB) and why."""
    sc = {name: score(points, [f"stock+wpf:{name}"], batches) for name in configs}
    why: dict[str, Any] = {"scores": sc}
    launch = max(("base", "g132", "g132t128", "g264", "g16"), key=lambda n: sc.get(n, float("nan")) if not math.isnan(sc.get(n, float("nan"))) else -1)
    best = configs[launch]
    ref = sc.get("g132", float("nan"))

    def better(name: str) -> bool:
        return not math.isnan(sc.get(name, float("nan"))) and sc[name] > ref + MIN_GAIN

    chosen = {"launch": launch}
    if better("g132c16k"):
        best, chosen["chunk"] = best.with_(chunk=16384), "g132c16k"
    hints = [n for n in ("g132normal", "g132none", "g132first") if better(n)]
    if hints:
        h = max(hints, key=lambda n: sc[n])
        best, chosen["hint"] = best.with_(hint=configs[h].hint), h
    if better("g132qkv"):
        best, chosen["fork"] = best.with_(fork="qkv"), "g132qkv"
    if better("g132lowprio"):
        best, chosen["priority"] = best.with_(priority="normal"), "g132lowprio"
    why["chosen"] = chosen
    why["label"] = best.label()
    return best, why


def pick_caps(points: Sequence[Mapping[str, Any]], caps_mib: Sequence[int], libs: Sequence[str] = ("stock", "patched"),
              buckets: Sequence[int] = SWEEP_BATCHES) -> tuple[dict[int, int], dict[str, Any]]:  # fmt: skip
    """Stage 2 (variants ``'{lib}+wpf:cap{MiB}'``): per batch bucket the cap (bytes)
    with the best geomean over ``libs``; 0 unless it beats 1 and no point of that batch
    is slower beyond its spread (a round-max ratio below 1)."""
    caps: dict[int, int] = {}
    why: dict[str, Any] = {}
    for b in buckets:
        table = {}
        for c in caps_mib:
            names = [f"{lib}+wpf:cap{c}" for lib in libs]
            rs = [r for n in names for r in ratios(points, n, [b])]
            if rs:
                table[c] = {"geomean": geomean([r["median"] for r in rs]), "worst_max": min(r["max"] for r in rs),
                            "worst_median": min(r["median"] for r in rs)}  # fmt: skip
        if not table:
            why[str(b)] = {"cap_mib": 0, "reason": "not measured"}
            caps[b] = 0
            continue
        c = max(table, key=lambda k: table[k]["geomean"])
        ok = table[c]["geomean"] > 1.0 and table[c]["worst_max"] >= 1.0
        caps[b] = c * MiB if ok else 0
        why[str(b)] = {"cap_mib": c if ok else 0, "best_cap_mib": c, **table[c], "table": table,
                       "reason": "faster" if ok else "no cap beats off at this batch (geomean <= 1 or a point slower beyond the spread)"}  # fmt: skip
    return caps, why


# --------------------------------------------------------------------------- GPU stages


def _sweep_points(libs, variants, pf_lib, dev, flush, timer, *, rounds, reps, say, deadline) -> list[dict[str, Any]]:
    import torch

    from .measure import measure_point
    from .models import model_shape
    from .step import DecodeStep, DecodeWeights

    weights = DecodeWeights(model_shape(SWEEP_MODEL), SWEEP_DTYPE, SWEEP_LAYERS, dev, seed=0)
    points = []
    for batch in SWEEP_BATCHES:
        for context in SWEEP_CONTEXTS:
            if time.perf_counter() > deadline:
                say(f"  time budget: skipping B={batch} ctx={context}")
                continue
            t0 = time.perf_counter()
            step = DecodeStep(weights, batch, context, seed=1000 * batch + context)
            p = measure_point(step, variants, libs, pf_lib, dev, rounds=rounds, reps=reps, round_seconds=0.15, flush=flush,
                              cold=False, timer=timer)
            p["seconds"] = round(time.perf_counter() - t0, 2)
            points.append(p)
            best = max((n for n in p["variants"] if "+wpf" in n), key=lambda n: p["variants"][n]["speedup_vs_library"]["median"])
            say(f"  B={batch} ctx={context}: stock {p['variants']['stock']['step_us']['median']:.1f} us, best {best} "
                f"{p['variants'][best]['speedup_vs_library']['median']:.3f}x, identical {p['all_identical']} ({p['seconds']} s)")  # fmt: skip
            del step
            torch.cuda.empty_cache()
    del weights
    torch.cuda.empty_cache()
    return points


def run_sweep(
    libs: Mapping[str, Any],
    out_dir: str | Path,
    *,
    budget_s: float = 260.0,
    prefetch_library: Any = None,
    device: Any = "cuda",
    final: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Steps 1-5 of the module docstring; returns (and writes) ``sweep.json``."""
    from ..fsutil import write_atomic
    from ..gpu.flush import L2Flush
    from ..gpu.timing import Timer
    from .bench import cuda_device, decode_env, prefetch_library_for, run_bench_decode
    from .micro import run_micro_gemm, run_micro_prefetch

    t_start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log: list[str] = []

    def note(msg: str) -> None:
        line = f"[sweep +{time.perf_counter() - t_start:.0f}s] {msg}"
        log.append(line)
        if progress is not None:
            progress(line)

    dev = cuda_device(device)
    pf_lib = prefetch_library_for(prefetch_library, dev)
    env = decode_env(dev, pf_lib, libs)
    flush = L2Flush(dev, env["l2_bytes"])
    timer = Timer(dev)
    result: dict[str, Any] = {"format": "kvpatch.pf-sweep/1", "env": env, "budget_s": budget_s, "log": log}

    def save() -> None:
        result["seconds"] = round(time.perf_counter() - t_start, 1)
        write_atomic(out / "sweep.json", json.dumps(result, indent=1, default=str) + "\n")

    # 1. micro
    note("micro: prefetch kernel across bytes/grid/threads/chunk/hint")
    try:
        micro = run_micro_prefetch(pf_lib, configs=micro_configs(), device=dev, deadline=t_start + min(40.0, 0.15 * budget_s))
        result["micro_prefetch"] = micro
        result["micro_gemm"] = run_micro_gemm(pf_lib, device=dev, trials=20)
    except Exception as e:  # the decode stages matter more: record and go on
        note(f"micro failed: {type(e).__name__}: {e}")
    save()

    # 2. stage 1
    configs = stage1_configs()
    v1 = [("stock", "stock", None), ("patched", "patched", None)] + [(f"stock+wpf:{k}", "stock", c) for k, c in configs.items()]
    note(f"stage 1: {len(configs)} configurations x {len(SWEEP_BATCHES) * len(SWEEP_CONTEXTS)} points ({SWEEP_MODEL} {SWEEP_DTYPE}, {SWEEP_LAYERS} layers, 3 rounds)")
    s1 = _sweep_points(libs, v1, pf_lib, dev, flush, timer, rounds=3, reps=6, say=note, deadline=t_start + 0.45 * budget_s)
    result["stage1"] = {"configs": {k: c.to_dict() for k, c in configs.items()}, "points": s1,
                        "variants": [n for n, _, w in v1 if w is not None]}  # fmt: skip
    knobs, why = pick_knobs(s1, configs) if s1 else (configs["base"], {"reason": "stage 1 measured nothing"})
    result["knobs"] = why
    note(f"knobs: {knobs.label()} ({why.get('chosen')})")
    save()

    # 3. stage 2: caps with the picked knobs, both libraries
    v2: list[tuple[str, str, Any]] = [("stock", "stock", None), ("patched", "patched", None)]
    for lib in ("stock", "patched"):
        v2 += [(f"{lib}+wpf:cap{c}", lib, knobs.with_(caps=c * MiB)) for c in STAGE2_CAPS_MIB]
    s2: list[dict[str, Any]] = []
    if time.perf_counter() < t_start + 0.5 * budget_s:
        note(f"stage 2: caps {STAGE2_CAPS_MIB} MiB with {knobs.label()}, stock+wpf and patched+wpf")
        s2 = _sweep_points(libs, v2, pf_lib, dev, flush, timer, rounds=3, reps=6, say=note, deadline=t_start + 0.65 * budget_s)
    result["stage2"] = {"points": s2, "variants": [n for n, _, w in v2 if w is not None]}
    if s2:
        caps, cap_why = pick_caps(s2, STAGE2_CAPS_MIB)
    else:
        caps, cap_why = {b: 0 for b in SWEEP_BATCHES}, {"reason": "stage 2 did not run (time budget)"}
    picked = knobs.with_(caps=caps)
    result["picked"] = {"config": picked.to_dict(), "caps_why": cap_why}
    note(f"picked: {picked.label()}")
    save()

    # 4. final bench with the pick
    if final:
        runs = [("llama8b", ["llama-3.1-8b"], ["bf16", "fp16"], 0.8), ("llama1b", ["llama-3.2-1b"], ["bf16"], 1.0)]
        for tag, models, dtypes, until in runs:
            if time.perf_counter() > t_start + until * budget_s:
                note(f"final {tag}: skipped (time budget)")
                continue
            note(f"final bench {tag}: {models} {dtypes}, batch 1/4/16/64 x ctx 1k/4k/16k, warm, 5 rounds")
            rep = run_bench_decode(libs, models=models, dtypes=dtypes, batches=(1, 4, 16, 64), contexts=(1024, 4096, 16384),
                                   layers=SWEEP_LAYERS, rounds=5, weight_prefetch=picked, prefetch_library=pf_lib, device=dev,
                                   json_path=out / f"decode_{tag}_warm.json", plot_path=out / f"decode_{tag}_warm.png",
                                   progress=note)  # fmt: skip
            result.setdefault("final", {})[tag] = {"summary": rep.summary(), "seconds": rep.seconds,
                                                   "report": rep.to_dict()}  # fmt: skip
            save()
    note("done")
    save()
    return result


def all_identical(result: Mapping[str, Any]) -> bool:
    """Whether every point the sweep measured was bit-identical to stock."""
    same = all(p["all_identical"] for st in ("stage1", "stage2") for p in result.get(st, {}).get("points", []))
    return same and all(f["summary"]["all_identical"] for f in result.get("final", {}).values())
