"""``kvpatch bench-decode`` (and the weight-prefetch sweep): a model-shaped decode step,
stock and patched attention, with and without the L2 weight prefetch, beside its controls
(the A/A twin, the zero-byte arm, the in-kernel form and its zero-byte load).

The data flow: options checked (models, dtypes, the weight-prefetch configuration, the
in-kernel form, the outputs) -> the GPU checked -> the attention libraries (``--lib``/``--libs-file``,
or stock + patched built from the tree for the models' head sizes; a ``tail`` library also gets a
second load, ``tail0``, for the in-kernel form's zero-byte arm) -> :func:`kvpatch.decode.bench.run_bench_decode`
(per point: capture, outputs bit-identical first, interleaved rounds) -> the report (JSON,
plot; the CLI writes the text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

from ..config.model import check_seconds
from ..errors import UsageError
from ..fsutil import check_outputs
from ..gpu.defaults import DECODE_LAYERS, DECODE_ROUNDS, MAX_DECODE_LAYERS
from ..gpu.points import check_batches, check_contexts
from ..progress import QUIET, Progress
from .common import (
    LibraryOptions,
    build_libraries,
    check_arch,
    check_directory,
    check_input_file,
    check_lib_files,
    check_lib_or_tree,
    input_files,
    kept_paths,
    parse_libs,
    require_device,
)

if TYPE_CHECKING:
    from ..decode.report import DecodeReport

#: Rounds with weight prefetch on (a 1-2% effect must clear the round-to-round spread).
WPF_ROUNDS = 7


@dataclass
class DecodeOptions(LibraryOptions):
    libs_file: Optional[Path] = None  # NAME=PATH.so:PREFIX lines, '#' comments
    models: Optional[list[str]] = None
    dtypes: Optional[list[str]] = None
    batches: Optional[list[int]] = None
    contexts: Optional[list[int]] = None
    layers: int = DECODE_LAYERS
    rounds: Optional[int] = None  # None: 7 with weight prefetch, else DECODE_ROUNDS
    cycles: Optional[int] = None  # whole carry-over cycles per round (None: ~0.15 s a round)
    aa: bool = True  # the A/A twin (stock-aa)
    zero: bool = True  # the zero-byte arm (stock+zero)
    tail: Optional[str] = None  # the in-kernel form, CAPS[@HINT] (needs a 'tail' library)
    guard: str = "auto"  # the evict_last guard: auto, on, off
    #: the weight prefetch: a whole configuration (``wpf``) and single knobs over it
    prefetch: dict[str, Any] = field(default_factory=dict)
    prefetch_lib: Optional[Path] = None
    cold: bool = False
    micro: bool = False
    json_out: Optional[Path] = None
    plot: Optional[Path] = None
    text: Optional[Path] = None  # checked here, written by the CLI (the text is a rendering)


#: The knobs of ``prefetch``.
PREFETCH_KNOBS = ("cap", "grid", "threads", "chunk", "hint", "fork", "join", "priority")


def weight_prefetch_of(prefetch: Mapping[str, Any]) -> Any:
    """The options' prefetch -> a :class:`~kvpatch.decode.options.WeightPrefetch` (``wpf``: the
    whole configuration as text, e.g. the sweep's pick; single knobs override it)."""
    from ..decode.options import WeightPrefetch, gives_windows

    bad = sorted(set(prefetch) - {*PREFETCH_KNOBS, "wpf"})
    if bad:
        raise UsageError(f"unknown weight-prefetch option(s): {', '.join(bad)}")
    given = [(k, prefetch[k]) for k in PREFETCH_KNOBS if prefetch.get(k) is not None]
    for k, v in given:
        if str(v).strip() == "" or any(c in str(v) for c in ";="):
            raise UsageError(f"invalid --{k} {str(v)!r}: one value (a whole configuration goes in --wpf)")
    if prefetch.get("wpf") is not None and not str(prefetch["wpf"]).replace(";", "").strip():  # an unset variable
        raise UsageError("--wpf is empty: give a weight-prefetch configuration (KEY=VALUE;...)")
    base = WeightPrefetch.parse(prefetch["wpf"]) if prefetch.get("wpf") else None
    first_form = [f"--{k}" for k, _ in given if k in ("cap", "fork")]
    if base is not None and first_form and gives_windows(prefetch["wpf"]):  # the knob would drop the windows
        raise UsageError(f"--wpf gives windows and {'/'.join(first_form)} the first form: give either, not both")
    return WeightPrefetch.parse(";".join(f"{k}={v}" for k, v in given), base)


