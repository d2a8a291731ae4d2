"""``kvpatch bench-decode``'s measurement: a decode step shaped like a real model, its
arms side by side, point after point.

The step (:mod:`.step`) is captured in one CUDA graph per arm (:mod:`.arms`): for each
attention library given (``stock`` first) its plain step; ``stock-aa``, stock's step captured
again (the A/A twin); with weight prefetch (a :class:`~.options.WeightPrefetch`: its windows,
:mod:`.windows`) ``stock+zero`` (the same forks, the prefetch kernel launched with no rows),
``stock+wpf`` and ``<lib>+wpf``; with the in-kernel form (:class:`~.windows.TailPrefetch`) and a
``tail`` library, ``tail`` (and ``tail+zero``, from a second load of it with an empty table).

Method (:mod:`.measure`): all arms of a point are timed interleaved in several rounds (7 by
default with weight prefetch) on kvpatch.gpu's timer; an arm's time is the median of its round
medians, its spread min..max over rounds; speedups are per-round ratios to stock (also to the
same library without prefetch, and to the zero-byte twin). Warm: replays back to back; cold:
:class:`~kvpatch.gpu.flush.L2Flush` before each replay; either way, where an arm prefetches with
``evict_last``, the guard demotes those lines before every launch of every arm. Outputs are
checked first: every arm's step output must equal stock's bit for bit. nvidia-smi samples
clocks, power and throttle reasons for the whole run; each round is summarised from its window.

torch is imported inside functions only.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping, Sequence

from ..errors import BuildError, UsageError
from .arms import Arm, default_arms
from .measure import close_rounds, measure_point
from .models import model_shape
from .options import (
    BLOCK_SIZE,
    DEFAULT_BATCHES,
    DEFAULT_CONTEXTS,
    DEFAULT_DTYPES,
    DEFAULT_LAYERS,
    DEFAULT_MODELS,
    DEFAULT_ROUNDS,
    WeightPrefetch,
)  # fmt: skip
from .report import DecodeReport
from .step import DTYPES, DecodeStep, DecodeWeights, point_bytes
from .windows import TailPrefetch


def prefetch_library_for(prefetch_library: Any, device: Any) -> Any:
    """A loaded :class:`~kvpatch.prefetch.kernel.PrefetchLibrary`: the one given, a path,
    else ``$KVPATCH_PREFETCH_LIB``, else a build for the device's capability."""
    import torch

    from ..prefetch.kernel import PrefetchLibrary, load_prefetch_library

    if isinstance(prefetch_library, PrefetchLibrary):
        return prefetch_library
    return load_prefetch_library(prefetch_library, capability=tuple(torch.cuda.get_device_capability(device)))


def needs_prefetch_library(arms: Sequence[Arm]) -> bool:
    """Whether an arm launches the weight-prefetch library: its weight-prefetch arms (the zero-byte
    twin too), and its in-kernel arms, whose ``evict_last`` lines the guard demotes through it."""
    return any(a.wpf is not None or a.tail is not None for a in arms)


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
    env["prefetch_library"] = None if pf_lib is None else {"path": str(pf_lib.path), "config": pf_lib.config}
    env["attention_libraries"] = {k: {"path": str(getattr(v, "path", "")), "prefix": getattr(v, "prefix", ""),
                                      "configs": list(getattr(v, "configs", ()))} for k, v in libs.items()}  # fmt: skip
    return env


def weight_tails(libs: Mapping[str, Any]) -> dict[str, Any]:
    """``{name: WeightTail}`` for the libraries that are weight-tail builds."""
    from ..prefetch.tail import WeightTail

    out = {}
    for name, lib in libs.items():
        path, prefix = getattr(lib, "path", None), getattr(lib, "prefix", None)
        if path is None or prefix is None:
            continue
        try:
            out[name] = WeightTail(path, prefix)
        except BuildError:
            continue
    return out


