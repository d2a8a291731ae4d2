"""``kvpatch bench-decode``'s measurement: a decode step shaped like a real model, its
variants side by side, point after point.

The step (:mod:`.step`) is captured in one CUDA graph per variant. Variants, for each
attention library ``NAME`` given (``stock`` first): ``NAME`` and ``NAME+wpf``: the same
step with the L2 weight prefetch of a :class:`~.options.WeightPrefetch` configuration
(each layer's o_proj, gate/up and down weights, in that order, up to the per-batch cap;
forked before attention by default, joined once per step).

Method: all variants of a point are timed interleaved in several rounds on kvpatch.gpu's
timer (:mod:`.measure`); a variant's time is the median of its round medians, its spread
min..max over rounds; speedups are per-round ratios to stock. Warm: replays back to back;
cold: :class:`~kvpatch.gpu.flush.L2Flush` before each replay. Outputs are checked first:
every variant's step output must equal stock's bit for bit (the output buffer is
NaN-poisoned before each replay). nvidia-smi samples clocks, power and throttle reasons
for the whole run; each round is summarised from its window.

torch is imported inside functions only.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping, Sequence

from ..errors import BuildError
from .measure import close_rounds, measure_point
from .models import model_shape
from .options import (
    BLOCK_SIZE, DEFAULT_BATCHES, DEFAULT_CAPS_MIB, DEFAULT_CONTEXTS, DEFAULT_DTYPES, DEFAULT_LAYERS, DEFAULT_MODELS,
    DEFAULT_ROUNDS, WPF, MiB, WeightPrefetch, variant_names,
)  # fmt: skip
from .report import DecodeReport
from .step import DTYPES, DecodeStep, DecodeWeights, point_bytes


def prefetch_library_for(prefetch_library: Any, device: Any) -> Any:
    """A loaded :class:`~kvpatch.prefetch.kernel.PrefetchLibrary`: the one given, a path,
    else ``$KVPATCH_PREFETCH_LIB``, else a build for the device's capability."""
    import torch

    from ..prefetch.kernel import PrefetchLibrary, load_prefetch_library

    if isinstance(prefetch_library, PrefetchLibrary):
        return prefetch_library
    return load_prefetch_library(prefetch_library, capability=tuple(torch.cuda.get_device_capability(device)))