def library_specs(libs: list[str], libs_file: Optional[Path]) -> list:
    """``--lib`` items and a libs file's lines -> specs; 'stock' among them (when any)."""
    items = list(libs)
    if libs_file is not None:
        from ..fsutil import read_text_input

        text = read_text_input(libs_file, "--libs-file", limit=1 << 20)
        listed = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        if not listed:
            raise UsageError(f"--libs-file {libs_file} names no library (NAME=PATH.so:PREFIX lines)")
        items += [_beside(line, libs_file.parent) for line in listed]
    specs = parse_libs(items)
    if specs and "stock" not in [s.name for s in specs]:
        raise UsageError("--lib: one library must be named 'stock' (the baseline)")
    return specs


def _beside(line: str, folder: Path) -> str:
    """A libs file's ``NAME=PATH:PREFIX`` line with a relative PATH read from the file's folder,
    as ``scripts/gpu_prepare.py`` writes them (not from wherever the command runs)."""
    name, eq, rest = line.partition("=")
    path, colon, prefix = rest.rpartition(":")
    if not (eq and colon and path) or path.startswith("~") or Path(path).is_absolute():
        return line  # malformed ones are parse_libs' to refuse
    return f"{name}={folder / path}:{prefix}"


def check(o: DecodeOptions) -> tuple[list[str], list[str], list[int], list[int], Any, list]:
    """Every option checked (one-line UsageError) before the GPU is: (models, dtypes,
    batches, contexts, weight prefetch, library specs)."""
    from ..decode.models import model_shape
    from ..decode.options import DEFAULT_BATCHES, DEFAULT_CONTEXTS, DEFAULT_DTYPES, DEFAULT_MODELS
    from ..decode.step import DTYPES

    models = list(o.models or DEFAULT_MODELS)
    for m in models:
        model_shape(m)
    dtypes = list(o.dtypes or DEFAULT_DTYPES)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise UsageError(f"invalid dtype {bad[0]!r}: {' or '.join(DTYPES)}")
    batches, contexts = list(o.batches or DEFAULT_BATCHES), list(o.contexts or DEFAULT_CONTEXTS)
    if o.layers < 1 or any(v is not None and v < 1 for v in (o.rounds, o.cycles)):
        raise UsageError("--layers, --rounds and --cycles must be >= 1")
    if o.layers > MAX_DECODE_LAYERS:
        raise UsageError(f"--layers must be at most {MAX_DECODE_LAYERS}, not {o.layers}")
    check_batches(batches)
    check_contexts(contexts)
    if o.guard not in ("auto", "on", "off"):
        raise UsageError(f"invalid --guard {o.guard!r}: auto, on or off")
    wpf = weight_prefetch_of(o.prefetch)
    specs = library_specs(o.libs, o.libs_file)
    tail = tail_of(o.tail)
    if tail is not None and "tail" not in {s.name for s in specs}:  # a build from the tree makes none
        raise UsageError(
            "--tail needs a weight-tail library named 'tail' (--lib tail=...: scripts/gpu_decode.sh --prepare builds one)"
        )
    check_outputs(
        json=o.json_out, plot=o.plot, text=o.text, inputs=input_files(o, specs), protected=kept_paths(o.cwd, o.tree)
    )
    if o.plot is not None:
        from ..gpu.plot import plot_format

        plot_format(o.plot)
    check_lib_files(specs)
    check_lib_or_tree(o, specs)
    check_input_file(o.prefetch_lib, "--prefetch-lib")
    return models, dtypes, batches, contexts, wpf, specs, tail


def tail_of(text: Optional[str]) -> Any:
    """``--tail CAPS[@HINT]`` -> a :class:`~kvpatch.decode.windows.TailPrefetch` (None: none)."""
    if text is not None and not text.strip():  # an unset shell variable: not 'off'
        raise UsageError("--tail is empty: give CAPS[@HINT], or off")
    if text is None or text.strip().lower() in ("off", "none"):
        return None
    from ..decode.options import parse_caps
    from ..decode.windows import TailPrefetch

    caps, at, hint = text.partition("@")
    try:
        return TailPrefetch(parse_caps(caps), hint.strip() if at else "evict_normal")
    except UsageError as e:  # said for --tail: the window's own check names attn->oproj
        raise UsageError(f"invalid --tail {text!r}: {e}") from None


def with_tail_copy(libs: dict[str, Any], folder: Optional[Path] = None) -> dict[str, Any]:
    """``libs`` with ``tail0``, a second load of the ``tail`` library (a copy of its file: its own
    table, which stays empty), where there is a ``tail`` library and no ``tail0``."""
    if "tail" not in libs or "tail0" in libs:
        return libs
    import tempfile

    from ..gpu.launch import Kernels
    from ..prefetch.tail import second_copy

    tail = libs["tail"]
    where = folder or Path(tempfile.mkdtemp(prefix="kvpatch-tail0-"))
    return {**libs, "tail0": Kernels(second_copy(tail.path, where), tail.prefix)}


