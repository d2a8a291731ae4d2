"""``kvpatch bench``: stock, the paper's patch and the patch side by side, warm and cold L2.

The data flow: options -> the points (a named set, or the cross product of the shape
options) and every other option checked -> the GPU checked -> the libraries (the tree's
variants built for the points' instantiations, or ``--lib``) -> :func:`kvpatch.gpu.bench.run_bench`
(outputs checked bit-identical first, then interleaved rounds) -> the report (JSON, plot).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ..config import variant_configs
from ..errors import UsageError
from ..fsutil import check_outputs
from ..gpu.defaults import DEFAULT_REPS, DEFAULT_ROUNDS, DEFAULT_WARMUP
from ..progress import QUIET, Progress
from .common import (
    LibraryOptions,
    build_libraries,
    check_device,
    check_kernel_sizes,
    check_sources,
    input_files,
    kept_paths,
    prebuilt,
    require_device,
    write_if,
)

if TYPE_CHECKING:
    from ..gpu.bench_report import BenchReport


@dataclass
class BenchOptions(LibraryOptions):
    variants: list[str] = field(default_factory=list)  # --variant NAME=config.toml (when building)
    paper: Optional[bool] = None  # None: on where variants are built (not given)
    control: bool = False
    point_set: Optional[str] = None
    quick: bool = False
    dtypes: Optional[list[str]] = None
    batches: Optional[list[int]] = None
    contexts: Optional[list[int]] = None
    heads: Optional[list[tuple[int, int]]] = None
    head_sizes: Optional[list[int]] = None
    block_sizes: Optional[list[int]] = None
    kv_cache_dtypes: Optional[list[str]] = None
    seed: Optional[int] = None
    capture_len: Optional[int] = None  # launches sized for this many tokens (vLLM's CUDA graphs)
    kernels: list[str] = field(default_factory=lambda: ["v1", "v2"])
    reps: int = DEFAULT_REPS
    rounds: int = DEFAULT_ROUNDS
    warmup: int = DEFAULT_WARMUP
    warm: bool = True
    cold: bool = True
    check: bool = True
    aa: bool = False
    json_out: Optional[Path] = None
    plot: Optional[Path] = None
    device: str = "cuda"


def bench_points(o: BenchOptions) -> tuple[list, str]:
    """(points, set name) for the options: a named set (filtered by shape options), or
    the cross product of the shape options around the tuning shape; default: headline."""
    from ..gpu import points as P

    shape_given = any(v is not None for v in (o.dtypes, o.batches, o.contexts, o.heads, o.head_sizes,
                                              o.block_sizes, o.kv_cache_dtypes))  # fmt: skip
    if o.point_set is not None and o.point_set not in P.POINT_SETS:  # '' too: an unset variable, not the default
        raise UsageError(f"invalid --set {o.point_set!r}: {', '.join(P.POINT_SETS)}")
    P.check_batches(o.batches or ())
    P.check_contexts(o.contexts or ())
    if o.quick and (o.point_set is not None or shape_given):
        raise UsageError("--quick is a point set of its own (8 points): give it alone, or --set and the shape options")
    if o.quick:
        pts, name = P.quick_points(), "quick"
    elif o.point_set is not None or not shape_given:
        name = o.point_set or "headline"
        pts = P.point_set(name, dtypes=o.dtypes or ("fp16", "bf16"))
        keep = {"batch": o.batches, "context": o.contexts, "head_size": o.head_sizes,
                "block_size": o.block_sizes, "kv_cache_dtype": o.kv_cache_dtypes}  # fmt: skip
        pts = [p for p in pts if all(v is None or getattr(p, k) in v for k, v in keep.items())
               and (o.heads is None or (p.num_heads, p.num_kv_heads) in o.heads)]  # fmt: skip
    else:
        name = "custom"
        pts = []
        for qh, kvh in o.heads or [P.HEADLINE_HEADS]:
            for hs in o.head_sizes or [P.HEADLINE_HEAD_SIZE]:
                for bs in o.block_sizes or [P.HEADLINE_BLOCK_SIZE]:
                    for kv in o.kv_cache_dtypes or ["auto"]:
                        pts += P.make_points(dtypes=o.dtypes or ("fp16", "bf16"),
                                             batches=o.batches or P.DEFAULT_BATCHES,
                                             contexts=o.contexts or P.DEFAULT_CONTEXTS, num_heads=qh,
                                             num_kv_heads=kvh, head_size=hs, block_size=bs, kv_cache_dtype=kv,
                                             seed=o.seed or 0)  # fmt: skip
    if o.seed is not None and name != "custom":
        pts = [replace(p, seed=o.seed) for p in pts]
    if not pts:
        raise UsageError("no bench points: the options select none")
    if o.capture_len is not None:
        longest = max(p.context for p in pts)
        if not 1 <= o.capture_len <= P.MAX_CONTEXT or o.capture_len < longest:
            raise UsageError(f"--capture-len {o.capture_len}: choose {longest} (the longest context) to "
                             f"{P.MAX_CONTEXT} tokens")  # fmt: skip
        pts = [replace(p, capture=o.capture_len) for p in pts]
    return pts, name


def run(o: BenchOptions, *, progress: Progress = QUIET) -> BenchReport:
    """``kvpatch bench``: returns the :class:`~kvpatch.gpu.bench_report.BenchReport` (JSON/plot written)."""
    check_device(o.device)
    check_kernel_sizes(o.head_sizes, o.block_sizes)
    points, name = bench_points(o)
    from ..gpu.bench import check_bench_options, run_bench

    check_bench_options(reps=o.reps, warmup=o.warmup, rounds=o.rounds, warm=o.warm, cold=o.cold,
                        kernels=o.kernels)  # fmt: skip
    extra = variant_configs(o.variants)
    if o.libs and (o.paper or o.control):
        raise UsageError("--paper and --control build variants from the tree; --lib runs prebuilt libraries: give "
                         "their libraries as more --lib")  # fmt: skip
    if extra and o.libs:
        raise UsageError("--variant builds a configuration from the tree, --lib runs prebuilt libraries: give the "
                         "variant's library as one more --lib")  # fmt: skip
    check_outputs(json=o.json_out, plot=o.plot, inputs=input_files(o), protected=kept_paths(o.cwd, o.tree))
    if o.plot is not None:
        from ..gpu.plot import plot_format

        plot_format(o.plot)
    check_sources(o)
    require_device(o.device)
    if o.libs:
        libs = prebuilt(o.libs, o.variant_info)
    else:
        from .tree import resolve, variants_for  # the build side (git, libclang) only when building

        variants = variants_for(resolve(o.tree, o.cwd), o.cwd, progress, paper=o.paper is not False, control=o.control,
                                extra=extra)  # fmt: skip
        libs = build_libraries(o.tree, o.cwd, o.build_arch, variants, progress,
                               dtypes=sorted({p.dtype for p in points}), head_sizes=sorted({p.head_size for p in points}),
                               block_sizes=sorted({p.block_size for p in points}),
                               kv_cache_dtypes=sorted({p.kv_cache_dtype for p in points}))  # fmt: skip
    try:
        report = run_bench(libs.libs, points, reps=o.reps, warmup=o.warmup, rounds=o.rounds, warm=o.warm,
                           cold=o.cold, kernels=o.kernels, device=o.device, variant_info=libs.info,
                           point_set_name=name, check_outputs=o.check, progress=progress.say, aa=o.aa)  # fmt: skip
    except ValueError as e:  # the inputs' shape checks below run_bench's own (e.g. an fp8 cache's head size)
        raise UsageError(str(e)) from None
    write_if(o.json_out, report.to_json())
    if o.plot is not None:
        from ..gpu.plot import plot_bench

        plot_bench(report, o.plot)
    return report
