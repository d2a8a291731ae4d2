"""``kvpatch bench-decode``: a decode step shaped like a real model, four variants side by side.

The step (:mod:`.step`) is captured in one CUDA graph per variant. Variants, for each
attention library ``NAME`` given (``stock`` first): ``NAME`` and ``NAME+wpf``: the
same step with the L2 weight prefetch of a :class:`~.options.WeightPrefetch`
configuration (each layer's o_proj, gate/up and down weights, in that order, up to the
per-batch cap; forked before attention by default, joined once per step).

Method (issue 8): all variants of a point are timed interleaved (each follows each,
itself included, equally often) in several rounds (:mod:`.timing`); a variant's time is the median of its
round medians, and its spread is min..max over rounds; speedups are per-round ratios
to stock. Warm: replays back to back; cold: before each replay a buffer of 3x L2 is
read and written (``add_``). Outputs are checked first: every variant's step output
must equal stock's bit for bit (the output buffer is NaN-poisoned before each
replay). GPU clocks, power and throttle reasons are read with nvidia-smi after every
round.

:func:`measure_point` times any list of variants on one point (the sweep,
:mod:`.sweep`, uses it with many prefetch configurations); :func:`run_bench_decode`
is the benchmark; :func:`bench_decode_cli` is what ``kvpatch bench-decode`` and
``python -m kvpatch.prefetch.decode`` call. torch is imported inside functions only.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Mapping, Sequence

from ..errors import BuildError, GpuCheckError, KvpatchError, UsageError
from ..fsutil import check_outputs
from .micro import micro_table, run_micro_gemm, run_micro_prefetch  # noqa: F401  (re-exported)
from .models import model_shape
from .options import (  # noqa: F401  (re-exported: the public names of the benchmark)
    BLOCK_SIZE, DEFAULT_BATCHES, DEFAULT_CAPS_MIB, DEFAULT_CONTEXTS, DEFAULT_DTYPES, DEFAULT_LAYERS,
    DEFAULT_MODELS, DEFAULT_ROUNDS, WPF, MiB, WeightPrefetch, cap_for_batch, caps_text, parse_caps, parse_ints,
    parse_lib_arg, parse_names, variant_names,
)  # fmt: skip
from ..render import decode_point_line, decode_text
from .report import DecodeReport
from .step import (  # noqa: F401  (re-exported)
    _DTYPES, PARTITION_SIZE, V1_MAX_SEQ_LEN, V1_MIN_PARALLELISM, DecodeStep, DecodeWeights,
    dispatched_kernel, point_bytes,
)  # fmt: skip
from .timing import capture, collect_env, power_capped, round_stats, smi, time_rounds  # noqa: F401

#: Exit code when a variant's outputs differ from stock's.
EXIT_MISMATCH = GpuCheckError.exit_code


def resolve_prefetch_library(prefetch_library: Any, device: Any) -> Any:
    """A loaded :class:`~.kernel.PrefetchLibrary`: the one given, a path, else
    ``$KVPATCH_PREFETCH_LIB``, else a build for the device's capability."""
    import torch

    from .kernel import PrefetchLibrary, archs_for_capability, build_prefetch_library

    if isinstance(prefetch_library, PrefetchLibrary):
        return prefetch_library
    major, minor = torch.cuda.get_device_capability(device)
    path = prefetch_library or os.environ.get("KVPATCH_PREFETCH_LIB") or build_prefetch_library(archs_for_capability(major, minor))
    return PrefetchLibrary(path)


