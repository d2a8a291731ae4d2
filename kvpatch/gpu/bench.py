"""Time variants side by side: v1 and v2 at every point, warm and cold L2.

Method (see NOTES.md and the device METHOD.md):

* One KV pool per shape (dtype, KV dtype, KV heads, head size, block size), shared
  by all its points, sized several times the L2 (default: 64x L2 and at least 1.2x
  the largest point's blocks; ~5 GB for the default matrix), filled with randn.
  Every point gets its own random scattered block table (distinct blocks), batch
  sequences all of length ``context``.
* Both kernels are timed at every point; ``dispatched`` marks the one vLLM would
  launch (v1 iff max_seq_len <= 8192 and (one partition or seqs*heads > 512)).
* warm: back-to-back launches; cold: a buffer of >= 2x L2 is overwritten before
  each launch, outside the timed region (one CUDA event pair around the kernel
  launch only; for v2 that covers its two kernels).
* Variants are interleaved within a round (stock, A, B, ... rotated each repeat) so
  drift hits all alike; a GPU-side sleep before each round lets the host queue the
  whole round ahead, so small kernels are not timed with host launch gaps. Each
  (point, kernel, mode) runs ``rounds`` rounds spread over the run; a variant's time
  is the median of its per-round medians, with the pooled p10/p90 and quartiles.
* Per point and variant: microseconds, speedup over stock, unique KV bytes per
  second (the K+V bytes of the blocks the sequences cover) and that as a fraction
  of the device-to-device copy bandwidth (read + write bytes) measured in the run.
* Before timing, each variant's output is checked bit-identical to stock's
  (NaN-poisoned buffers); a mismatch is listed in ``mismatches``.

Standalone, on the GPU machine::

    python -m kvpatch.gpu.bench --lib stock=s.so:stock --lib patched=p.so:patched \\
        --json r.json --plot r.png [--quick]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Sequence

from . import harness as H

MODES = ("warm", "cold")
EXIT_MISMATCH = 6

#: Default repeat counts: 50 timed launches per variant per round, 3 rounds, 5
#: untimed warm-up launches per variant before each round.
DEFAULT_REPS = 50
DEFAULT_ROUNDS = 3
DEFAULT_WARMUP = 5


# --------------------------------------------------------------------------- points


@dataclass(frozen=True)
class BenchPoint:
    """One batch shape: ``batch`` sequences of ``context`` tokens each."""

    dtype: str
    batch: int
    context: int
    num_heads: int = 32
    num_kv_heads: int = 8
    head_size: int = 128
    block_size: int = 16
    kv_cache_dtype: str = "auto"

    @property
    def name(self) -> str:
        s = f"{self.dtype} B={self.batch} ctx={self.context}"
        if (self.num_heads, self.num_kv_heads, self.head_size, self.block_size, self.kv_cache_dtype) != (
            32, 8, 128, 16, "auto"
        ):
            s += (f" heads={self.num_heads}/{self.num_kv_heads} head={self.head_size}"
                  f" block={self.block_size} kv={self.kv_cache_dtype}")
        return s

    @property
    def dispatched(self) -> str:
        return H.dispatched_kernel(self.batch, self.num_heads, self.context)

    @property
    def blocks_per_seq(self) -> int:
        return H.cdiv(self.context, self.block_size)

    @property
    def num_blocks(self) -> int:
        return self.batch * self.blocks_per_seq

    @property
    def block_bytes(self) -> int:
        """K + V bytes of one block (all KV heads)."""
        elem = H.cache_elem_size(self.dtype, self.kv_cache_dtype)
        return 2 * self.num_kv_heads * self.head_size * self.block_size * elem

    @property
    def kv_bytes(self) -> int:
        """Unique K + V bytes the batch's blocks cover (blocks are distinct)."""
        return self.num_blocks * self.block_bytes

    @property
    def pool_key(self) -> tuple[Any, ...]:
        return (self.dtype, self.kv_cache_dtype, self.num_kv_heads, self.head_size, self.block_size)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_points(
    *,
    dtypes: Sequence[str] = ("fp16", "bf16"),
    batches: Sequence[int] = (1, 4, 16, 64),
    contexts: Sequence[int] = (1024, 4096, 16384),
    num_heads: int = 32,
    num_kv_heads: int = 8,
    head_size: int = 128,
    block_size: int = 16,
    kv_cache_dtype: str = "auto",
) -> list[BenchPoint]:
    """dtype x batch x context, in that nesting order."""
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    for d in dtypes:
        if d not in H.DTYPES:
            raise ValueError(f"unknown dtype {d!r}: choose from {', '.join(H.DTYPES)}")
    if kv_cache_dtype not in H.KV_CACHE_DTYPES:
        raise ValueError(f"unknown kv cache dtype {kv_cache_dtype!r}")
    if any(b < 1 for b in batches) or any(c < 1 for c in contexts):
        raise ValueError("batches and contexts must be >= 1")
    return [
        BenchPoint(d, b, c, num_heads, num_kv_heads, head_size, block_size, kv_cache_dtype)
        for d, b, c in itertools.product(dtypes, batches, contexts)
    ]