def cuda_device(device: Any) -> Any:
    """``device`` as a CUDA device with an index; :class:`BuildError` without a GPU."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise BuildError("bench-decode needs a CUDA GPU and torch with CUDA")
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


def decode_env(device: Any, pf_lib: Any, libs: Mapping[str, Any]) -> dict[str, Any]:
    """What a decode report records of its machine: :func:`kvpatch.gpu.env.collect_env`'s
    snapshot, the L2 size, and the libraries measured."""
    from ..gpu.env import collect_env
    from ..gpu.timing import l2_bytes_of

    env = collect_env(str(device))
    env["l2_bytes"] = l2_bytes_of(device)
    env["prefetch_library"] = {"path": str(pf_lib.path), "config": pf_lib.config}
    env["attention_libraries"] = {k: {"path": str(getattr(v, "path", "")), "prefix": getattr(v, "prefix", ""),
                                      "configs": list(getattr(v, "configs", ()))} for k, v in libs.items()}  # fmt: skip
    return env


def run_bench_decode(
    libs: Mapping[str, Any],
    *,
    models: Sequence[str] = DEFAULT_MODELS,
    dtypes: Sequence[str] = DEFAULT_DTYPES,
    batches: Sequence[int] = DEFAULT_BATCHES,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    layers: int = DEFAULT_LAYERS,
    rounds: int = DEFAULT_ROUNDS,
    reps: int | None = None,
    round_seconds: float = 0.15,
    cold: bool = False,
    weight_prefetch: WeightPrefetch | None = None,
    weight_prefetch_cap: int | Mapping[int, int] | None = None,
    prefetch_library: Any = None,
    priority: str | int = "high",
    device: Any = "cuda",
    seed: int = 0,
    memory_fraction: float = 0.85,
    json_path: str | os.PathLike[str] | None = None,
    plot_path: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> DecodeReport:
    """Time the model-shaped decode step for every (model, dtype, batch, context).

    ``libs``: ``{name: kvpatch.gpu.launch.Kernels}`` with ``'stock'``; each library is
    a variant, and each also runs with the weight prefetch (``NAME+wpf``).
    ``weight_prefetch``: the prefetch configuration (cap, grid, threads, chunk, hint,
    fork and join points, priority); without it, ``weight_prefetch_cap`` (bytes per
    layer window: an int for every batch, a ``{batch: bytes}`` bucket table, ``0`` for
    off, ``None`` for :data:`DEFAULT_CAPS_MIB`) and ``priority`` with the library's
    launch defaults. ``reps``: timed replays per variant per round (``None``: enough
    for ``round_seconds`` per round, 3..30). Points whose caches do not fit in
    ``memory_fraction`` of free memory, or whose head size a library was not built for,
    are skipped and listed with the reason. Writes the JSON after every point (a run cut
    short keeps what it measured) and a PNG when paths are given; ``progress`` gets one
    line per point.
    """
    import torch

    from ..gpu.env import SmiSampler
    from ..gpu.flush import L2Flush
    from ..gpu.timing import Timer

    say = progress or (lambda m: None)
    dev = cuda_device(device)
    names = variant_names(libs)
    if weight_prefetch is None:
        caps: Any = {b: c * MiB for b, c in DEFAULT_CAPS_MIB.items()} if weight_prefetch_cap is None else weight_prefetch_cap
        weight_prefetch = WeightPrefetch(caps=caps if isinstance(caps, int) else dict(caps), priority=priority)
    wpf = weight_prefetch
    for m in models:
        model_shape(m)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ValueError(f"bench-decode dtypes are fp16 and bf16, not {', '.join(bad)}")
    pf_lib = prefetch_library_for(prefetch_library, dev)
    env = decode_env(dev, pf_lib, libs)
    flush = L2Flush(dev, env["l2_bytes"])
    timer = Timer(dev)
    sampler = SmiSampler(gpu=dev.index if not os.environ.get("CUDA_VISIBLE_DEVICES") else None).start()
    variants = [(n, n.removesuffix(WPF), wpf if n.endswith(WPF) else None) for n in names]
    report = DecodeReport(
        variants=names, layers=layers, rounds=rounds, mode="cold" if cold else "warm",
        caps_bytes=wpf.caps if isinstance(wpf.caps, int) else {str(b): c for b, c in wpf.caps.items()},
        env=env, points=[], skipped=[], priority=str(wpf.priority), weight_prefetch=wpf.to_dict(),
    )  # fmt: skip
    t_start = time.perf_counter()
    try:
        _run_points(report, libs, variants, pf_lib, dev, models=models, dtypes=dtypes, batches=batches,
                    contexts=contexts, layers=layers, rounds=rounds, reps=reps, round_seconds=round_seconds,
                    cold=cold, seed=seed, memory_fraction=memory_fraction, flush=flush, timer=timer, say=say,
                    json_path=json_path)  # fmt: skip
    finally:
        sampler.stop()
    for point in report.points:
        close_rounds(point, sampler)
    report.seconds = round(time.perf_counter() - t_start, 1)
    if json_path:
        report.save_json(json_path)
    if plot_path:
        report.plot(plot_path)
    return report


def _run_points(report: DecodeReport, libs: Mapping[str, Any], variants: list, pf_lib: Any, dev: Any, *,
                models: Sequence[str], dtypes: Sequence[str], batches: Sequence[int], contexts: Sequence[int],
                layers: int, rounds: int, reps: int | None, round_seconds: float, cold: bool, seed: int,
                memory_fraction: float, flush: Any, timer: Any, say: Callable[[str], None],
                json_path: Any) -> None:  # fmt: skip
    import torch

    for model in models:
        shape = model_shape(model)
        for dtype in dtypes:
            label = f"{dtype}/auto/{shape.head_size}/{BLOCK_SIZE}"
            missing = [n for n, lib in libs.items() if getattr(lib, "configs", None) and label not in lib.configs]
            if missing:
                for b in batches:
                    for c in contexts:
                        report.skipped.append({"model": model, "dtype": dtype, "batch": b, "context": c,
                                               "reason": f"{', '.join(missing)} not built for {label}"})  # fmt: skip
                say(f"skip {model} {dtype}: {', '.join(missing)} not built for {label}")
                continue
            weights = DecodeWeights(shape, dtype, layers, dev, seed)
            for batch in batches:
                for context in contexts:
                    need = point_bytes(shape, weights.elem, batch, context, layers)
                    free, _ = torch.cuda.mem_get_info(dev)
                    if need > memory_fraction * free:
                        reason = f"needs {need / 2**30:.1f} GiB for caches and activations, {free / 2**30:.1f} GiB free"
                        report.skipped.append({"model": model, "dtype": dtype, "batch": batch, "context": context, "reason": reason})
                        say(f"skip {model} {dtype} B={batch} ctx={context}: {reason}")
                        continue
                    t0 = time.perf_counter()
                    step = DecodeStep(weights, batch, context, seed=seed + 1000 * batch + context)
                    point = measure_point(step, variants, libs, pf_lib, dev, rounds=rounds, reps=reps,
                                          round_seconds=round_seconds, flush=flush, cold=cold, timer=timer)  # fmt: skip
                    del step
                    point["seconds"] = round(time.perf_counter() - t0, 2)
                    report.points.append(point)
                    say(report.point_line(point))
                    if json_path:  # after every point: a run cut short keeps what it measured
                        report.save_json(json_path)
                    torch.cuda.empty_cache()
            del weights
            torch.cuda.empty_cache()