def measure_point(
    step: DecodeStep,
    variants: Sequence[tuple[str, str, WeightPrefetch | None]],
    libs: Mapping[str, Any],
    pf_lib: Any,
    device: Any,
    *,
    rounds: int,
    reps: int | None,
    round_seconds: float,
    flush: Callable[[], None],
    cold: bool,
) -> dict[str, Any]:
    """Time ``variants`` (``(name, library name, WeightPrefetch or None)``; the first
    must be ``('stock', 'stock', None)``) on one point, interleaved, after checking that
    every output equals stock's bit for bit. Returns the point's dict (see the JSON)."""
    import torch

    from .controller import PrefetchController

    if not variants or variants[0][:2] != ("stock", "stock") or variants[0][2] is not None:
        raise ValueError("the first variant must be ('stock', 'stock', None)")
    batch, weights = step.batch, step.w
    graphs: dict[str, Any] = {}
    windows: dict[str, Any] = {}
    # A captured graph keeps no Python reference: each controller (its device range tables)
    # must live as long as the graphs that launch from them are replayed, i.e. this call.
    controllers: dict[str, Any] = {}
    for name, lib_name, wpf in variants:
        lib = libs[lib_name]
        if wpf is None:
            graphs[name] = capture(lambda lib=lib: step.step(lib), device)
            continue
        ctl = controllers[name] = PrefetchController(device, library=pf_lib, **wpf.controller_options())
        step.add_prefetch(ctl, wpf.caps)
        windows[name] = ctl.table("attn", 0, batch)
        graphs[name] = capture(lambda lib=lib, ctl=ctl, wpf=wpf: step.step(lib, ctl, fork=wpf.fork, join=wpf.join), device)
    attn_libs = sorted({lib_name for _, lib_name, _ in variants}, key=lambda n: n != "stock")
    attn_graphs = {f"attn:{n}": capture(lambda lib=libs[n]: step.attention_only(lib), device) for n in attn_libs}

    # Correctness first: each variant's output equals stock's bit for bit.
    step.step(libs["stock"])
    torch.cuda.synchronize(device)
    eager = step.out.clone()
    outputs: dict[str, Any] = {}
    for name, g in graphs.items():
        step.out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize(device)
        outputs[name] = step.out.clone()
    ref = outputs["stock"]
    finite = bool(torch.isfinite(ref).all())
    identical = {n: bool(torch.equal(o, ref)) for n, o in outputs.items()}

    if reps is None:  # replays per round from one timed replay of stock
        t = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t[0].record()
        graphs["stock"].replay()
        t[1].record()
        torch.cuda.synchronize(device)
        one = max(t[0].elapsed_time(t[1]) / 1e3, 1e-5)
        reps = max(3, min(30, int(round_seconds / (one * (len(graphs) + len(attn_graphs))))))
    launchers = {n: g.replay for n, g in graphs.items()}
    launchers.update({n: g.replay for n, g in attn_graphs.items()})
    flushed = [n for n in launchers if cold or n.startswith("attn:")]
    medians, clocks = time_rounds(launchers, rounds=rounds, reps=reps, device=device, flush=flush, flushed=flushed)
    stock = medians["stock"]
    out: dict[str, Any] = {}
    for name, lib_name, wpf in variants:
        times = medians[name]
        st = round_stats(times)
        attn = round_stats(medians[f"attn:{lib_name}"])
        window = windows.get(name)
        out[name] = {
            "library": lib_name,
            "step_us": st,
            "rounds_us": times,
            "tokens_per_s": batch / (st["median"] * 1e-6),
            "speedup": round_stats([s / t for s, t in zip(stock, times)]),
            # over the same attention library without the prefetch: what the prefetch alone gives
            "speedup_vs_library": round_stats([b / t for b, t in zip(medians[lib_name], times)]) if lib_name in medians else None,
            "attention_us": attn["median"],
            "attention_share": attn["median"] / st["median"],
            "per_layer_us": st["median"] / weights.layers,
            "identical_to_stock": identical[name],
            "prefetch": wpf is not None,
            "weight_prefetch": wpf.to_dict() if wpf is not None else None,
            "cap_bytes": window.bytes if window is not None else 0,
            "prefetch_grid": window.grid if window is not None else 0,
            "launches_per_step": weights.layers if window is not None else 0,
        }
    first = next((out[n] for n, _, w in variants if w is not None), None)
    return {
        "model": weights.shape.name,
        "dtype": weights.dtype_name,
        "batch": batch,
        "context": step.context,
        "kernel": step.kernel,
        "layers": weights.layers,
        "cap_bytes": first["cap_bytes"] if first else 0,
        "prefetch_grid": first["prefetch_grid"] if first else 0,
        "layer_weight_bytes": weights.shape.layer_weight_bytes(weights.elem),
        "prefetchable_bytes": sum(t.numel() * t.element_size() for t in weights.prefetch_tensors(0)),
        "kv_bytes_per_layer": batch * step.context * weights.shape.kv_bytes_per_token(weights.elem),
        "reps": reps,
        "finite": finite,
        "graph_equals_eager": bool(torch.equal(eager, ref)),
        "all_identical": all(identical.values()) and finite,
        "variants": out,
        "clocks": clocks,
        "power_capped_rounds": sum(1 for c in clocks if c.get("power_capped")),
    }


