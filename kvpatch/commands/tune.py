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

from ..errors import UsageError
from ..fsutil import check_outputs, write_atomic, write_both
from ..gpu.defaults import DEFAULT_ROUNDS, TUNE_REPS
from ..progress import QUIET, Progress
from ..source.includes import check_tree_files
from .common import Libraries, LibraryOptions, built, check_sources, input_files, kept_paths, local_machine, prebuilt

if TYPE_CHECKING:
    from ..tune.report import TuneReport


@dataclass
class TuneOptions(LibraryOptions):
    """``libs``: stock + one library per candidate, their configurations from the
    ``variant_info`` markers; empty: build the grid's candidates from ``tree``."""

    output: Path = Path("kvpatch.toml")
    json_out: Optional[Path] = None
    quick: bool = False
    reps: int = TUNE_REPS
    rounds: int = DEFAULT_ROUNDS
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


def _prebuilt_candidates(o: TuneOptions) -> tuple[Libraries, dict[str, Any]]:
    from ..tune import candidate_configs

    libs = prebuilt(o.libs, o.variant_info)
    if "stock" not in libs.libs:
        raise UsageError("kvpatch tune --lib: one library must be named 'stock'")
    configs = {}
    for name, info in libs.info.items():
        try:
            configs.update(candidate_configs({name: info}))
        except UsageError:
            raise UsageError(
                f"kvpatch tune --lib: no configuration for {name!r} (give --variant-info with its marker)"
            ) from None
    if not configs:
        raise UsageError("kvpatch tune --lib: give stock and at least one candidate")
    return libs, configs


def run(o: TuneOptions, *, progress: Progress = QUIET) -> TuneReport:
    """``kvpatch tune``: build (or load) the candidates, validate, bench on the tuning set, write the best."""
    from .. import tune as T
    from ..arch import parse_arch_list
    from ..gpu import points as P
    from ..gpu.env import require_cuda
    from ..source.releases import revision_of

    if o.policy not in T.POLICIES:
        raise UsageError(f"invalid --policy {o.policy!r}: choose {', '.join(T.POLICIES)}")
    if o.fallback not in T.FALLBACKS:
        raise UsageError(f"invalid --fallback {o.fallback!r}: choose {', '.join(T.FALLBACKS)}")
    if o.reps < 1 or o.rounds < 1:
        raise UsageError("--reps and --rounds must be >= 1")
    if o.jobs is not None and o.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, not {o.jobs}")
    bad = [d for d in o.dtypes if d not in P.TUNING_DTYPES]
    if bad:
        raise UsageError(f"invalid --dtype {bad[0]!r}: tune measures {', '.join(P.TUNING_DTYPES)}")
    T.tuned_instantiations(o.dtypes, o.only)  # checks --only
    grids = T.parse_grids(o.grid)
    check_outputs(output=o.output, json=o.json_out, inputs=input_files(o), protected=kept_paths(o.cwd))
    if o.from_json:
        if o.grid or o.dtypes or o.only:
            raise UsageError("--grid, --dtype and --only choose what to measure; --from measures nothing")
        return _rechoose_command(o)
    if o.exclude:
        raise UsageError("--exclude works with --from (a saved tune JSON)")
    if o.libs and o.grid:
        raise UsageError("--grid builds candidates; with --lib the candidates are the libraries given")
    check_sources(o)
    if not o.libs and not T.candidates(None, grids):
        raise UsageError("the --grid yields no candidate (min-kv-mib pairs only with issue=call)")
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
        configs = T.candidates(tree_config(target, o.cwd, progress, header), grids)
        variants = B.patched_variants(header.stock, str(target.header), configs)
        spec = tune_build_spec(target.root, variants, o.arch, dtypes=o.dtypes or None, only=o.only)
        libs = built(B.build(spec, jobs=o.jobs, progress=progress), variants)
        flags, version, tree = None, revision_of(header.stock), str(target.root)
    arch = ",".join(a.code for a in parse_arch_list(o.arch))
    here = local_machine(arch=arch)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    machine = replace(here, flags=_semantic_flags(flags) or here.flags,
                      note=f"{when}, vLLM {version or '?'}, tuning set"
                      + (f" ({', '.join([*o.dtypes, *o.only])})" if o.dtypes or o.only else "")
                      + f", policy {o.policy}")  # fmt: skip
    report = T.run_tune(libs.libs, configs, quick=o.quick, reps=o.reps, rounds=o.rounds, policy=o.policy,
                        fallback=o.fallback, progress=progress.say, variant_info=libs.info, machine=machine,
                        dtypes=o.dtypes, only=o.only)  # fmt: skip
    report.tree = tree
    return _write_tune(o, report)


def _rechoose_command(o: TuneOptions) -> Any:
    """``kvpatch tune --from tune.json [--from more.json]``: the saved measurements (merged,
    per kernel the last run's), chosen again; writes the same files."""
    from .. import tune as T
    from ..config import Machine

    runs = [read_tune_json(path) for path in map(Path, o.from_json)]
    data = runs[0] if len(runs) == 1 else T.merge_tune_data(runs)
    names = ", ".join(
        f"{Path(p).parent.name}/{Path(p).name}" if Path(p).parent.name else Path(p).name for p in o.from_json
    )
    machine = (
        Machine.from_dict(data["machine"], f"machine in {names}") if isinstance(data.get("machine"), dict) else None
    )
    if machine is not None:
        extra = f"chosen again from {names}, policy {o.policy}" + (
            f", excluding {', '.join(o.exclude)}" if o.exclude else ""
        )
        machine = replace(machine, note="; ".join(x for x in (machine.note, extra) if x))
    return _write_tune(o, T.rechoose(data, policy=o.policy, fallback=o.fallback, exclude=o.exclude, machine=machine))


#: A saved tune JSON larger than this (on disk, or decompressed) is not one kvpatch wrote: the
#: largest real one is ~30 MB.
MAX_TUNE_JSON = 1 << 30


def read_tune_json(path: Path) -> dict:
    """A saved tune JSON (gzipped or not), bounded: one-line UsageError for a file that is not
    one, is nested too deeply, or would decompress past :data:`MAX_TUNE_JSON`."""
    import zlib

    from ..fsutil import parse_json, read_input

    raw = read_input(path, "tune JSON", limit=MAX_TUNE_JSON)
    if raw[:2] == b"\x1f\x8b":
        d = zlib.decompressobj(wbits=31)
        try:
            raw = d.decompress(raw, MAX_TUNE_JSON + 1)
        except zlib.error as e:
            raise UsageError(f"cannot read tune JSON {path}: corrupt gzip ({e})") from None
        if len(raw) > MAX_TUNE_JSON or d.unconsumed_tail:
            raise UsageError(f"cannot read tune JSON {path}: it decompresses to more than {MAX_TUNE_JSON >> 20} MiB")
    try:
        data = parse_json(raw)
    except ValueError as e:  # not JSON, not UTF-8, nested too deeply
        raise UsageError(f"cannot read tune JSON {path}: {str(e).splitlines()[0][:120]}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a kvpatch tune JSON")
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