def run(o: DecodeOptions, *, progress: Progress = QUIET) -> DecodeReport:
    """``kvpatch bench-decode``: the :class:`~kvpatch.decode.report.DecodeReport` (JSON and plot written)."""
    from ..decode.models import model_shape

    models, dtypes, batches, contexts, wpf, specs, tail = check(o)
    target = None
    if not specs:  # the tree to build from, and the arch, checked before the GPU is
        from .tree import resolve_source  # (not on prebuilt libraries: a GPU machine may lack what fetching needs)

        check_arch(o.build_arch)
        target = resolve_source(o.tree, o.cwd)
    require_device("cuda")
    from ..decode.bench import run_bench_decode
    from ..decode.micro import run_micro_gemm

    if specs:
        from ..gpu.launch import load_libs

        try:
            libs: Mapping[str, Any] = load_libs(specs)
        except (RuntimeError, OSError) as e:
            raise UsageError(str(e)) from None
    else:
        from .tree import variants_for

        variants = variants_for(target, o.cwd, progress)
        heads = sorted({model_shape(m).head_size for m in models})
        libs = build_libraries(o.tree, o.cwd, o.build_arch, variants, progress, dtypes=dtypes, head_sizes=heads,
                               block_sizes=[16], kv_cache_dtypes=["auto"]).libs  # fmt: skip
    if tail is not None:
        libs = with_tail_copy(dict(libs))
    rounds = o.rounds if o.rounds is not None else (WPF_ROUNDS if not wpf.off() or tail is not None else DECODE_ROUNDS)
    report = run_bench_decode(libs, models=models, dtypes=dtypes, batches=batches, contexts=contexts, layers=o.layers,
                              rounds=rounds, cycles=o.cycles, cold=o.cold, weight_prefetch=wpf, aa=o.aa, zero=o.zero,
                              tail=tail, guard=o.guard, prefetch_library=str(o.prefetch_lib) if o.prefetch_lib else None,
                              json_path=o.json_out, plot_path=o.plot, progress=progress.say)  # fmt: skip
    if o.micro:
        report.micro = run_micro_gemm(
            str(o.prefetch_lib) if o.prefetch_lib else None, priority=wpf.priority, hint=wpf.hint
        )
        if o.json_out:
            report.save_json(o.json_out)
    return report


@dataclass
class SweepOptions:
    libs: list[str] = field(default_factory=list)
    libs_file: Optional[Path] = None
    out: Path = Path("sweep-out")
    budget: float = 420.0
    prefetch_lib: Optional[Path] = None
    stages: Optional[list[str]] = None  # None: every stage (kvpatch.decode.sweep.SHARES)
    tail: bool = True  # the in-kernel arms, where a 'tail' library is given


def sweep_identical(result: Mapping[str, Any]) -> bool:
    """Whether every output of a sweep's result was bit-identical to stock's."""
    from ..decode.picks import all_identical

    return all_identical(result)


def run_sweep(o: SweepOptions, *, progress: Progress = QUIET) -> dict[str, Any]:
    """The weight-prefetch sweep (:mod:`kvpatch.decode.sweep`): ``sweep.json`` in ``out``."""
    from ..decode.picks import SHARES, TAIL

    specs = library_specs(o.libs, o.libs_file)
    if "stock" not in {s.name for s in specs}:
        raise UsageError(f"the sweep needs a library 'stock', got {', '.join(s.name for s in specs) or 'none'}")
    check_seconds(o.budget, "--budget")
    stages = list(o.stages or SHARES)
    bad = sorted(set(stages) - set(SHARES))
    if bad:
        raise UsageError(f"unknown sweep stage(s) {', '.join(bad)}: {', '.join(SHARES)}")
    check_lib_files(specs)
    check_input_file(o.prefetch_lib, "--prefetch-lib")
    check_directory("--out", o.out)  # its files: none an input, none in what kvpatch keeps
    check_outputs(out=o.out / "sweep.json", inputs=input_files(o, specs), protected=kept_paths(Path.cwd()))
    require_device("cuda")
    from ..decode.sweep import run_sweep as sweep
    from ..gpu.launch import load_libs

    libs = load_libs(specs)
    if not o.tail:
        libs = {k: v for k, v in libs.items() if k not in ("tail", "tail0")}
    libs = with_tail_copy(dict(libs))
    return sweep(libs, o.out, budget_s=o.budget, prefetch_library=str(o.prefetch_lib) if o.prefetch_lib else None,
                 stages=stages, tail=TAIL if "tail" in libs else None, progress=progress.say)  # fmt: skip
