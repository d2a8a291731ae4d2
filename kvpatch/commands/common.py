"""What the commands share: the libraries a GPU command runs on, option parsing that must
happen before anything runs, and this machine's record.

The GPU commands (validate, bench, tune, bench-decode) run on a tree's variants, built
here, or on prebuilt libraries given as ``NAME=path.so:prefix`` (nothing is built; their
configurations come from a ``--variant-info`` JSON beside them, ``stock`` is the baseline).
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from ..config import Machine, variant_files
from ..config.model import whole_number
from ..errors import UsageError, printable
from ..fsutil import write_atomic
from ..gpu import launch as L
from ..gpu.defaults import DEFAULT_ARCH
from ..gpu.points import check_heads
from ..gpu.report import STOCK_MARKER
from ..progress import QUIET, Progress


@dataclass
class LibraryOptions:
    """What validate, bench, tune and bench-decode share: the tree to build from (or prebuilt
    ``libs``, NAME=f.so:PREFIX, with their configurations in ``variant_info``), the working
    directory and the arch to build for (None: not given, :data:`DEFAULT_ARCH`)."""

    tree: Optional[Path] = None
    cwd: Path = field(default_factory=Path.cwd)
    arch: Optional[str] = None
    libs: list[str] = field(default_factory=list)
    variant_info: Optional[Path] = None

    @property
    def build_arch(self) -> str:
        return DEFAULT_ARCH if self.arch is None else self.arch


@dataclass
class Libraries:
    """What a command runs on: loaded libraries and each one's provenance."""

    libs: dict[str, Any]
    info: dict[str, dict[str, Any]]
    specs: list[L.LibSpec]


def parse_libs(lib_specs: Sequence[str]) -> list[L.LibSpec]:
    """``--lib`` values parsed (UsageError, one line): checked before the GPU is."""
    return L.parse_lib_specs(lib_specs)


#: What kvpatch measures of a library itself (:func:`kvpatch.gpu.launch.lib_info`): never taken from a file.
MEASURED_FACTS = ("so", "prefix", "bytes", "sha256", "error")


def load_variant_info(path: Optional[Path], names: Optional[Iterable[str]] = None) -> dict[str, Any]:
    """``{name: marker-or-dict}`` from a JSON file (``scripts/gpu_prepare.py`` writes ``variants.json``):
    each entry a marker (text), or an object holding one under ``marker`` and no fact kvpatch
    measures of the library itself; with ``names`` (the ``--lib`` names) every entry names one of
    them. Markers are not parsed here (a library of an older kvpatch keeps its own): ``tune``
    reads them as configurations."""
    if path is None:
        return {}
    from ..fsutil import parse_json, read_input

    try:
        data = parse_json(read_input(path, "--variant-info", limit=64 << 20))
    except ValueError as e:
        raise UsageError(f"cannot read --variant-info {path}: {str(e).splitlines()[0][:120]}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--variant-info {path}: expected a JSON object of name -> configuration")
    out = {str(k): (v if isinstance(v, dict) else {"marker": v}) for k, v in data.items()}
    known = None if names is None else set(names)
    for name, entry in out.items():
        where = f"--variant-info {path}: {printable(name)!r}"
        if known is not None and name not in known:
            raise UsageError(f"{where} is no --lib library ({', '.join(sorted(known))})")
        facts = sorted(set(entry) & set(MEASURED_FACTS))
        if facts:
            raise UsageError(f"{where} gives {', '.join(facts)}: what kvpatch measures of the library itself")
        if not isinstance(entry.get("marker", ""), str):
            raise UsageError(f"{where}: its marker {reprlib.repr(entry['marker'])} is no text (the "
                             "configuration marker of the library's header)")  # fmt: skip
    return out


def prebuilt(lib_specs: Sequence[str], variant_info: Optional[Path] = None,
             loader: Optional[Callable[[list[L.LibSpec]], dict[str, Any]]] = None) -> Libraries:  # fmt: skip
    """Libraries given on the command line, loaded as given (by ``loader``, default :func:`launch.load_libs`)."""
    specs = parse_libs(lib_specs)
    extra = load_variant_info(variant_info, [s.name for s in specs])
    info = {s.name: {**extra.get(s.name, {}), **L.lib_info(s.path, s.prefix)} for s in specs}
    for name, i in info.items():
        i.setdefault("marker", STOCK_MARKER if name == "stock" else "unknown (no --variant-info)")
    try:
        libs = (loader or L.load_libs)(specs)
    except (RuntimeError, OSError) as e:
        raise UsageError(str(e)) from None
    return Libraries(libs, info, specs)


