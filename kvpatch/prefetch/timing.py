"""Timing and environment for the decode benchmark: CUDA graph capture, interleaved
rounds timed with event pairs, nvidia-smi readings (read only).

torch is imported inside functions only.
"""

from __future__ import annotations

import datetime as _dt
import platform
import shutil
import statistics
import subprocess
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..gpu.timing import carryover_order


def round_stats(rounds: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(rounds), "min": min(rounds), "max": max(rounds)}


_SMI_ROUND = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "clocks_event_reasons.active")
_SMI_ONCE = ("name", "driver_version", "clocks.max.sm", "clocks.max.mem", "power.limit", "memory.total")


def smi(fields: Sequence[str], index: int = 0) -> dict[str, str] | None:
    """One GPU's ``nvidia-smi --query-gpu`` values (read only), None without it."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", f"--id={index}"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    vals = [v.strip() for v in out.stdout.strip().split(",")]
    return dict(zip(fields, vals)) if out.returncode == 0 and len(vals) == len(fields) else None


def power_capped(reasons: str | None) -> bool:
    """Whether nvidia-smi's active clock-event bitmask holds SW power cap (0x4) or HW slowdown (0x8/0x40/0x80)."""
    try:
        mask = int(reasons or "0", 16)
    except ValueError:
        return False
    return bool(mask & (0x4 | 0x8 | 0x40 | 0x80))


def collect_env(device: Any, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    import torch

    dev = torch.device(device)
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    p = torch.cuda.get_device_properties(idx)
    env: dict[str, Any] = {
        "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "gpu": p.name,
        "capability": f"{p.major}.{p.minor}",
        "sm_count": p.multi_processor_count,
        "l2_bytes": int(getattr(p, "L2_cache_size", 0)),
        "memory_bytes": int(p.total_memory),
        "smi": smi(_SMI_ONCE + _SMI_ROUND, idx),
    }
    nvcc = shutil.which("nvcc")
    if nvcc:
        try:
            env["nvcc"] = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[-1]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            pass
    env.update(extra or {})
    return env



def capture(fn: Callable[[], None], device: Any) -> Any:
    """Run ``fn`` once eagerly on a side stream (cuBLAS setup), then capture it in a graph."""
    import torch

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize(device)
    return graph


def time_rounds(
    launchers: Mapping[str, Callable[[], None]],
    *,
    rounds: int,
    reps: int,
    device: Any,
    flush: Callable[[], None] | None,
    flushed: Iterable[str] = (),
) -> tuple[dict[str, list[float]], list[dict[str, Any]]]:
    """Interleaved timing: per round, ``reps`` launches of every launcher (rounded up to a
    multiple of their number) in cycles of :func:`kvpatch.gpu.timing.carryover_order` (each
    follows each, itself included, equally often; the start moves each round), each timed
    alone with an event pair; ``flush`` runs
    before each launch of the ``flushed`` launchers, outside the pair. Returns
    per-launcher round medians (us) and nvidia-smi readings per round."""
    import torch

    names = list(launchers)
    flushed = set(flushed)
    n = len(names)
    medians: dict[str, list[float]] = {k: [] for k in names}
    clocks: list[dict[str, Any]] = []
    cycle = carryover_order(n)
    sequence = cycle * -(-reps // n)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in sequence]
    idx = torch.device(device).index or 0
    for r in range(rounds):
        for name in names:  # untimed warm-up of this round
            launchers[name]()
        torch.cuda.synchronize(device)
        slots: dict[str, list[int]] = {k: [] for k in names}
        start = (r * n) % len(sequence)
        for k, i in enumerate(sequence[start:] + sequence[:start]):
            name = names[i]
            if flush is not None and name in flushed:
                flush()
            events[k][0].record()
            launchers[name]()
            events[k][1].record()
            slots[name].append(k)
        torch.cuda.synchronize(device)
        for name in names:
            medians[name].append(statistics.median(events[k][0].elapsed_time(events[k][1]) * 1e3 for k in slots[name]))
        reading = smi(_SMI_ROUND, idx) or {}
        reading["power_capped"] = power_capped(reading.get("clocks_event_reasons.active"))
        clocks.append(reading)
    return medians, clocks