def default_points() -> list[BenchPoint]:
    """GQA 32/8, head 128, block 16, fp16 and bf16, batch 1/4/16/64 x context 1k/4k/16k."""
    return make_points()


def quick_points() -> list[BenchPoint]:
    """fp16 and bf16, batch 1/64 x context 1024/16384 (both kernels each)."""
    return make_points(batches=(1, 64), contexts=(1024, 16384))


# --------------------------------------------------------------------------- results


@dataclass
class VariantTiming:
    """One variant at one (point, kernel, mode). Times in microseconds."""

    samples_us: list[list[float]]  # per round
    median_us: float = 0.0  # median of the round medians
    round_medians_us: list[float] = field(default_factory=list)
    p10_us: float = 0.0
    p90_us: float = 0.0
    q1_us: float = 0.0
    q3_us: float = 0.0
    speedup: float = 1.0  # baseline median / this median
    speedup_rounds: list[float] = field(default_factory=list)
    kv_bytes_per_s: float = 0.0
    copy_fraction: float = 0.0
    outputs_match: bool | None = None

    @classmethod
    def from_samples(cls, samples_us: list[list[float]]) -> "VariantTiming":
        pooled = [x for r in samples_us for x in r]
        rm = [H.median(r) for r in samples_us if r]
        return cls(
            samples_us=samples_us,
            median_us=H.median(rm),
            round_medians_us=rm,
            p10_us=H.quantile(pooled, 0.10),
            p90_us=H.quantile(pooled, 0.90),
            q1_us=H.quantile(pooled, 0.25),
            q3_us=H.quantile(pooled, 0.75),
        )

    @property
    def spread(self) -> float:
        """(p90 - p10) / median."""
        return (self.p90_us - self.p10_us) / self.median_us if self.median_us else math.nan


@dataclass
class BenchResult:
    point: BenchPoint
    kernel: str
    mode: str
    variants: dict[str, VariantTiming]

    @property
    def dispatched(self) -> bool:
        return self.kernel == self.point.dispatched

    def to_dict(self) -> dict[str, Any]:
        return {
            "point": self.point.to_dict(),
            "name": self.point.name,
            "kernel": self.kernel,
            "mode": self.mode,
            "dispatched": self.dispatched,
            "kv_bytes": self.point.kv_bytes,
            "variants": {n: asdict(v) for n, v in self.variants.items()},
        }


def finish_results(
    raw: dict[tuple[BenchPoint, str, str], dict[str, list[list[float]]]],
    names: Sequence[str],
    copy_bytes_per_s: float,
    outputs_match: dict[tuple[BenchPoint, str], dict[str, bool]] | None = None,
) -> list[BenchResult]:
    """Raw per-round samples -> results with stats, speedups and throughput."""
    base = names[0]
    out: list[BenchResult] = []
    for (point, kernel, mode), per_var in raw.items():
        timings = {n: VariantTiming.from_samples(per_var[n]) for n in names if n in per_var}
        b = timings[base]
        for n, t in timings.items():
            t.speedup = b.median_us / t.median_us
            t.speedup_rounds = [x / y for x, y in zip(b.round_medians_us, t.round_medians_us)]
            t.kv_bytes_per_s = point.kv_bytes / (t.median_us * 1e-6)
            t.copy_fraction = t.kv_bytes_per_s / copy_bytes_per_s if copy_bytes_per_s else math.nan
            if outputs_match is not None and (point, kernel) in outputs_match:
                t.outputs_match = outputs_match[(point, kernel)].get(n)
        out.append(BenchResult(point, kernel, mode, timings))
    return out