def make_flush(device: Any, l2_bytes: int) -> Callable[[], None]:
    """Read + write 3x L2 (issue 8)."""
    import torch

    buf = torch.empty(3 * (l2_bytes or 50 * MiB), dtype=torch.uint8, device=device)
    return lambda: buf.add_(1)


def cuda_device(device: Any) -> Any:
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise BuildError("bench-decode needs a CUDA GPU and torch with CUDA")
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


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
    text_path: str | os.PathLike[str] | None = None,
    say: Callable[[str], None] | None = None,
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
    are skipped and listed with the reason. Writes JSON / PNG / text when paths are given.
    """
    import torch

    say = say or (lambda m: print(m, file=sys.stderr, flush=True))
    dev = cuda_device(device)
    names = variant_names(libs)
    if weight_prefetch is None:
        caps: Any = {b: c * MiB for b, c in DEFAULT_CAPS_MIB.items()} if weight_prefetch_cap is None else weight_prefetch_cap
        weight_prefetch = WeightPrefetch(caps=caps if isinstance(caps, int) else dict(caps), priority=priority)
    wpf = weight_prefetch
    for m in models:
        model_shape(m)
    bad = [d for d in dtypes if d not in _DTYPES]
    if bad:
        raise ValueError(f"bench-decode dtypes are fp16 and bf16, not {', '.join(bad)}")
    pf_lib = resolve_prefetch_library(prefetch_library, dev)
    env = collect_env(dev, {
        "prefetch_library": {"path": str(pf_lib.path), "config": pf_lib.config},
        "attention_libraries": {k: {"path": str(getattr(v, "path", "")), "prefix": getattr(v, "prefix", ""),
                                    "configs": list(getattr(v, "configs", ()))} for k, v in libs.items()},
    })  # fmt: skip
    # Before every launch when cold; before each attention-alone launch always (in a
    # step, the weights streaming through L2 evict the KV cache, so warm attention alone
    # would under-state its share).
    flush = make_flush(dev, env["l2_bytes"])
    variants = [(n, n.removesuffix(WPF), wpf if n.endswith(WPF) else None) for n in names]
    report = DecodeReport(
        variants=names, layers=layers, rounds=rounds, mode="cold" if cold else "warm",
        caps_bytes=wpf.caps if isinstance(wpf.caps, int) else {str(b): c for b, c in wpf.caps.items()},
        env=env, points=[], skipped=[], priority=str(wpf.priority), weight_prefetch=wpf.to_dict(),
    )  # fmt: skip
    t_start = time.perf_counter()
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
                                          round_seconds=round_seconds, flush=flush, cold=cold)  # fmt: skip
                    del step
                    point["seconds"] = round(time.perf_counter() - t0, 2)
                    report.points.append(point)
                    say(decode_point_line(report, point))
                    if json_path:  # after every point: a run cut short keeps what it measured
                        report.save_json(json_path)
                    torch.cuda.empty_cache()
            del weights
            torch.cuda.empty_cache()
    report.seconds = round(time.perf_counter() - t_start, 1)
    if json_path:
        report.save_json(json_path)
    if text_path:
        from ..fsutil import write_atomic

        write_atomic(text_path, decode_text(report) + "\n")
    if plot_path:
        try:
            report.plot(plot_path)
        except ImportError as e:
            say(f"no plot: {e}")
    return report


# --------------------------------------------------------------------------- the command


def weight_prefetch_from_options(
    cap: str | None = None, grid: str | None = None, threads: int | None = None, chunk: int | None = None,
    hint: str | None = None, fork: str | None = None, join: str | None = None, priority: str | None = None,
    wpf: str | None = None,
) -> WeightPrefetch:  # fmt: skip
    """The command line's prefetch options -> a :class:`WeightPrefetch` (``wpf``: the
    whole configuration as text, e.g. the sweep's pick; single options override it).
    Raises :class:`UsageError` with one line for any bad value."""
    given = [(k, v) for k, v in (("cap", cap), ("grid", grid), ("threads", threads), ("chunk", chunk),
                                 ("hint", hint), ("fork", fork), ("join", join), ("priority", priority)) if v is not None]  # fmt: skip
    for k, v in given:
        if str(v).strip() == "" or any(c in str(v) for c in ";="):
            raise UsageError(f"invalid --{k} {str(v)!r}: one value (a whole configuration goes in --wpf)")
    items = [f"{k}={v}" for k, v in given]
    try:
        base = WeightPrefetch.parse(wpf) if wpf else None
        return WeightPrefetch.parse(";".join(items), base)
    except ValueError as e:
        raise UsageError(str(e)) from None


def libraries_from_options(lib_args: Sequence[str] = (), libs_file: str | None = None) -> list[tuple[str, str, str]]:
    """``--lib NAME=PATH.so:PREFIX`` (repeatable) and a libs.txt of such lines -> specs."""
    from ..gpu.launch import parse_lib_specs

    try:
        items = list(lib_args)
        if libs_file:
            with open(libs_file, encoding="utf-8") as f:
                items += [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
        specs = [(s.name, s.path, s.prefix) for s in parse_lib_specs(items)]  # names unique, as bench's
    except (ValueError, OSError) as e:
        raise UsageError(f"--lib: {e}") from None
    names = [s[0] for s in specs]
    if specs and "stock" not in names:
        raise UsageError("--lib: one library must be named 'stock' (the baseline)")
    return specs


def bench_decode_cli(
    *,
    lib_args: Sequence[str] = (),
    libs_file: str | None = None,
    build: Callable[[list[str], list[int]], Mapping[str, Any]] | None = None,
    models: str | None = None,
    dtypes: str | None = None,
    batches: str | None = None,
    contexts: str | None = None,
    layers: int = DEFAULT_LAYERS,
    rounds: int = DEFAULT_ROUNDS,
    reps: int | None = None,
    prefetch_lib: str | None = None,
    cold: bool = False,
    micro: bool = False,
    json_path: str | None = None,
    plot_path: str | None = None,
    text_path: str | None = None,
    say: Callable[[str], None] | None = None,
    **prefetch_options: Any,
) -> tuple[DecodeReport, str, int]:
    """Everything ``kvpatch bench-decode`` does: parse and check the options (one-line
    :class:`UsageError`), load ``--lib`` libraries or call ``build(dtypes, head_sizes)``
    (stock + patched from the tree), run the benchmark (and the micro-benchmark with
    ``micro``), write the outputs. Returns (report, text table, exit code: 0, or
    :data:`EXIT_MISMATCH` when an output differs from stock's)."""
    try:
        model_list = parse_names(models) if models else list(DEFAULT_MODELS)
        for m in model_list:
            model_shape(m)
        dtype_list = parse_names(dtypes) if dtypes else list(DEFAULT_DTYPES)
        bad = [d for d in dtype_list if d not in _DTYPES]
        if bad:
            raise ValueError(f"invalid dtype {bad[0]!r}: fp16 or bf16")
        batch_list = parse_ints(batches, "batches") if batches else list(DEFAULT_BATCHES)
        context_list = parse_ints(contexts, "contexts") if contexts else list(DEFAULT_CONTEXTS)
        if layers < 1 or rounds < 1 or (reps is not None and reps < 1):
            raise ValueError("--layers, --rounds and --reps must be >= 1")
    except ValueError as e:
        raise UsageError(str(e)) from None
    wpf = weight_prefetch_from_options(**prefetch_options)
    specs = libraries_from_options(lib_args, libs_file)
    check_outputs(json=json_path, plot=plot_path, text=text_path)
    if specs:
        from ..gpu.launch import Kernels

        cuda_device("cuda")
        try:
            libs: Mapping[str, Any] = {name: Kernels(path, prefix) for name, path, prefix in specs}
        except (RuntimeError, OSError) as e:
            raise UsageError(str(e)) from None
    elif build is not None:
        head_sizes = sorted({model_shape(m).head_size for m in model_list})
        libs = build(dtype_list, head_sizes)
    else:
        raise UsageError("give --lib NAME=PATH.so:PREFIX (with 'stock') or a tree to build from")
    report = run_bench_decode(
        libs, models=model_list, dtypes=dtype_list, batches=batch_list, contexts=context_list, layers=layers,
        rounds=rounds, reps=reps, cold=cold, weight_prefetch=wpf, prefetch_library=prefetch_lib, say=say,
    )  # fmt: skip
    if micro:
        report.micro = run_micro_gemm(prefetch_lib, priority=wpf.priority)
    if json_path:
        report.save_json(json_path)
    text = decode_text(report) + ("\n\n" + micro_table(report.micro) if report.micro else "")
    if text_path:
        from ..fsutil import write_atomic

        write_atomic(text_path, text + "\n")
    if plot_path:
        try:
            report.plot(plot_path)
        except ImportError as e:
            (say or print)(f"no plot: {e}")
    return report, text, 0 if report.summary()["all_identical"] else EXIT_MISMATCH


def main(argv: Sequence[str] | None = None) -> int:
    """The same as ``kvpatch bench-decode`` (with ``--lib``/``--libs-file``), for machines
    without the CLI's dependencies."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m kvpatch.prefetch.decode", description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", action="append", default=[], help="NAME=PATH.so:PREFIX (repeatable; 'stock' required)")
    ap.add_argument("--libs-file", help="a libs.txt of NAME=PATH:PREFIX lines (paths relative to the current directory)")
    for opt in ("--models", "--dtypes", "--batches", "--contexts"):
        ap.add_argument(opt)
    ap.add_argument("--layers", type=int, default=DEFAULT_LAYERS)
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--wpf", help="a whole weight-prefetch configuration, e.g. 'cap=1:32,4:16;grid=132;hint=evict_normal'")
    ap.add_argument("--cap", help="per-batch MiB '1:32,4:32,8:16', one MiB value, 'off' or 'default'")
    ap.add_argument("--grid", help="prefetch CTAs (default: one per MiB, 4..32)")
    ap.add_argument("--threads", type=int, help="prefetch threads per CTA")
    ap.add_argument("--chunk", type=int, help="bytes per bulk prefetch")
    ap.add_argument("--hint", help="evict_last, evict_normal, evict_first or none")
    ap.add_argument("--fork", help="attn (before attention) or qkv (before the QKV GEMM)")
    ap.add_argument("--join", help="step (once per step) or oproj (before each o_proj)")
    ap.add_argument("--priority", help="side stream priority: high, normal or an int")
    ap.add_argument("--cold", action="store_true", help="flush L2 (read+write 3x L2) before every step")
    ap.add_argument("--prefetch-lib", default=None)
    ap.add_argument("--micro", action="store_true", help="also run the GEMM micro-benchmark (into the JSON)")
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--plot", dest="plot_path")
    ap.add_argument("--text", dest="text_path")
    a = ap.parse_args(argv)
    try:
        _, text, rc = bench_decode_cli(
            lib_args=a.lib, libs_file=a.libs_file, models=a.models, dtypes=a.dtypes, batches=a.batches,
            contexts=a.contexts, layers=a.layers, rounds=a.rounds, reps=a.reps, prefetch_lib=a.prefetch_lib,
            cold=a.cold, micro=a.micro, json_path=a.json_path, plot_path=a.plot_path, text_path=a.text_path,
            wpf=a.wpf, cap=a.cap, grid=a.grid, threads=a.threads, chunk=a.chunk, hint=a.hint, fork=a.fork,
            join=a.join, priority=a.priority,
        )  # fmt: skip
    except KvpatchError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(text)
    return rc


if __name__ == "__main__":
    sys.exit(main())