def built(result: Any, variants: Sequence[Any]) -> Libraries:
    """Libraries of a :func:`kvpatch.jit.build` result, with each variant's marker and compile flags."""
    markers = {v.name: v.marker for v in variants}
    specs = [L.LibSpec(v.name, str(v.library), v.prefix) for v in result.variants]
    flags = {v.name: list(v.compile_flags) for v in result.variants}
    code = {v.name: build_code(v) for v in result.variants}
    info = {s.name: {**L.lib_info(s.path, s.prefix), "marker": markers.get(s.name, "?"),
                     "compile_flags": flags.get(s.name), "code": code.get(s.name)} for s in specs}  # fmt: skip
    return Libraries(L.load_libs(specs), info, specs)


def build_code(result: Any) -> dict[str, Any]:
    """A built variant's ``code`` entry of variant info: its kernels' SASS digests
    (:meth:`kvpatch.jit.result.VariantResult.code`) and the library's sha256 they were read from
    (:func:`kvpatch.gpu.bench_report.code_of` trusts them only for that file)."""
    return {"library_sha256": result.library_sha256, "kernels": result.code()}


def build_libraries(tree: Optional[Path], cwd: Path, arch: str, variants: list, progress: Progress,
                    **kernel_options: Any) -> Libraries:  # fmt: skip
    """Build ``variants`` of the tree (``--tree``, else the last apply's) and load them."""
    from .. import jit
    from .tree import resolve

    target = resolve(tree, cwd)
    spec = jit.make_spec(target.root, variants, arch, **kernel_options)
    return built(jit.build(spec, progress=progress), variants)


def input_files(o: Any, specs: Sequence[L.LibSpec] = ()) -> dict[str, Path]:
    """The files a command reads that its outputs must never name: ``--lib`` libraries (and
    ``specs``, those a ``--libs-file`` names), ``--variant-info``, ``--libs-file``, ``tune --from``
    JSONs, ``--prefetch-lib``, ``--variant`` configurations."""
    out: dict[str, Path] = {}
    for spec in [*parse_libs(getattr(o, "libs", []) or []), *specs]:
        out[f"--lib {spec.name}"] = Path(spec.path)
    for name in ("variant_info", "libs_file", "prefetch_lib"):
        value = getattr(o, name, None)
        if value is not None:
            out["--" + name.replace("_", "-")] = Path(value)
    for path in getattr(o, "from_json", []) or []:
        out[f"--from {path}"] = Path(path)
    for name, path in variant_files(getattr(o, "variants", []) or []).items():
        out[f"--variant {name}"] = path
    return out


def check_sources(o: LibraryOptions, *, tree_read: bool = False, arch_read: bool = False) -> None:
    """What a GPU command runs on, checked before the GPU is: the ``--lib`` specs (files
    that exist; no ``--arch`` or ``--tree`` beside them, but those it reads: :func:`check_lib_or_tree`),
    or the tree to build from and the arch to build for."""
    from .tree import resolve_source

    specs = check_lib_files(parse_libs(o.libs))
    check_lib_or_tree(o, specs, tree_read=tree_read, arch_read=arch_read)
    if o.variant_info is not None and not specs:
        raise UsageError("--variant-info names the --lib libraries' configurations: give it with --lib")
    if not specs:
        check_arch(o.build_arch)
        resolve_source(o.tree, o.cwd)
    if o.variant_info is not None:
        load_variant_info(o.variant_info, [s.name for s in specs])


def check_lib_or_tree(o: LibraryOptions, specs: Sequence[Any], *, tree_read: bool = False,
                      arch_read: bool = False) -> None:  # fmt: skip
    """``--lib`` runs what it names and builds nothing: an ``--arch`` or a ``--tree`` beside it
    (but one the command reads anyway: validate --upstream's tree, the arch tune records) would
    be ignored, so it is refused (one line, exit 2)."""
    if specs and o.arch is not None and not arch_read:
        raise UsageError("--arch builds for an arch; with --lib nothing is built: give the one or the other")
    if specs and o.tree is not None and not tree_read:
        raise UsageError("--tree builds from a tree; with --lib nothing is built: give the one or the other")