def summarize_results(results: Iterable[BenchResult], names: Sequence[str]) -> list[dict[str, Any]]:
    """Speedup statistics per variant x dtype x mode x scope, where scope is
    ``dispatched`` (the kernel vLLM launches at each point: the headline), ``v1`` or
    ``v2`` (that kernel at every point)."""
    results = list(results)
    rows: list[dict[str, Any]] = []
    dtypes = list(dict.fromkeys(r.point.dtype for r in results))
    modes = list(dict.fromkeys(r.mode for r in results))
    kernels = list(dict.fromkeys(r.kernel for r in results))
    for name in names[1:]:
        for dt in dtypes:
            for mode in modes:
                for scope in ["dispatched", *kernels]:
                    sel = [
                        r for r in results
                        if r.point.dtype == dt and r.mode == mode and name in r.variants
                        and (r.dispatched if scope == "dispatched" else r.kernel == scope)
                    ]
                    if not sel:
                        continue
                    sp = [r.variants[name].speedup for r in sel]
                    rows.append({"variant": name, "dtype": dt, "mode": mode, "scope": scope, **H.summarize(sp)})
    return rows


@dataclass
class BenchReport:
    baseline: str
    variants: list[str]
    results: list[BenchResult]
    copy_bandwidth: dict[str, Any]
    settings: dict[str, Any]
    env: dict[str, Any] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def summary(self) -> list[dict[str, Any]]:
        return summarize_results(self.results, self.variants)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "kvpatch-bench",
            "version": 1,
            "baseline": self.baseline,
            "variants": self.variants,
            "seconds": self.seconds,
            "env": self.env,
            "settings": self.settings,
            "copy_bandwidth": self.copy_bandwidth,
            "mismatches": self.mismatches,
            "warnings": self.warnings,
            "summary": self.summary,
            "results": [r.to_dict() for r in self.results],
        }

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(H.json_safe(self.to_dict()), indent=indent, allow_nan=False)

    def write_json(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w") as f:
            f.write(self.to_json())

    # ---- rendering (rich, imported lazily)

    def tables(self) -> list[Any]:
        """Two rich tables: per point/kernel (stock us and per-variant speedups, warm
        and cold) and the speedup summary over the dispatched kernels."""
        from rich.table import Table

        modes = list(dict.fromkeys(r.mode for r in self.results))
        others = self.variants[1:]
        by_key: dict[tuple[BenchPoint, str], dict[str, BenchResult]] = {}
        for r in self.results:
            by_key.setdefault((r.point, r.kernel), {})[r.mode] = r
        bw = self.copy_bandwidth.get("bytes_per_s", 0) / 1e12
        t = Table(
            title=f"speedup over {self.baseline} (x); k* = the kernel vLLM dispatches; "
            f"copy BW {bw:.2f} TB/s; KV = best unique-KV TB/s",
            title_justify="left",
        )
        for col in ("dtype", "B", "ctx", "k"):
            t.add_column(col, justify="right" if col in ("B", "ctx") else "left")
        for m in modes:
            t.add_column(f"{self.baseline}\n{m} us", justify="right")
            for n in others:
                t.add_column(f"{n}\n{m}", justify="right")
        t.add_column("KV\nTB/s", justify="right")
        for (point, kernel), per_mode in by_key.items():
            disp = "*" if kernel == point.dispatched else ""
            ctx = f"{point.context // 1024}k" if point.context % 1024 == 0 else str(point.context)
            dt = f"{point.dtype} {point.name.split(f'ctx={point.context}', 1)[1].strip()}".strip()
            row = [dt, str(point.batch), ctx, kernel + disp]
            best = 0.0
            for m in modes:
                r = per_mode.get(m)
                if r is None:
                    row += ["-"] * (1 + len(others))
                    continue
                base = r.variants[self.baseline]
                row.append(f"{base.median_us:.1f}" if base.median_us < 100 else f"{base.median_us:.0f}")
                for n in others:
                    v = r.variants.get(n)
                    row.append(_fmt_speedup(v.speedup, v.outputs_match) if v else "-")
                best = max([best] + [v.kv_bytes_per_s for v in r.variants.values()])
            row.append(f"{best / 1e12:.2f}")
            t.add_row(*row)
        s = Table(title="over the dispatched kernel: min / median / geomean", title_justify="left")
        for col in ("variant", "dtype", "mode", "n", "min", "median", "geomean"):
            s.add_column(col, justify="left" if col in ("variant", "dtype", "mode") else "right")
        for row in self.summary:
            if row["scope"] != "dispatched":
                continue
            s.add_row(row["variant"], row["dtype"], row["mode"], str(row["n"]),
                      f"{row['min']:.2f}", _fmt_speedup(row["median"]), f"{row['geomean']:.2f}")
        return [t, s]

    def print(self, console: Any = None) -> None:
        from rich.console import Console

        c = console or Console(width=None if sys.stdout.isatty() else 160)
        for tab in self.tables():
            c.print(tab)
        for m in self.mismatches:
            c.print(f"[red]MISMATCH[/red] {m}")
        for w in self.warnings:
            c.print(f"[yellow]warning[/yellow] {w}")


def _fmt_speedup(x: float, match: bool | None = None) -> str:
    s = f"{x:.2f}"
    if match is False:
        return f"[red]{s}![/red]"
    if x >= 1.02:
        return f"[green]{s}[/green]"
    if x <= 0.98:
        return f"[red]{s}[/red]"
    return s


# --------------------------------------------------------------------------- environment


_SMI_FIELDS = (
    "name", "uuid", "pci.bus_id", "driver_version", "vbios_version", "clocks.sm", "clocks.mem",
    "clocks.max.sm", "clocks.max.mem", "clocks.applications.graphics", "clocks.applications.memory",
    "power.draw", "power.limit", "temperature.gpu", "persistence_mode", "compute_mode",
    "clocks_event_reasons.active",
)


def _run(cmd: list[str], timeout: float = 15.0) -> str | None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout if p.returncode == 0 else None


def nvidia_smi_query(fields: Sequence[str] = _SMI_FIELDS) -> list[dict[str, str]] | None:
    """One dict per GPU from ``nvidia-smi --query-gpu`` (read only); fields this
    driver does not know are dropped. None without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return None

    def query(fs: Sequence[str]) -> list[dict[str, str]] | None:
        outp = _run(["nvidia-smi", f"--query-gpu={','.join(fs)}", "--format=csv,noheader,nounits"])
        if outp is None:
            return None
        rows = []
        for line in outp.strip().splitlines():
            vals = [v.strip() for v in line.split(",")]
            if len(vals) == len(fs):
                rows.append(dict(zip(fs, vals)))
        return rows

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
                               "sm_count": p.multi_processor_count, "total_memory": p.total_memory}
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


# --------------------------------------------------------------------------- timing primitives


class _Timer:
    """CUDA events on a CUDA device; a host clock for the CPU (tests: ops are synchronous)."""

    def __init__(self, device: Any) -> None:
        import torch

        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._pool: list[Any] = []

    def events(self, n: int) -> list[Any]:
        import torch

        while len(self._pool) < n:
            self._pool.append(torch.cuda.Event(enable_timing=True) if self.cuda else _HostEvent())
        return self._pool[:n]

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)

    def lead(self, seconds: float) -> None:
        """Keep the GPU busy for ``seconds`` so the host can queue ahead of it."""
        if not self.cuda or seconds <= 0:
            return
        import torch

        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is None:
            return
        p = torch.cuda.get_device_properties(self.device)
        khz = getattr(p, "clock_rate", None) or 1_980_000
        sleep(int(seconds * khz * 1e3))


class _HostEvent:
    def __init__(self) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: "_HostEvent") -> float:
        return (end.t - self.t) * 1e3  # ms, like torch.cuda.Event


#: Upper bound of the GPU-side lead before a round, and the per-launch host cost
#: added to the warm-up's measurement (two event records).
MAX_LEAD_S = 0.03
EVENT_COST_S = 10e-6


def time_interleaved(
    launchers: Sequence[Callable[[], None]],
    *,
    reps: int,
    warmup: int,
    timer: _Timer,
    flush: Callable[[], None] | None = None,
) -> list[list[float]]:
    """One round: ``warmup`` untimed launches of each, then ``reps`` repeats of all
    launchers (order rotated every repeat), each timed alone by an event pair;
    ``flush`` runs before each launch, outside the pair. Returns us per launcher."""
    n = len(launchers)
    t0 = time.perf_counter()
    for _ in range(warmup):
        for fn in launchers:
            if flush is not None:
                flush()
            fn()
    host = (time.perf_counter() - t0) / max(1, warmup * n) + EVENT_COST_S
    timer.sync()
    ev = timer.events(2 * reps * n)
    timer.lead(min(MAX_LEAD_S, 1.3 * host * reps * n))
    for r in range(reps):
        for j in range(n):
            i = (j + r) % n
            if flush is not None:
                flush()
            k = 2 * (r * n + i)
            ev[k].record()
            launchers[i]()
            ev[k + 1].record()
    timer.sync()
    return [[ev[2 * (r * n + i)].elapsed_time(ev[2 * (r * n + i) + 1]) * 1e3 for r in range(reps)] for i in range(n)]


def measure_copy_bandwidth(device: Any, nbytes: int, reps: int = 10, timer: _Timer | None = None) -> dict[str, Any]:
    """A large ``dst.copy_(src)``: bytes read + written per second (median of ``reps``)."""
    import torch

    timer = timer or _Timer(device)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src.random_(0, 256)
    dst = torch.empty_like(src)
    fn = lambda: dst.copy_(src)  # noqa: E731
    us = time_interleaved([fn], reps=reps, warmup=3, timer=timer)[0]
    med = H.median(us)
    del src, dst
    return {
        "bytes": nbytes,
        "bytes_moved": 2 * nbytes,
        "median_us": med,
        "samples_us": us,
        "bytes_per_s": 2 * nbytes / (med * 1e-6),
    }


def l2_bytes_of(device: Any, default: int = 50 * 2**20) -> int:
    import torch

    d = torch.device(device)
    if d.type == "cuda":
        p = torch.cuda.get_device_properties(d)
        v = getattr(p, "L2_cache_size", 0)
        if v:
            return int(v)
    return default


def pool_blocks(points: Sequence[BenchPoint], l2_bytes: int, *, l2_multiple: float = 64.0, headroom: float = 1.2) -> int:
    """Blocks in a shared pool: >= headroom x the largest point's blocks and >= l2_multiple x L2."""
    need = max(p.num_blocks for p in points)
    bb = points[0].block_bytes
    return max(math.ceil(headroom * need) + 1, math.ceil(l2_multiple * l2_bytes / bb))


# --------------------------------------------------------------------------- the bench


def run_bench(
    libs: dict[str, Any],
    points: Sequence[BenchPoint] | None = None,
    *,
    reps: int = DEFAULT_REPS,
    warmup: int = DEFAULT_WARMUP,
    rounds: int = DEFAULT_ROUNDS,
    warm: bool = True,
    cold: bool = True,
    kernels: Sequence[str] = H.KERNELS,
    baseline: str = "stock",
    seed: int = 0,
    device: str = "cuda",
    variant_info: dict[str, Any] | None = None,
    l2_bytes: int | None = None,
    pool_l2_multiple: float = 64.0,
    flush_bytes: int | None = None,
    copy_bytes: int | None = None,
    check_outputs: bool = True,
    collect_environment: bool = True,
    progress: Callable[[str], None] | None = None,
) -> BenchReport:
    """Time every variant of ``libs`` (name -> Kernels; ``baseline`` or the first is
    the reference) at ``points`` (default :func:`default_points`) for both kernels,
    warm and/or cold. See the module docstring for the method."""
    import torch

    t_start = time.perf_counter()
    names = H.order_variants(libs, baseline)
    points = list(points) if points is not None else default_points()
    if not points:
        raise ValueError("no bench points")
    modes = [m for m, on in (("warm", warm), ("cold", cold)) if on]
    if not modes:
        raise ValueError("neither warm nor cold timing selected")
    if reps < 1 or rounds < 1 or warmup < 0:
        raise ValueError("reps and rounds must be >= 1, warmup >= 0")
    for k in kernels:
        if k not in H.KERNELS:
            raise ValueError(f"unknown kernel {k!r}")
    missing = sorted({
        f"{H.config_label(p.dtype, p.kv_cache_dtype, p.head_size, p.block_size)} not built in {n}"
        for p in points for n in names
        if H.is_built(libs[n], H.config_label(p.dtype, p.kv_cache_dtype, p.head_size, p.block_size)) is False
    })
    if missing:
        raise ValueError("cannot bench: " + "; ".join(missing))
    warnings = [
        f"{n}: its kernels take k_scale/v_scale by value, so each launch reads the scale on the host "
        "(a device sync): its small-kernel times include launch overhead"
        for n in names if getattr(libs[n], "scale_by_value", False)
    ]
    dev = torch.device(device)
    say = progress or (lambda msg: None)
    timer = _Timer(dev)
    l2 = int(l2_bytes or l2_bytes_of(dev))
    flush_n = int(flush_bytes or max(3 * l2, 2 * l2 + 2**20))
    env = collect_env(device, variant_info) if collect_environment else {"variants": variant_info or {}}

    copy_n = int(copy_bytes or max(2**30, 32 * l2))
    say(f"copy bandwidth: {copy_n / 2**30:.2f} GiB dst.copy_(src)")
    copy_bw = measure_copy_bandwidth(dev, copy_n, timer=timer)

    flush_buf = torch.empty(flush_n, dtype=torch.uint8, device=dev) if "cold" in modes else None
    flush = (lambda: flush_buf.zero_()) if flush_buf is not None else None

    groups: dict[tuple[Any, ...], list[BenchPoint]] = {}
    for p in points:
        groups.setdefault(p.pool_key, []).append(p)

    raw: dict[tuple[BenchPoint, str, str], dict[str, list[list[float]]]] = {}
    matches: dict[tuple[BenchPoint, str], dict[str, bool]] = {}
    mismatches: list[str] = []
    pools_info = []
    for gi, (key, gpoints) in enumerate(groups.items()):
        p0 = gpoints[0]
        nblocks = pool_blocks(gpoints, l2, l2_multiple=pool_l2_multiple)
        pool_bytes = nblocks * p0.block_bytes
        if dev.type == "cuda":
            free, _total = torch.cuda.mem_get_info(dev)
            if pool_bytes > 0.8 * free:
                need = max(p.num_blocks for p in gpoints)
                nblocks = max(need + 1, int(0.8 * free / p0.block_bytes))
                pool_bytes = nblocks * p0.block_bytes
        say(f"pool {gi + 1}/{len(groups)}: {p0.dtype} kv={p0.kv_cache_dtype} {nblocks} blocks, "
            f"{pool_bytes / 1e9:.2f} GB ({pool_bytes / l2:.0f}x L2)")
        pools_info.append({"key": list(key), "blocks": nblocks, "bytes": pool_bytes})
        gen = H.make_generator(dev, seed * 7919 + gi)
        pool = H.make_kv_pool(nblocks, p0.num_kv_heads, p0.head_size, p0.block_size, p0.dtype,
                              p0.kv_cache_dtype, device=dev, generator=gen)
        setups = {}
        for pi, p in enumerate(gpoints):
            inp = H.make_inputs(
                dtype=p.dtype, kv_cache_dtype=p.kv_cache_dtype, head_size=p.head_size,
                block_size=p.block_size, num_heads=p.num_heads, num_kv_heads=p.num_kv_heads,
                seq_lens=[p.context] * p.batch, alibi=False, seed=seed * 1_000_003 + gi * 1009 + pi,
                device=dev, kv_pool=pool,
            )
            for k in kernels:
                bufs = {n: H.make_buffers(inp, k) for n in names}
                setups[(p, k)] = (inp, bufs)
        if check_outputs:
            for (p, k), (inp, bufs) in setups.items():
                for n in names:
                    H.poison(bufs[n])
                    H.launch(libs[n], k, inp, bufs[n])
                H.synchronize(dev)
                ref = bufs[names[0]].out
                res = {}
                for n in names:
                    o = bufs[n].out
                    ok = bool(H.all_written(o) and torch.equal(o, ref))
                    res[n] = ok
                    if not ok:
                        why = f"{H.count_unwritten(o)} unwritten" if not H.all_written(o) else f"differs from {names[0]}"
                        mismatches.append(f"{n}: {k} {p.name}: output {why}")
                matches[(p, k)] = res
        for rnd in range(rounds):
            for p in gpoints:
                for k in kernels:
                    inp, bufs = setups[(p, k)]
                    launchers = [H.make_launcher(libs[n], k, inp, bufs[n]) for n in names]
                    for m in modes:
                        us = time_interleaved(launchers, reps=reps, warmup=warmup, timer=timer,
                                              flush=flush if m == "cold" else None)
                        slot = raw.setdefault((p, k, m), {n: [] for n in names})
                        for n, u in zip(names, us):
                            slot[n].append(u)
                say(f"round {rnd + 1}/{rounds} {p.name} done ({time.perf_counter() - t_start:.0f} s)")
        del setups, pool
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    results = finish_results(raw, names, copy_bw["bytes_per_s"], matches if check_outputs else None)
    if collect_environment and dev.type == "cuda":
        smi_after = nvidia_smi_query()
        if smi_after is not None:
            env["nvidia_smi_after"] = smi_after
    settings = {
        "reps": reps, "warmup": warmup, "rounds": rounds, "modes": modes, "kernels": list(kernels),
        "seed": seed, "device": str(dev), "l2_bytes": l2, "flush_bytes": flush_n, "pools": pools_info,
        "partition_size": H.PARTITION_SIZE, "points": [p.to_dict() for p in points],
        "timing": "CUDA event pair around each launch; median of per-round medians; variants rotated per repeat",
    }
    return BenchReport(
        baseline=names[0], variants=names, results=results, copy_bandwidth=copy_bw, settings=settings,
        env=env, mismatches=mismatches, warnings=warnings, seconds=time.perf_counter() - t_start,
    )


# --------------------------------------------------------------------------- standalone entry


def _csv(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse(s: str) -> list[Any]:
        return [kind(x.strip()) for x in s.split(",") if x.strip()]

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvpatch.gpu.bench",
                                description="Time kernel libraries side by side (v1 and v2, warm and cold L2).")
    p.add_argument("--lib", action="append", required=True, metavar="NAME=PATH.so:PREFIX",
                   help="a library (repeatable; comma-separated lists too); 'stock' or the first is the baseline")
    p.add_argument("--baseline", default="stock")
    p.add_argument("--json", metavar="PATH", help="write the full report (all samples) here")
    p.add_argument("--plot", metavar="PATH.png", help="draw the speedups here")
    p.add_argument("--quick", action="store_true", help="4 points per dtype, 15 reps, 2 rounds")
    p.add_argument("--reps", type=int)
    p.add_argument("--rounds", type=int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--dtypes", type=_csv(str))
    p.add_argument("--batches", type=_csv(int))
    p.add_argument("--contexts", type=_csv(int))
    p.add_argument("--kernels", type=_csv(str))
    p.add_argument("--heads", default="32/8", help="query/KV heads (default 32/8)")
    p.add_argument("--head-size", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv", default="auto", help="KV cache dtype: auto or fp8")
    p.add_argument("--no-warm", action="store_true")
    p.add_argument("--no-cold", action="store_true")
    p.add_argument("--no-check", action="store_true", help="skip the bit-identity check before timing")
    p.add_argument("--variant-info", metavar="PATH.json", help="JSON {name: {...}} recorded in env.variants")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("-q", "--quiet", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    try:
        specs = H.parse_lib_specs(a.lib)
        qh, _, kvh = a.heads.partition("/")
        base = quick_points() if a.quick else default_points()
        points = make_points(
            dtypes=a.dtypes or list(dict.fromkeys(x.dtype for x in base)),
            batches=a.batches or list(dict.fromkeys(x.batch for x in base)),
            contexts=a.contexts or list(dict.fromkeys(x.context for x in base)),
            num_heads=int(qh), num_kv_heads=int(kvh), head_size=a.head_size,
            block_size=a.block_size, kv_cache_dtype=a.kv,
        )
        info: dict[str, Any] = {n: H.lib_info(path, pre) for n, path, pre in specs}
        if a.variant_info:
            with open(a.variant_info) as f:
                extra = json.load(f)
            for n, v in extra.items():
                info.setdefault(n, {}).update(v if isinstance(v, dict) else {"info": v})
    except (ValueError, OSError) as e:
        p.error(str(e))
    reps = a.reps or (15 if a.quick else DEFAULT_REPS)
    rounds = a.rounds or (2 if a.quick else DEFAULT_ROUNDS)
    warmup = a.warmup if a.warmup is not None else (3 if a.quick else DEFAULT_WARMUP)
    try:
        libs = H.load_libs(specs)
    except (RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    say = (lambda m: None) if a.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    report = run_bench(
        libs, points, reps=reps, warmup=warmup, rounds=rounds, warm=not a.no_warm, cold=not a.no_cold,
        kernels=a.kernels or H.KERNELS, baseline=a.baseline, seed=a.seed, device=a.device,
        variant_info=info, check_outputs=not a.no_check, progress=say,
    )
    if a.json:
        report.write_json(a.json)
    if a.plot:
        from .plot import plot_bench

        plot_bench(report, a.plot)
    report.print()
    print(f"bench took {report.seconds:.0f} s")
    return EXIT_MISMATCH if report.mismatches else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
