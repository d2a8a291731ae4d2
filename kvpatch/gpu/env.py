"""What a measurement ran on: GPU, driver, torch, nvcc, and the clocks/power/throttling per round.

:func:`collect_env` is the one-off snapshot a report carries. :class:`SmiSampler`
runs ``nvidia-smi --query-gpu=... -lms N`` in the background for a whole bench
(read only: it queries, it never sets anything), and :func:`window_summary` reduces
the samples of one round's time window to SM/memory clock ranges, peak power and
temperature, and the decoded ``clocks_event_reasons.active`` bits, flagging rounds
that ran power-capped or throttled.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import BuildError


def require_cuda() -> None:
    """A GPU and a CUDA build of torch, or a one-line error. Here, not in the command layer, so that
    commands run on prebuilt libraries (``--lib``) load neither libclang nor git."""
    try:
        import torch
    except ImportError:
        raise BuildError("this command needs torch built with CUDA (pip install torch), and a GPU") from None
    if not torch.cuda.is_available():
        raise BuildError(f"this command runs on a GPU, and none is visible to torch {torch.__version__}")


SMI_FIELDS = (
    "name", "uuid", "pci.bus_id", "driver_version", "vbios_version", "clocks.sm", "clocks.mem",
    "clocks.max.sm", "clocks.max.mem", "clocks.applications.graphics", "clocks.applications.memory",
    "power.draw", "power.limit", "temperature.gpu", "persistence_mode", "compute_mode",
    "clocks_event_reasons.active",
)  # fmt: skip

#: What the background sampler records, in this order.
SAMPLE_FIELDS = ("timestamp", "index", "clocks.sm", "clocks.mem", "power.draw", "power.limit",
                 "temperature.gpu", "clocks_event_reasons.active")  # fmt: skip

#: nvidia-smi's clocks_event_reasons bits (NVML nvmlClocksEventReasons).
EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
#: The reasons that mean the clocks were held down while we measured.
THROTTLE_REASONS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                              "hw_power_brake_slowdown"})  # fmt: skip


def decode_event_reasons(value: str | int | None) -> list[str]:
    """``'0x0000000000000004'`` (or an int) -> ``['sw_power_cap']``; unknown bits as ``bit_0x...``."""
    if value is None or value == "" or (isinstance(value, str) and value.strip().startswith("[")):
        return []
    try:
        bits = int(value, 0) if isinstance(value, str) else int(value)
    except ValueError:
        return []
    names = []
    for bit, name in EVENT_REASONS.items():
        if bits & bit:
            names.append(name)
            bits &= ~bit
    b = 1
    while bits:
        if bits & b:
            names.append(f"bit_{b:#x}")
            bits &= ~b
        b <<= 1
    return names


def smi_available() -> bool:
    """Whether nvidia-smi is here to ask (read only)."""
    return shutil.which("nvidia-smi") is not None


def _run(cmd: list[str], timeout: float = 15.0) -> str | None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout if p.returncode == 0 else None


def parse_smi_csv(text: str, fields: Sequence[str]) -> list[dict[str, str]]:
    """``--format=csv,noheader,nounits`` lines -> one dict per line with all fields."""
    rows = []
    for line in text.strip().splitlines():
        vals = [v.strip() for v in line.split(",")]
        if len(vals) == len(fields):
            rows.append(dict(zip(fields, vals)))
    return rows


def nvidia_smi_query(fields: Sequence[str] = SMI_FIELDS) -> list[dict[str, str]] | None:
    """One dict per GPU from ``nvidia-smi --query-gpu`` (read only); fields this
    driver does not know are dropped. None without nvidia-smi."""
    if not smi_available():
        return None

    def query(fs: Sequence[str]) -> list[dict[str, str]] | None:
        outp = _run(["nvidia-smi", f"--query-gpu={','.join(fs)}", "--format=csv,noheader,nounits"])
        return None if outp is None else parse_smi_csv(outp, fs)

    rows = query(fields)
    if rows is not None:
        return rows
    good = [f for f in fields if query([f]) is not None]  # drop unknown fields
    return query(good) if good else None


def collect_env(device: str = "cuda", variant_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """GPU, driver, clocks (nvidia-smi if present), torch/CUDA/nvcc versions, caller's variant info."""
    import torch

    env: dict[str, Any] = {
        "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(idx)
        gpu: dict[str, Any] = {"index": idx, "name": p.name, "capability": f"{p.major}.{p.minor}",
                               "sm_count": p.multi_processor_count, "total_memory": p.total_memory}  # fmt: skip
        for attr in ("L2_cache_size", "clock_rate", "memory_clock_rate", "memory_bus_width", "uuid", "pci_bus_id"):
            if hasattr(p, attr):
                gpu[attr] = str(getattr(p, attr)) if attr == "uuid" else getattr(p, attr)
        env["gpu"] = gpu
        try:
            env["cuda_driver_api_version"] = torch._C._cuda_getDriverVersion()
        except Exception:  # noqa: BLE001
            pass
    smi = nvidia_smi_query()
    if smi is not None:
        env["nvidia_smi"] = smi
    nvcc = shutil.which("nvcc")
    if nvcc:
        v = _run([nvcc, "--version"])
        if v:
            env["nvcc"] = v.strip().splitlines()[-1]
    if variant_info:
        env["variants"] = variant_info
    return env


# --------------------------------------------------------------------------- per-round sampling


@dataclass
class Sample:
    t: float  # host epoch seconds
    gpu: int
    sm_mhz: float | None
    mem_mhz: float | None
    power_w: float | None
    power_limit_w: float | None
    temp_c: float | None
    reasons: tuple[str, ...]


def _num(s: str | None) -> float | None:
    try:
        return float(s) if s is not None else None
    except ValueError:
        return None


def parse_sample_line(line: str) -> Sample | None:
    """One line of the sampler's CSV (``SAMPLE_FIELDS``), or None if it does not parse."""
    rows = parse_smi_csv(line, SAMPLE_FIELDS)
    if not rows:
        return None
    r = rows[0]
    try:
        t = _dt.datetime.strptime(r["timestamp"], "%Y/%m/%d %H:%M:%S.%f").timestamp()  # local time, like nvidia-smi
    except ValueError:
        return None
    return Sample(t=t, gpu=int(_num(r["index"]) or 0), sm_mhz=_num(r["clocks.sm"]), mem_mhz=_num(r["clocks.mem"]),
                  power_w=_num(r["power.draw"]), power_limit_w=_num(r["power.limit"]),
                  temp_c=_num(r["temperature.gpu"]),
                  reasons=tuple(decode_event_reasons(r["clocks_event_reasons.active"])))  # fmt: skip


def window_summary(samples: Sequence[Sample], t0: float, t1: float, gpu: int | None = None) -> dict[str, Any]:
    """The samples taken in [t0, t1] (host epoch seconds) reduced to ranges and flags.

    ``throttled`` names the throttle reasons seen (power cap, slowdowns); ``power_capped``
    is true when the SW power cap bit was set or the draw reached 98% of the limit."""
    sel = [s for s in samples if t0 <= s.t <= t1 and (gpu is None or s.gpu == gpu)]
    out: dict[str, Any] = {"t0": t0, "t1": t1, "samples": len(sel)}
    if not sel:
        return out

    def rng(vals: list[float | None]) -> list[float] | None:
        v = [x for x in vals if x is not None]
        return [min(v), max(v)] if v else None

    reasons = sorted({r for s in sel for r in s.reasons})
    throttled = sorted(set(reasons) & THROTTLE_REASONS)
    capped = "sw_power_cap" in reasons or any(
        s.power_w is not None and s.power_limit_w and s.power_w >= 0.98 * s.power_limit_w for s in sel
    )
    out.update(sm_mhz=rng([s.sm_mhz for s in sel]), mem_mhz=rng([s.mem_mhz for s in sel]),
               power_w=rng([s.power_w for s in sel]), power_limit_w=rng([s.power_limit_w for s in sel]),
               temp_c=rng([s.temp_c for s in sel]), reasons=reasons, throttled=throttled,
               power_capped=bool(capped), flagged=bool(throttled or capped))  # fmt: skip
    return out


class SmiSampler:
    """``nvidia-smi`` in loop mode for the length of a bench (a no-op without nvidia-smi).

    ``with SmiSampler() as s: ...`` then ``s.samples()``; :meth:`window` summarises
    a time window. The GPU is only queried, never configured."""

    def __init__(self, interval_ms: int = 100, gpu: int | None = None) -> None:
        self.interval_ms = interval_ms
        self.gpu = gpu
        self._proc: subprocess.Popen | None = None
        self._file: Any = None
        self._samples: list[Sample] | None = None
        self.available = smi_available()

    def start(self) -> "SmiSampler":
        if not self.available:
            return self
        self._file = tempfile.TemporaryFile(mode="w+")
        cmd = ["nvidia-smi", f"--query-gpu={','.join(SAMPLE_FIELDS)}", "--format=csv,noheader,nounits",
               "-lms", str(self.interval_ms)]  # fmt: skip
        if self.gpu is not None:
            cmd += ["-i", str(self.gpu)]
        try:
            self._proc = subprocess.Popen(cmd, stdout=self._file, stderr=subprocess.DEVNULL)
        except OSError:
            self.available = False
        time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._proc = None
        if self._file is not None:
            self._file.seek(0)
            self._samples = [s for s in map(parse_sample_line, self._file.read().splitlines()) if s is not None]
            self._file.close()
            self._file = None

    def __enter__(self) -> "SmiSampler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def samples(self) -> list[Sample]:
        return list(self._samples or [])

    def window(self, t0: float, t1: float) -> dict[str, Any] | None:
        """Summary of [t0, t1]; None when nothing was sampled (no nvidia-smi)."""
        if not self.available or self._samples is None:
            return None
        return window_summary(self._samples, t0, t1, self.gpu)
