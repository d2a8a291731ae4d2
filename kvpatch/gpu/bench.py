"""Time variants side by side at bench points, warm and cold L2.

Method (see NOTES.md and the device METHOD.md):

* One KV pool per shape and seed (dtype, KV dtype, KV heads, head size, block size),
  shared by its points, sized several times the L2 (default: 64x L2 and at least
  1.2x the largest point's blocks), filled with randn. Every point gets its own
  random scattered block table (distinct blocks), batch sequences all of length
  ``context``. Points whose pool does not fit in 80% of free GPU memory are skipped
  and listed.
* ``kernels``: both kernels at every point, or ``("dispatched",)`` for only the one
  vLLM launches (v1 iff max_seq_len <= 8192 and (one partition or seqs*heads > 512)).
* warm: back-to-back launches; cold: :class:`~kvpatch.gpu.flush.L2Flush` (read and
  write a buffer of >= 2x L2, then read it) before each launch, outside the timed
  region (one CUDA event pair around the launch; for v2 that covers its two kernels).
* Variants are interleaved within a round (:func:`~kvpatch.gpu.timing.carryover_order`:
  each follows each, itself included, equally often) so drift and carry-over hit all
  alike. Each (point, kernel, mode) runs ``rounds`` rounds spread over the run; a
  variant's time is the median of its per-round medians. Kernels under ~30 us get
  more timed launches (:func:`~kvpatch.gpu.timing.adaptive_reps`, probed on stock).
* Spread: per point and variant the speedup's interval (min..max over rounds;
  :func:`~kvpatch.gpu.stats.speedup_interval`); a point is "slower than stock" only
  when its whole interval lies below 1.00.
* nvidia-smi samples clocks, power, temperature and throttle reasons in the
  background; each (round, pool) window is summarised and flagged when it ran
  power-capped or throttled, and so is every result timed in it.
* Before timing, each variant's output is checked bit-identical to stock's
  (NaN-poisoned buffers); a mismatch is listed in ``mismatches``. That launch also
  records whether the variant took its grouped form there (``grouped``: the library's
  launch counter), so a point where it ran stock's own code can be told apart.
* ``aa``: an A/A control, :data:`AA` -- the baseline's own kernels timed again as one more
  variant, through its own buffers. Nothing differs but the slots in the order, so its
  faster/slower counts are the method's false verdicts at these points and settings.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

from ..errors import UsageError
from . import launch as L
from .bench_report import BenchReport, finish_results
from .defaults import DEFAULT_REPS, DEFAULT_ROUNDS, DEFAULT_WARMUP
from .dispatch import KERNELS, PARTITION_SIZE
from .env import SmiSampler, collect_env, nvidia_smi_query
from .flush import L2Flush
from .inputs import make_generator, make_inputs, make_kv_pool
from .launch import AA
from .points import BenchPoint, point_set, pool_blocks
from .report import STOCK_MARKER
from .timing import Timer, adaptive_reps, l2_bytes_of, measure_copy_bandwidth, time_interleaved


def default_points() -> list[BenchPoint]:
    """The headline set: GQA 32/8, head 128, block 16, fp16 and bf16, batch 1/4/16/64 x context 1k/4k/16k."""
    return point_set("headline")


def _kernels_of(point: BenchPoint, kernels: Sequence[str]) -> list[str]:
    if "dispatched" in kernels:
        return [point.dispatched]
    return list(kernels)


def check_bench_options(*, reps: int, warmup: int, rounds: int, warm: bool, cold: bool,
                        kernels: Sequence[str]) -> None:  # fmt: skip
    """The timing options, checked before anything is built (UsageError, one line)."""
    if not (warm or cold):
        raise UsageError("neither warm nor cold timing selected")
    if reps < 1 or rounds < 1 or warmup < 0:
        raise UsageError("reps and rounds must be >= 1, warmup >= 0")
    if not kernels:
        raise UsageError("no kernels selected: v1, v2 or dispatched")
    for k in kernels:
        if k not in (*KERNELS, "dispatched"):
            raise UsageError(f"unknown kernel {k!r}: v1, v2 or dispatched")


def run_bench(
    libs: dict[str, Any],
    points: Sequence[BenchPoint] | None = None,
    *,
    reps: int = DEFAULT_REPS,
    warmup: int = DEFAULT_WARMUP,
    rounds: int = DEFAULT_ROUNDS,
    warm: bool = True,
    cold: bool = True,
    kernels: Sequence[str] = KERNELS,
    adaptive: bool = True,
    baseline: str = "stock",
    device: str = "cuda",
    variant_info: dict[str, Any] | None = None,
    point_set_name: str = "custom",
    l2_bytes: int | None = None,
    pool_l2_multiple: float = 64.0,
    flush_bytes: int | None = None,
    copy_bytes: int | None = None,
    check_outputs: bool = True,
    collect_environment: bool = True,
    sample_clocks: bool = True,
    progress: Callable[[str], None] | None = None,
    aa: bool = False,
) -> BenchReport:
    """Time every variant of ``libs`` (name -> Kernels; ``baseline`` or the first is
    the reference) at ``points`` (default: the headline set). See the module docstring."""
    import torch

    t_start = time.perf_counter()
    names = L.order_variants(libs, baseline)
    info = dict(variant_info or {})
    if aa:
        if AA in libs:
            raise UsageError(f"a library is named {AA!r}, the A/A control's name: rename it")
        libs = {**libs, AA: libs[names[0]]}
        info[AA] = {**info.get(names[0], {}), "marker": STOCK_MARKER, "aa_of": names[0]}
        names.append(AA)
    points = list(points) if points is not None else default_points()
    if not points:
        raise UsageError("no bench points")
    check_bench_options(reps=reps, warmup=warmup, rounds=rounds, warm=warm, cold=cold, kernels=kernels)
    modes = [m for m, on in (("warm", warm), ("cold", cold)) if on]
    missing = sorted({f"{p.config} not built in {n}" for p in points for n in names
                      if L.is_built(libs[n], p.config) is False})  # fmt: skip
    if missing:
        raise UsageError("cannot bench: " + "; ".join(missing))
    warnings: list[str] = []  # scale-by-value kernels (vLLM 0.6.4) get host numbers: no sync per launch
    dev = torch.device(device)
    say = progress or (lambda msg: None)
    timer = Timer(dev)
    l2 = int(l2_bytes or l2_bytes_of(dev))
    env = collect_env(device, info) if collect_environment else {"variants": info}

    copy_n = int(copy_bytes or max(2**30, 32 * l2))
    say(f"copy bandwidth: {copy_n / 2**30:.2f} GiB dst.copy_(src)")
    copy_bw = measure_copy_bandwidth(dev, copy_n, timer=timer)
    flush = L2Flush(dev, l2, flush_bytes) if "cold" in modes else None

    groups: dict[tuple[Any, ...], list[BenchPoint]] = {}
    for p in points:
        groups.setdefault(p.pool_key, []).append(p)

    raw: dict[tuple[BenchPoint, str, str], dict[str, list[list[float]]]] = {}
    reps_of: dict[tuple[BenchPoint, str], int] = {}
    matches: dict[tuple[BenchPoint, str], dict[str, bool]] = {}
    grouped: dict[tuple[BenchPoint, str], dict[str, bool | None]] = {}
    round_ids: dict[tuple[BenchPoint, str], list[int]] = {}
    mismatches: list[str] = []
    skipped: list[str] = []
    pools_info: list[dict[str, Any]] = []
    windows: list[dict[str, Any]] = []
    smi_gpu = (dev.index or 0) if dev.type == "cuda" and not os.environ.get("CUDA_VISIBLE_DEVICES") else None
    sampler = SmiSampler(gpu=smi_gpu) if (sample_clocks and dev.type == "cuda") else None
    if sampler is not None:
        sampler.start()
    try:
        for gi, (key, gpoints) in enumerate(groups.items()):
            p0 = gpoints[0]
            nblocks = pool_blocks(gpoints, l2, l2_multiple=pool_l2_multiple)
            if dev.type == "cuda":
                free, _total = torch.cuda.mem_get_info(dev)
                limit = int(0.8 * free / p0.block_bytes)
                if nblocks > limit:
                    fits = [p for p in gpoints if p.num_blocks + 1 <= limit]
                    for p in gpoints:
                        if p not in fits:
                            skipped.append(f"{p.name}: needs {p.kv_bytes / 1e9:.1f} GB of KV, "
                                           f"{0.8 * free / 1e9:.1f} GB usable")  # fmt: skip
                    gpoints = fits
                    if not gpoints:
                        continue
                    nblocks = min(limit, pool_blocks(gpoints, l2, l2_multiple=pool_l2_multiple))
            pool_bytes = nblocks * p0.block_bytes
            say(f"pool {gi + 1}/{len(groups)}: {p0.dtype} {p0.shape} seed {p0.seed}: {nblocks} blocks, "
                f"{pool_bytes / 1e9:.2f} GB ({pool_bytes / l2:.0f}x L2)")  # fmt: skip
            pools_info.append({"key": list(key), "blocks": nblocks, "bytes": pool_bytes})
            pool = make_kv_pool(nblocks, p0.num_kv_heads, p0.head_size, p0.block_size, p0.dtype, p0.kv_cache_dtype,
                                device=dev, generator=make_generator(dev, p0.seed * 7919 + gi))  # fmt: skip
            setups = {}
            for pi, p in enumerate(gpoints):
                inp = make_inputs(dtype=p.dtype, kv_cache_dtype=p.kv_cache_dtype, head_size=p.head_size,
                                  block_size=p.block_size, num_heads=p.num_heads, num_kv_heads=p.num_kv_heads,
                                  seq_lens=[p.context] * p.batch, alibi=False,
                                  seed=p.seed * 1_000_003 + gi * 1009 + pi, device=dev, kv_pool=pool,
                                  max_seq_len=p.max_seq_len)  # fmt: skip
                for k in _kernels_of(p, kernels):
                    setups[(p, k)] = (inp, {n: L.make_buffers(inp, k) for n in names})
            if check_outputs:
                for (p, k), (inp, bufs) in setups.items():
                    took = grouped.setdefault((p, k), {})
                    for n in names:
                        L.poison(bufs[n])
                        took[n] = L.launch(libs[n], k, inp, bufs[n])
                    L.synchronize(dev)
                    ref = bufs[names[0]].out
                    res = {}
                    for n in names:
                        o = bufs[n].out
                        ok = bool(L.all_written(o) and torch.equal(o, ref))
                        res[n] = ok
                        if not ok:
                            why = (
                                f"{L.count_unwritten(o)} unwritten"
                                if not L.all_written(o)
                                else f"differs from {names[0]}"
                            )
                            mismatches.append(f"{n}: {k} {p.name}: output {why}")
                    matches[(p, k)] = res
            for (p, k), (inp, bufs) in setups.items():
                base_fn = L.make_launcher(libs[names[0]], k, inp, bufs[names[0]])
                if adaptive:
                    probe = time_interleaved([base_fn], reps=5, warmup=2, timer=timer)[0]
                    reps_of[(p, k)] = adaptive_reps(reps, sorted(probe)[len(probe) // 2])
                else:
                    reps_of[(p, k)] = reps
            for rnd in range(rounds):
                t0 = time.time()
                for (p, k), (inp, bufs) in setups.items():
                    launchers = [L.make_launcher(libs[n], k, inp, bufs[n]) for n in names]
                    for m in modes:
                        us = time_interleaved(launchers, reps=reps_of[(p, k)], warmup=warmup, timer=timer,
                                              flush=flush if m == "cold" else None)  # fmt: skip
                        slot = raw.setdefault((p, k, m), {n: [] for n in names})
                        for n, u in zip(names, us):
                            slot[n].append(u)
                    round_ids.setdefault((p, k), []).append(len(windows))
                windows.append({"round": rnd, "pool": gi, "t0": t0, "t1": time.time()})
                say(
                    f"round {rnd + 1}/{rounds} of pool {gi + 1}/{len(groups)} done ({time.perf_counter() - t_start:.0f} s)"
                )
            del setups, pool
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        if sampler is not None:
            sampler.stop()
    for w in windows:
        w["smi"] = sampler.window(w["t0"], w["t1"]) if sampler is not None else None

    results = finish_results(raw, names, copy_bw["bytes_per_s"], matches if check_outputs else None,
                             grouped if check_outputs else None)  # fmt: skip
    for r in results:
        r.rounds = round_ids.get((r.point, r.kernel), [])
        r.flagged = any((windows[i].get("smi") or {}).get("flagged") for i in r.rounds)
    if collect_environment and dev.type == "cuda":
        smi_after = nvidia_smi_query()
        if smi_after is not None:
            env["nvidia_smi_after"] = smi_after
    if sampler is not None and not sampler.available:
        warnings.append("nvidia-smi not found: clocks, power and throttling were not recorded per round")
    if timer.host_bound:
        warnings.append(f"{timer.host_bound} of {timer.chunks} chunks of launches were queued by the host slower "
                        "than the GPU ran them, after retries: their short kernels' times include launch gaps")  # fmt: skip
    settings = {
        "reps": reps, "adaptive_reps": adaptive, "warmup": warmup, "rounds": rounds, "modes": modes,
        "kernels": list(kernels), "device": str(dev), "l2_bytes": l2,
        "flush": flush.method if flush is not None else None, "pools": pools_info,
        "partition_size": PARTITION_SIZE, "points": [p.to_dict() for p in points],
        "timing": "CUDA event pair around each launch; median of per-round medians; variants in cycles where each "
                  "follows each (itself included) once; "
                  "speedup interval = min..max over rounds of the per-round ratio of medians",
        "lead": {"chunks": timer.chunks, "retried": timer.retried, "host_bound": timer.host_bound,
                 "rule": "each chunk of cycles queued while a GPU-side sleep runs; a chunk queued after the sleep "
                         "ended is timed again with twice the sleep"},
    }  # fmt: skip
    return BenchReport(baseline=names[0], variants=names, results=results, copy_bandwidth=copy_bw, settings=settings,
                       env=env, mismatches=mismatches, warnings=warnings, seconds=time.perf_counter() - t_start,
                       point_set=point_set_name, variant_info=info, rounds=windows, skipped_points=skipped)  # fmt: skip