def check_lib_files(specs: Sequence[L.LibSpec]) -> Sequence[L.LibSpec]:
    """``--lib`` specs whose files are regular files (a missing one, a directory or a FIFO is
    one line, exit 2, before the GPU or torch is looked at); the specs."""
    for s in specs:
        check_input_file(s.path, f"--lib {s.name}")
    return specs


def check_input_file(path: Optional[str | Path], option: str) -> None:
    """An input file named by ``option`` (``--prefetch-lib``): a regular file, else one line, exit 2.
    None passes."""
    if path is None:
        return
    import os

    from ..fsutil import check_library_file

    check_library_file(path, option, lambda why: UsageError(f"{option} {os.fspath(path)!r}: {why}"))


#: The oldest GPU generation vLLM builds its attention kernels for (compute capability 7.0).
MIN_ARCH_MAJOR = 7


def check_arch(text: str) -> list:
    """``--arch`` parsed (:func:`kvpatch.arch.parse_arch_list`) and each entry one vLLM's kernels
    are built for (compute capability 7.0 or newer): a one-line UsageError otherwise, before
    nvcc is asked."""
    from ..arch import parse_arch_list

    archs = parse_arch_list(text)
    old = [str(a) for a in archs if a.major < MIN_ARCH_MAJOR]
    if old:
        raise UsageError(f"invalid arch {old[0]!r}: vLLM's attention kernels are built for compute capability "
                         f"{MIN_ARCH_MAJOR}.0 and newer")  # fmt: skip
    return archs


def check_kernel_sizes(head_sizes: Optional[Sequence[int]], block_sizes: Optional[Sequence[int]]) -> None:
    """Head and block sizes that vLLM instantiates its kernels for (a point at another size
    could run on no library): one line, exit 2, before anything is built or timed."""
    from ..dtypes import VLLM_BLOCK_SIZES, VLLM_HEAD_SIZES

    for option, given, known in (("--head-sizes", head_sizes, VLLM_HEAD_SIZES),
                                 ("--block-sizes", block_sizes, VLLM_BLOCK_SIZES)):  # fmt: skip
        bad = [v for v in given or () if v not in known]
        if bad:
            raise UsageError(f"invalid {option} value {bad[0]}: vLLM's kernels are instantiated for "
                             f"{', '.join(map(str, known))}")  # fmt: skip


def check_device(device: str) -> str:
    """The hidden ``--device``: ``cuda``, ``cuda:N`` or ``cpu`` (the tests'); anything else is one
    line, exit 2, before torch is imported."""
    import re

    if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:[0-9]{1,3})?", device):
        raise UsageError(f"invalid --device {device!r}: cuda, cuda:N or cpu")
    return device


def check_directory(option: str, directory: Path, *, writable: bool = True) -> None:
    """A directory a command writes into (``--dir``, ``--out``): one, or creatable under one
    this user may write to; checked before anything is built or run. ``writable=False``: one a
    command reads or removes (``plugin status``, ``disable``), which may not be there at all but
    may not be, or lie under, anything but a directory."""
    import os

    try:
        probe = Path(directory)
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        is_dir = probe.is_dir()
    except (OSError, ValueError) as e:
        raise UsageError(f"{option} {directory}: {getattr(e, 'strerror', None) or e}") from None
    if not is_dir:
        raise UsageError(f"{option} {directory}: {probe} is not a directory")
    if writable and not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {directory}: {probe} is not writable")


def require_device(device: str) -> None:
    """A CUDA GPU when the command runs on ``cuda`` (the tests run on ``cpu``): checked
    after every option and before anything is built or loaded."""
    if check_device(device).startswith("cuda"):
        from ..gpu.env import require_cuda

        require_cuda()


def write_if(path: Optional[Path], text: str) -> None:
    """Write ``text`` to ``path`` atomically; nothing when ``path`` is None."""
    if path is not None:
        write_atomic(path, text)


