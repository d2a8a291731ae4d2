"""``kvpatch bench-decode-sweep`` (GPU, a maintainer's command, hidden from ``--help``): the
weight prefetch's windows measured and chosen on the decode step, then benched with every
control, in one unattended, time-budgeted run (what ``scripts/gpu_decode.sh`` runs).

Stages, the most important first (each writes ``sweep.json`` and its own JSON when done, so a
run cut short keeps what finished; each stops at its share of ``--budget``):

1. **lead** (:func:`~.bench.run_bench_decode`): the configuration to beat before any sweep,
   :data:`~.options.DEFAULT_WINDOWS`, on Llama-3.1-8B and Llama-3.2-1B bf16, batch 1/4/8 x
   context 1k/4k, with every control: ``stock``, ``stock-aa``, ``stock+zero``, ``stock+wpf``,
   the side-stream ``attn->oproj`` window and the in-kernel form at the same cap and hint
   (``stock+attn``, ``tail``, ``tail+zero``), ``patched`` and ``patched+wpf``; 7 rounds.
2. **micro** (:func:`~.micro.run_micro_gemm`): the 8B o_proj / gate_up / down GEMMs after an
   HBM-idle kernel on the clean flush, cold vs prefetched vs warm, batch 1/4/8.
3. **kernels** (:func:`~.kernels.run_window_kernels`): per model, batch and window, the next
   GEMM and the window's kernels with vs without that window's prefetch, per cap and hint.
4. **steps**: each window alone in the step at its best kernel configuration per batch bucket
   (:func:`step_windows`), all of them together, and that combination's zero-byte twin.
5. **final**: the pick (:func:`pick_windows`: per batch bucket, the windows whose step ratio
   beat stock by more than :data:`MIN_GAIN`) benched like stage 1, on fresh rounds (a pick made
   on noise regresses here), 7 rounds.
6. **guard-off**: the lead configuration at two points without the evict_last guard, to show
   what the guard prevents (:func:`~.arms.carryover_check`).

Everything lands in ``DIR``: ``sweep.json`` (the log, each stage's summary, the pick),
``decode_lead.json``, ``micro.json``, ``kernels.json``, ``steps.json``, ``decode_final.json``,
``guard_off.json``; the command writes the text (``sweep.txt``) at the end.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .picks import (  # noqa: F401 - the sweep's settings and choices, re-exported
    BATCHES,
    CONTEXTS,
    DTYPE,
    KERNEL_CAPS_MIB,
    KERNEL_HINTS,
    KERNEL_ROUNDS,
    LAYERS,
    MICRO_SHAPES,
    MIN_GAIN,
    MODELS,
    ROUNDS,
    SHARES,
    STEP_ROUNDS,
    TAIL,
    all_identical,
    best_single,
    control_arms,
    pick_windows,
    step_arms,
    step_windows,
)
from .windows import TailPrefetch


def run_sweep(
    libs: Mapping[str, Any],
    out_dir: str | Path,
    *,
    budget_s: float = 420.0,
    prefetch_library: Any = None,
    device: Any = "cuda",
    stages: Sequence[str] = tuple(SHARES),
    tail: TailPrefetch | None = TAIL,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The stages of the module docstring (those in ``stages``); returns (and writes) ``sweep.json``."""
    from ..fsutil import write_atomic
    from ..gpu.flush import L2Flush
    from .bench import cuda_device, decode_env, prefetch_library_for

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
    flush = L2Flush(dev, env["l2_bytes"])  # one flush buffer for every stage
    result: dict[str, Any] = {"format": "kvpatch.pf-sweep/2", "env": env, "budget_s": budget_s,
                              "stages": list(stages), "log": log, "errors": {}}  # fmt: skip

    def save() -> None:
        result["seconds"] = round(time.perf_counter() - t_start, 1)
        write_atomic(out / "sweep.json", json.dumps(result, indent=1, default=str) + "\n")

    def until(stage: str) -> float:
        return t_start + SHARES[stage] * budget_s

    def stage(name: str, fn: Callable[[], Any]) -> Any:
        if name not in stages:
            return None
        if time.perf_counter() > until(name):
            note(f"{name}: skipped (time budget)")
            result.setdefault("skipped_stages", []).append(name)
            return None
        note(f"{name}: start")
        try:
            value = fn()
        except Exception as e:  # noqa: BLE001 - the later stages still run; the error is recorded
            note(f"{name} failed: {type(e).__name__}: {e}")
            result["errors"][name] = f"{type(e).__name__}: {e}"
            value = None
        save()
        return value

    from .stages import Stages

    s = Stages(libs, out, pf_lib, dev, note=note, until=until, result=result, tail=tail, flush=flush)
    stage("lead", s.lead)
    stage("micro", s.micro)
    stage("kernels", s.kernels)
    stage("steps", s.steps)
    stage("final", s.final)
    stage("guard_off", s.guard_off)
    note("done")
    save()
    return result