def run_bench_decode(
    libs: Mapping[str, Any],
    *,
    models: Sequence[str] = DEFAULT_MODELS,
    dtypes: Sequence[str] = DEFAULT_DTYPES,
    batches: Sequence[int] = DEFAULT_BATCHES,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    layers: int = DEFAULT_LAYERS,
    rounds: int = DEFAULT_ROUNDS,
    cycles: int | None = None,
    round_seconds: float = 0.15,
    cold: bool = False,
    weight_prefetch: WeightPrefetch | None = None,
    arms: Sequence[Arm] | None = None,
    aa: bool = True,
    zero: bool = True,
    tail: TailPrefetch | None = None,
    guard: str = "auto",
    attention: bool = True,
    prefetch_library: Any = None,
    device: Any = "cuda",
    seed: int = 0,
    memory_fraction: float = 0.85,
    deadline: float | None = None,
    flush: Any = None,
    json_path: str | os.PathLike[str] | None = None,
    plot_path: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> DecodeReport:
    """Time the model-shaped decode step for every (model, dtype, batch, context).

    ``libs``: ``{name: kvpatch.gpu.launch.Kernels}`` with ``'stock'``. The arms: ``arms`` as
    given, else :func:`~.arms.default_arms` of the libraries, ``weight_prefetch`` (None: the
    default windows; ``WeightPrefetch(windows=())`` with no cap: none), ``aa``, ``zero`` and
    ``tail``. ``cycles``: whole carry-over cycles per round (None: enough for ``round_seconds``,
    1..4). ``guard``: the evict_last guard (:func:`~.measure.measure_point`). Points whose caches
    do not fit in ``memory_fraction`` of free memory, or whose head size a library was not built
    for, are skipped and listed with the reason, as are those left when ``deadline``
    (``time.perf_counter()``) passes. ``flush``: an :class:`~kvpatch.gpu.flush.L2Flush` to use
    (None: one of this run's own). Writes the JSON after every point (a run cut short keeps
    what it measured) and a PNG when paths are given; ``progress`` gets one line per point.
    """
    from ..gpu.env import SmiSampler
    from ..gpu.flush import L2Flush
    from ..gpu.timing import Timer

    say = progress or (lambda m: None)
    dev = cuda_device(device)
    wpf = WeightPrefetch() if weight_prefetch is None else weight_prefetch
    arms = list(arms) if arms is not None else default_arms(libs, wpf, aa=aa, zero=zero, tail=tail)
    for m in models:
        model_shape(m)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise UsageError(f"bench-decode dtypes are fp16 and bf16, not {', '.join(bad)}")
    missing = sorted({a.library for a in arms} - set(libs))
    if missing:
        raise UsageError(f"arms use libraries not given: {', '.join(missing)}")
    # built or loaded only where an arm launches it (or one is given): a run without weight
    # prefetch needs neither its build nor what the build needs
    use_pf = prefetch_library is not None or needs_prefetch_library(arms)
    pf_lib = prefetch_library_for(prefetch_library, dev) if use_pf else None
    tails = weight_tails({a.library: libs[a.library] for a in arms if a.tail is not None})
    lacking = sorted({a.library for a in arms if a.tail is not None} - set(tails))
    if lacking:
        raise UsageError(f"in-kernel arms need weight-tail builds: {', '.join(lacking)} is not one")
    env = decode_env(dev, pf_lib, libs)
    flush = flush if flush is not None else L2Flush(dev, env["l2_bytes"])
    timer = Timer(dev)
    sampler = SmiSampler(gpu=dev.index if not os.environ.get("CUDA_VISIBLE_DEVICES") else None).start()
    report = DecodeReport(
        variants=[a.name for a in arms], layers=layers, rounds=rounds, mode="cold" if cold else "warm",
        caps_bytes=wpf.caps if isinstance(wpf.caps, int) else {str(b): c for b, c in wpf.caps.items()},
        env=env, points=[], skipped=[], priority=str(wpf.priority), weight_prefetch=wpf.to_dict(),
        arms=[a.to_dict() for a in arms], guard=guard, tail=tail.to_dict() if tail is not None else None,
    )  # fmt: skip
    t_start = time.perf_counter()
    try:
        _run_points(report, libs, arms, pf_lib, dev, models=models, dtypes=dtypes, batches=batches,
                    contexts=contexts, layers=layers, rounds=rounds, cycles=cycles, round_seconds=round_seconds,
                    cold=cold, seed=seed, memory_fraction=memory_fraction, flush=flush, timer=timer, say=say,
                    json_path=json_path, guard=guard, tails=tails, attention=attention, deadline=deadline)  # fmt: skip
    finally:
        sampler.stop()
        for t in tails.values():
            try:
                t.clear()
            except Exception:  # noqa: BLE001 - an error on the way out must not hide the one that got us here
                pass
    for point in report.points:
        close_rounds(point, sampler)
    report.seconds = round(time.perf_counter() - t_start, 1)
    if json_path:
        report.save_json(json_path)
    if plot_path and report.points:
        report.plot(plot_path)
    return report


def _run_points(report: DecodeReport, libs: Mapping[str, Any], arms: list, pf_lib: Any, dev: Any, *,
                models: Sequence[str], dtypes: Sequence[str], batches: Sequence[int], contexts: Sequence[int],
                layers: int, rounds: int, cycles: int | None, round_seconds: float, cold: bool, seed: int,
                memory_fraction: float, flush: Any, timer: Any, say: Callable[[str], None], json_path: Any,
                guard: str, tails: Mapping[str, Any], attention: bool, deadline: float | None) -> None:  # fmt: skip
    import torch

    used = {a.library for a in arms}
    for model in models:
        shape = model_shape(model)
        for dtype in dtypes:
            label = f"{dtype}/auto/{shape.head_size}/{BLOCK_SIZE}"
            missing = [n for n in sorted(used) if getattr(libs[n], "configs", None) and label not in libs[n].configs]
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
                    where = {"model": model, "dtype": dtype, "batch": batch, "context": context}
                    if deadline is not None and time.perf_counter() > deadline:
                        report.skipped.append({**where, "reason": "time budget"})
                        say(f"skip {model} {dtype} B={batch} ctx={context}: time budget")
                        continue
                    need = point_bytes(shape, weights.elem, batch, context, layers)
                    free, _ = torch.cuda.mem_get_info(dev)
                    if need > memory_fraction * free:
                        reason = f"needs {need / 2**30:.1f} GiB for caches and activations, {free / 2**30:.1f} GiB free"
                        report.skipped.append({**where, "reason": reason})
                        say(f"skip {model} {dtype} B={batch} ctx={context}: {reason}")
                        continue
                    t0 = time.perf_counter()
                    step = DecodeStep(weights, batch, context, seed=seed + 1000 * batch + context)
                    try:
                        point = measure_point(step, arms, libs, pf_lib, dev, rounds=rounds, cycles=cycles,
                                              round_seconds=round_seconds, flush=flush, cold=cold, timer=timer,
                                              guard=guard, tails=tails, attention=attention)  # fmt: skip
                    except Exception as e:  # the points measured so far stay in the JSON, the error with them
                        report.skipped.append({**where, "reason": f"error: {type(e).__name__}: {e}"})
                        if json_path:
                            report.save_json(json_path)
                        raise
                    for t in tails.values():
                        t.clear()
                    del step
                    point["seconds"] = round(time.perf_counter() - t0, 2)
                    report.points.append(point)
                    say(report.point_line(point))
                    if json_path:  # after every point: a run cut short keeps what it measured
                        report.save_json(json_path)
                    torch.cuda.empty_cache()
            del weights
            torch.cuda.empty_cache()
