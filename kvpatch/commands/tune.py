"""The body of ``kvpatch tune``: options in, one report out (``--from``: no GPU).

Builds (or loads, ``--lib``) the grid's candidates, validates and benches them on the
tuning set (:func:`kvpatch.tune.run_tune`), or chooses again from a saved tune JSON
(:func:`kvpatch.tune.rechoose`), and writes the configuration with the machine it was
tuned on (and the JSON if asked).
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ..config.toml import check_variant_name
from ..errors import UsageError
from ..fsutil import check_outputs, write_atomic, write_both
from ..gpu.defaults import DEFAULT_ROUNDS, TUNE_REPS
from ..progress import QUIET, Progress
from ..source.includes import check_tree_files
from .common import (
    DEFAULT_ARCH,
    Libraries,
    LibraryOptions,
    built,
    check_arch,
    check_sources,
    input_files,
    kept_paths,
    local_machine,
    prebuilt,
)

if TYPE_CHECKING:
    from ..tune.report import TuneReport


@dataclass
class TuneOptions(LibraryOptions):
    """``libs``: stock + one library per candidate, their configurations from the
    ``variant_info`` markers; empty: build the grid's candidates from ``tree``. ``arch``,
    ``reps`` and ``rounds`` are None unless given (``--from`` refuses them): then
    :data:`DEFAULT_ARCH`, ``TUNE_REPS`` and ``DEFAULT_ROUNDS``."""

    arch: Optional[str] = None
    output: Path = Path("kvpatch.toml")
    json_out: Optional[Path] = None
    quick: bool = False
    reps: Optional[int] = None
    rounds: Optional[int] = None
    policy: str = "strict"
    fallback: str = "off"
    jobs: Optional[int] = None
    #: choose again from saved tune JSONs (no GPU, nothing built; several: per kernel, the
    #: last that measured it), with these exclusions
    from_json: list[Path] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    #: the grids to build, their candidates' union (:func:`kvpatch.tune.parse_grid`; none: the default grid)
    grid: list[str] = field(default_factory=list)
    #: measure only these query dtypes' kernels (empty: every tuned dtype)
    dtypes: list[str] = field(default_factory=list)
    #: measure only the tuned instantiations these selectors (dtype[/head[/block]]) pick
    only: list[str] = field(default_factory=list)
    #: the configuration to improve on (:func:`kvpatch.tune.choose`): a ``--lib`` or ``--from``
    #: candidate; when building, the tree's own configuration, built as a candidate of this name
    incumbent: Optional[str] = None


def tune_build_spec(root: Path, variants: list, arch: str, kv_cache_dtypes: Sequence[str] = ("auto",),
                    dtypes: Optional[Sequence[str]] = None, only: Sequence[str] = ()) -> Any:  # fmt: skip
    """What tune builds: every tuned instantiation of the tuning set (or of ``dtypes``, or
    those ``only``'s selectors pick: the smallest dtype x head x block product holding them), v1 + v2
    (auto cache; with fp8 too, what the held-out set runs)."""
    from .. import jit as B
    from ..tune import tuned_instantiations

    insts = tuned_instantiations(dtypes or (), only)
    return B.make_spec(root, variants, arch, dtypes=sorted({d for d, _, _ in insts}),
                       head_sizes=sorted({h for _, h, _ in insts}), block_sizes=sorted({b for _, _, b in insts}),
                       kv_cache_dtypes=list(kv_cache_dtypes))  # fmt: skip


def _prebuilt_candidates(o: TuneOptions, loader: Any = None) -> tuple[Libraries, dict[str, Any]]:
    """The ``--lib`` libraries (loaded by ``loader``, default :func:`~kvpatch.commands.common.prebuilt`'s)
    and the candidates' configurations from their markers: one-line UsageError without a
    'stock', a candidate or a configuration for each. ``loader=_no_load`` checks, loading nothing."""
    from ..tune import candidate_configs

    libs = prebuilt(o.libs, o.variant_info, loader=loader)
    if "stock" not in libs.info:
        raise UsageError("--lib: one library must be named 'stock'")
    try:
        configs = candidate_configs(libs.info)
    except UsageError as e:
        raise UsageError(f"--lib: {e}; give --variant-info with its marker") from None
    if not configs:
        raise UsageError("--lib: give stock and at least one candidate")
    return libs, configs


def _no_load(specs: Any) -> dict[str, Any]:
    """A :func:`~kvpatch.commands.common.prebuilt` loader that loads nothing: the options checked
    before the GPU is looked for."""
    return {}


def _measuring_options(o: TuneOptions) -> list[tuple[str, bool]]:
    """What only a tune that builds and measures uses, as (option, whether it was given): ``--from`` refuses them."""
    return [("--tree", o.tree is not None), ("--arch", o.arch is not None), ("--lib", bool(o.libs)),
            ("--variant-info", o.variant_info is not None), ("--grid", bool(o.grid)), ("--dtype", bool(o.dtypes)),
            ("--only", bool(o.only)), ("--quick", o.quick), ("--reps", o.reps is not None),
            ("--rounds", o.rounds is not None), ("--jobs", o.jobs is not None)]  # fmt: skip


def run(o: TuneOptions, *, progress: Progress = QUIET) -> TuneReport:
    """``kvpatch tune``: build (or load) the candidates, validate, bench on the tuning set, write the best."""
    from .. import tune as T
    from ..gpu import points as P
    from ..gpu.env import require_cuda
    from ..source.releases import revision_of

    if o.policy not in T.POLICIES:
        raise UsageError(f"invalid --policy {o.policy!r}: choose {', '.join(T.POLICIES)}")
    if o.fallback not in T.FALLBACKS:
        raise UsageError(f"invalid --fallback {o.fallback!r}: choose {', '.join(T.FALLBACKS)}")
    if (o.reps is not None and o.reps < 1) or (o.rounds is not None and o.rounds < 1):
        raise UsageError("--reps and --rounds must be >= 1")
    if o.jobs is not None and o.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, not {o.jobs}")
    bad = [d for d in o.dtypes if d not in P.TUNING_DTYPES]
    if bad:
        raise UsageError(f"invalid --dtype {bad[0]!r}: tune measures {', '.join(P.TUNING_DTYPES)}")
    T.tuned_instantiations(o.dtypes, o.only)  # checks --only
    grids = T.parse_grids(o.grid)
    check_outputs(output=o.output, json=o.json_out, inputs=input_files(o), protected=kept_paths(o.cwd, o.tree))
    if o.from_json:
        ignored = [name for name, given in _measuring_options(o) if given]
        if ignored:
            raise UsageError(f"{', '.join(ignored)}: --from measures nothing (it chooses again from the saved "
                             "measurements, with --exclude, --policy and --fallback)")  # fmt: skip
        return _rechoose_command(o)
    o = replace(o, arch=DEFAULT_ARCH if o.arch is None else o.arch, reps=TUNE_REPS if o.reps is None else o.reps,
                rounds=DEFAULT_ROUNDS if o.rounds is None else o.rounds)  # fmt: skip
    if o.exclude:
        raise UsageError("--exclude works with --from (a saved tune JSON)")
    if o.libs and o.grid:
        raise UsageError("--grid builds candidates; with --lib the candidates are the libraries given")
    if not o.libs and o.incumbent is not None:
        check_variant_name(o.incumbent)
        if o.incumbent == "stock" or o.incumbent in T.candidates(None, grids):
            raise UsageError(f"--incumbent {o.incumbent!r} names stock or one of the grid's candidates: "
                             "name the tree's configuration apart")  # fmt: skip
    check_sources(o, arch_read=True)  # with --lib, the arch is recorded
    if o.libs and o.jobs is not None:
        raise UsageError("--jobs sets nvcc's processes; with --lib nothing is built")
    if not o.libs and not T.candidates(None, grids):
        raise UsageError("the --grid yields no candidate (min-kv-mib pairs only with issue=call)")
    if o.libs:
        _check_incumbent(o.incumbent, _prebuilt_candidates(o, loader=_no_load)[1], "a --lib candidate")
    arch = ",".join(a.code for a in check_arch(o.arch))
    require_cuda()
    tree = None
    if o.libs:
        libs, configs = _prebuilt_candidates(o)
        flags = (libs.info.get("stock") or {}).get("compile_flags")
        version = (libs.info.get("stock") or {}).get("vllm")
    else:
        from .. import jit as B
        from ..patch import read_header
        from .tree import resolve, tree_config

        target = resolve(o.tree, o.cwd)
        check_tree_files(target.root)
        header = read_header(target.read_header(), str(target.header))
        current = tree_config(target, o.cwd, progress, header)
        configs = T.candidates(current, grids)
        if o.incumbent is not None:
            configs[o.incumbent] = current
        variants = B.patched_variants(header.stock, str(target.header), configs)
        spec = tune_build_spec(target.root, variants, o.arch, dtypes=o.dtypes or None, only=o.only)
        libs = built(B.build(spec, jobs=o.jobs, progress=progress), variants)
        flags, version, tree = None, revision_of(header.stock), str(target.root)
    here = local_machine(arch=arch)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    machine = replace(here, flags=_semantic_flags(flags) or here.flags,
                      note=f"{when}, vLLM {version or '?'}, tuning set"
                      + (f" ({', '.join([*o.dtypes, *o.only])})" if o.dtypes or o.only else "")
                      + f", policy {o.policy}" + (f", against {o.incumbent}" if o.incumbent else ""))  # fmt: skip
    report = T.run_tune(libs.libs, configs, quick=o.quick, reps=o.reps, rounds=o.rounds, policy=o.policy,
                        fallback=o.fallback, progress=progress.say, variant_info=libs.info, machine=machine,
                        dtypes=o.dtypes, only=o.only, incumbent=o.incumbent)  # fmt: skip
    report.tree = tree
    return _write_tune(o, report)


def _rechoose_command(o: TuneOptions) -> Any:
    """``kvpatch tune --from tune.json [--from more.json]``: the saved measurements (merged,
    per kernel the last run's), chosen again; writes the same files."""
    from .. import tune as T

    paths = list(map(Path, o.from_json))
    runs = [read_tune_json(path) for path in paths]
    if len(runs) > 1:  # each file checked as it is alone, before any is merged (merging drops rows)
        for path, data in zip(paths, runs):
            try:
                T.rechoose(data, policy=o.policy, fallback=o.fallback)
            except UsageError as e:
                raise UsageError(f"--from {path}: {e}") from None
    data = runs[0] if len(runs) == 1 else T.merge_tune_data(runs)
    names = ", ".join(
        f"{Path(p).parent.name}/{Path(p).name}" if Path(p).parent.name else Path(p).name for p in o.from_json
    )
    machine = T.saved_machine(data, f"machine in {names}")
    if machine is not None:
        extra = (f"chosen again from {names}, policy {o.policy}" + (f", against {o.incumbent}" if o.incumbent else "")
                 + (f", excluding {', '.join(o.exclude)}" if o.exclude else ""))  # fmt: skip
        machine = replace(machine, note="; ".join(x for x in (machine.note, extra) if x))
    report = T.rechoose(data, policy=o.policy, fallback=o.fallback, exclude=o.exclude, machine=machine,
                        incumbent=o.incumbent)  # fmt: skip
    return _write_tune(o, report)


def _check_incumbent(name: Optional[str], configs: dict[str, Any], what: str) -> None:
    """``--incumbent``, if given, names one of ``configs`` (UsageError naming ``what`` otherwise)."""
    if name is not None and name not in configs:
        raise UsageError(f"--incumbent {name!r} is not {what} ({', '.join(sorted(configs)) or 'none'})")


#: A saved tune JSON larger than this (on disk, or decompressed) is not one kvpatch wrote: the
#: largest real one is ~30 MB.
MAX_TUNE_JSON = 1 << 30


def read_tune_json(path: Path) -> dict:
    """A saved tune JSON (gzipped or not), bounded: one-line UsageError for a file that is not
    one, is nested too deeply, would decompress past :data:`MAX_TUNE_JSON`, is a gzip stream cut
    short or followed by anything (garbage, a second member), or records a machine
    :func:`kvpatch.tune.saved_machine` refuses: every ``--from`` file, before any is merged."""
    import zlib

    from ..fsutil import parse_json, read_input
    from ..tune import saved_machine

    raw = read_input(path, "tune JSON", limit=MAX_TUNE_JSON)
    if raw[:2] == b"\x1f\x8b":
        d = zlib.decompressobj(wbits=31)
        try:
            raw = d.decompress(raw, MAX_TUNE_JSON + 1)
        except zlib.error as e:
            raise UsageError(f"cannot read tune JSON {path}: corrupt gzip ({e})") from None
        if len(raw) > MAX_TUNE_JSON or d.unconsumed_tail:
            raise UsageError(f"cannot read tune JSON {path}: it decompresses to more than {MAX_TUNE_JSON >> 20} MiB")
        if not d.eof:
            raise UsageError(f"cannot read tune JSON {path}: the gzip stream is cut short (a truncated file)")
        if d.unused_data:
            raise UsageError(f"cannot read tune JSON {path}: {len(d.unused_data)} bytes follow the gzip stream "
                             "(a second member or garbage)")  # fmt: skip
    try:
        data = parse_json(raw)
    except ValueError as e:  # not JSON, not UTF-8, nested too deeply
        raise UsageError(f"cannot read tune JSON {path}: {str(e).splitlines()[0][:120]}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a kvpatch tune JSON")
    saved_machine(data, f"machine in {path}")
    return data


def _write_tune(o: TuneOptions, report: TuneReport) -> TuneReport:
    """What every tune writes: the configuration with its machine, and the JSON if asked."""
    from ..config import dump_config

    toml = dump_config(report.config, report.machine)
    if o.json_out is None:
        write_atomic(o.output, toml)
        return report
    write_both(o.output, toml, o.json_out, json.dumps(report.to_json(), indent=1) + "\n")
    return report


def _semantic_flags(flags: Any) -> str | None:
    """The flags that decide code generation, from a library's full compile line (no
    include paths, -D renames, -Xcompiler/-Xptxas pairs or -gencode)."""
    if not isinstance(flags, list):
        return None
    out, skip = [], False
    for f in flags:
        if skip:
            skip = False
            continue
        if f in ("-Xcompiler", "-Xptxas"):
            skip = True
            continue
        if f.startswith(("-I", "-gencode", "-Dvllm=")):
            continue
        out.append(f)
    return " ".join(out)