def parse_heads(text: str) -> list[tuple[int, int]]:
    """``'32/8,8/1'`` -> ``[(32, 8), (8, 1)]``."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        q, sep, kv = part.partition("/")
        try:
            out.append((whole_number(q.strip()), whole_number(kv.strip())))
        except ValueError:
            raise UsageError(f"invalid heads {part!r}: use QUERY/KV, e.g. 32/8") from None
        if not sep:
            raise UsageError(f"invalid heads {part!r}: use QUERY/KV, e.g. 32/8")
        check_heads(*out[-1], repr(part))
    if not out:
        raise UsageError(f"invalid heads {text!r}: give at least one QUERY/KV, e.g. 32/8")
    return out


def parse_bools(text: str) -> list[bool]:
    m = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}
    try:
        values = [m[x.strip().lower()] for x in text.split(",") if x.strip()]
    except KeyError as e:
        raise UsageError(f"invalid on/off list {text!r}: {e}") from None
    if not values:
        raise UsageError(f"an empty on/off list {text!r}: give on, off or both")
    return values


def local_machine(*, arch: str | None = None) -> Machine:
    """This machine: the first GPU nvidia-smi lists (none without it), the nvcc a build would
    use, and kvpatch's compile flags (those every kvpatch build passes)."""
    from ..gpu.env import nvidia_smi_query
    from ..jit.flags import vllm_nvcc_flags
    from ..jit.toolchain import nvcc_version_of

    rows = nvidia_smi_query(("name", "driver_version"))
    gpu = driver = None
    if rows:
        gpu, driver = rows[0].get("name"), rows[0].get("driver_version")
    return Machine(gpu=gpu, driver=driver, nvcc=nvcc_version_of(), arch=arch, flags=" ".join(vllm_nvcc_flags()))


__all__ = [
    "QUIET", "Libraries", "LibraryOptions", "Progress", "build_libraries", "built", "check_arch", "check_device",
    "DEFAULT_ARCH", "check_directory", "check_input_file", "check_kernel_sizes", "check_lib_files", "check_lib_or_tree", "kept_paths", "load_variant_info",
    "check_stdout", "local_machine", "parse_bools", "parse_heads", "parse_libs", "prebuilt", "require_device", "write_if",
]  # fmt: skip


def check_report_output(
    json_value: Optional[str],
    cwd: Path,
    *,
    tree: Optional[Path] = None,
    inputs: Optional[dict[str, Any]] = None,
    protected: Optional[dict[str, Any]] = None,
) -> None:
    """``--json PATH`` checked before the command does any work: writable, and none of the
    files kvpatch keeps (:func:`kept_paths`: of ``tree`` if given, else of the last apply here),
    of the command's ``inputs`` or of its own ``protected`` ones (a ``--dir`` bundle); ``-``:
    stdout, where the shell made it a file (:func:`kvpatch.fsutil.check_output`). None passes."""
    if json_value is None:
        return
    from ..fsutil import check_output

    keep = {**kept_paths(cwd, tree), **{k: v for k, v in (protected or {}).items() if v is not None}}
    read = {k: v for k, v in (inputs or {}).items() if v is not None}
    check_output("json", json_value, inputs=read, protected=keep)


def check_stdout(cwd: Path, *, tree: Any = None, inputs: Optional[dict[str, Any]] = None) -> None:
    """Where the shell made stdout a regular file (``kvpatch diff >> .kvpatch/state.json``,
    ``kvpatch config --config k.toml >> k.toml``), it may be none of :func:`kept_paths` (of
    ``tree``, else of the last apply here) and none of the command's ``inputs``: a one-line
    :class:`UsageError` before any work. A terminal, a pipe or a closed stdout is not looked at."""
    from ..fsutil import check_outputs, stdout_file

    if stdout_file() is None:
        return

    read = {k: v for k, v in (inputs or {}).items() if v is not None}
    check_outputs(inputs=read, protected=kept_paths(cwd, tree), stdout="/dev/stdout")


def kept_paths(cwd: Path, tree: Any = None) -> dict[str, Path]:
    """What no output of a command run in ``cwd`` may overwrite, by what it is: the workspace's
    files (:func:`kvpatch.source.workspace.protected_paths`: ``.kvpatch/``, the tree's header,
    lock, sources and git directory) and this environment's plugin bundle (its folder: the manifest and the library vLLM
    loads). ``tree``: a Tree, or a ``--tree`` path (else the last apply's here). For
    :func:`kvpatch.fsutil.check_outputs`'s ``protected``."""
    from ..source.tree import Tree
    from ..source.workspace import protected_paths
    from ..vllm_plugin.bundle import bundle_dir

    if isinstance(tree, (str, Path)):  # a --tree as given: where it points, resolved or not
        tree = Tree(cwd / tree)
    return {**protected_paths(cwd, tree), "the plugin's bundle": bundle_dir()}
