"""``kvpatch plugin enable|disable|status|check``: the tree's patched kernels inside the vLLM
this Python environment already has, through vLLM's plugin entry point (no vLLM rebuild).

The data flow of ``enable``: the tree (patched by ``apply``) -> its release, checked
against the installed vLLM -> the patched variant built for vLLM's full kernel set (the
one JIT path: a cache hit after ``kvpatch build --all`` for the same arch) -> the
bundle (:mod:`kvpatch.vllm_plugin.bundle`: the library and ``bundle.json``, written
atomically). vLLM's plugin loader then calls :func:`kvpatch.vllm_plugin.register`, which
checks everything again in the serving process and logs one line either way.
"""

from __future__ import annotations

import importlib.metadata
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..errors import BuildError, GpuCheckError, UsageError
from ..fsutil import read_text_input
from ..gpu.defaults import DEFAULT_ARCH
from ..progress import QUIET, Progress

if TYPE_CHECKING:
    from ..gpu.plugin_check import CheckReport
    from ..vllm_plugin import Decision, Manifest

#: The releases whose V0 engine calls these ops on CUDA (0.11 removed the V0 engine).
LAST_V0 = (0, 10)
#: The most of ``csrc/torch_bindings.cpp`` read (vLLM's is about 30 kB).
BINDINGS_LIMIT = 16 << 20


@dataclass
class EnableOptions:
    tree: Optional[Path] = None
    cwd: Path = field(default_factory=Path.cwd)
    arch: str = DEFAULT_ARCH
    jobs: Optional[int] = None
    release: Optional[str] = None  # the tree's vLLM release, where kvpatch cannot read it
    directory: Optional[Path] = None  # the bundle's directory (default: this environment's)
    build: bool = False  # compile the full set now when 'kvpatch build --all' has not


@dataclass(frozen=True)
class EnableReport:
    manifest: Manifest
    directory: Path
    library: Path  # the built library in kvpatch's cache
    cached: bool
    installed_vllm: str | None  # None: vLLM is not installed in this environment
    warnings: tuple[str, ...] = ()


def installed_vllm() -> str | None:
    """The version of the vLLM distribution installed in this environment, read from its
    metadata (vLLM itself is not imported); None when there is none."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(o: EnableOptions, target: Any) -> str:
    from ..source.releases import normalize_version
    from .tree import tree_release

    found = tree_release(target, o.cwd)
    if o.release is not None:
        given = normalize_version(o.release)
        if found is not None and normalize_version(found) != given:
            raise UsageError(f"--release {given} contradicts the tree, which holds vLLM {found}: the bundle "
                             "would claim the wrong release; drop --release")  # fmt: skip
        return given
    if found is None:
        raise UsageError(f"cannot tell which vLLM release {target.root} holds (no record of an apply here, "
                         "no PKG-INFO): pass --release X")  # fmt: skip
    return found


def bundle_dir() -> Path:
    """Where this Python environment's plugin bundle lives (nothing is created)."""
    from ..vllm_plugin import bundle_dir as where

    return where()


def check_match(release: str, installed: str | None) -> list[str]:
    """The warnings for a bundle of ``release`` in an environment with vLLM ``installed``;
    UsageError when they are different releases (the plugin would refuse to load)."""
    from ..source.releases import release_tuple
    from ..vllm_plugin.checks import normalize_version

    warnings = []
    if installed is None:
        warnings.append(f"vLLM is not installed in this Python environment: the bundle waits for vLLM {release}")
    elif normalize_version(installed) != normalize_version(release):
        raise UsageError(f"this environment has vLLM {installed} and the tree is vLLM {release}: "
                         f"run 'kvpatch apply --vllm {normalize_version(installed)}' and enable again")  # fmt: skip
    if release_tuple(release)[:2] > LAST_V0:
        warnings.append(f"vLLM {release} has no V0 engine: vLLM itself never calls these ops on CUDA, only code "
                        "that calls torch.ops._C.paged_attention_v1/v2 directly reaches kvpatch's kernels")  # fmt: skip
    return warnings


def enable(o: EnableOptions, *, progress: Progress = QUIET) -> EnableReport:
    """Build the tree's patched kernels for vLLM's full set and install them as this
    environment's bundle (replacing any)."""
    from .. import jit
    from ..abi import load
    from ..dtypes import KV_CACHE_DTYPES, QUERY_DTYPES
    from ..fsutil.outputs import check_output_folder
    from ..patch import read_header
    from ..source.releases import HEADER, header_digest
    from ..vllm_plugin import KernelSet, bundle_dir, schemas_from_bindings, write_bundle
    from .common import check_arch, check_directory, kept_paths
    from .tree import resolve, variants_for

    jit.check_jobs(o.jobs)
    check_arch(o.arch)
    directory, label = _bundle_folder(o.directory)
    check_directory(label, directory)
    # the bundle goes nowhere kvpatch keeps other things (the workspace, the tree, the caches)
    kept = {what: path for what, path in kept_paths(o.cwd, o.tree).items() if path != bundle_dir()}
    check_output_folder(label, directory, protected=kept)
    target = resolve(o.tree, o.cwd)
    release = _release(o, target)
    installed = installed_vllm()
    warnings = check_match(release, installed)
    bindings = target.root / "csrc" / "torch_bindings.cpp"
    try:  # a regular file of bounded size only: a FIFO or a device there must not hang the command
        schemas = schemas_from_bindings(read_text_input(bindings, "the tree's file", limit=BINDINGS_LIMIT))
    except ValueError as e:
        raise UsageError(f"{bindings}: {e}") from None
    header = read_header(target.read_header(), str(target.header))
    patched = variants_for(target, o.cwd, progress)[1]
    built, cached = _full_build(target.root, patched, o, progress)
    heads, blocks = jit.vllm_kernel_set(target.root)
    kernel_set = KernelSet(tuple(QUERY_DTYPES), tuple(KV_CACHE_DTYPES), heads, blocks)
    with progress.step(f"installing the bundle in {directory}"):
        manifest = write_bundle(
            built.library, vllm_release=release, header_revision=header_digest(header.stock),
            marker=patched.marker, archs=built.archs, prefix=built.prefix, configs=built.configs,
            kernel_set=kernel_set, schemas=schemas, scale_by_value=load(built.library, built.prefix).scale_by_value,
            kvpatch_version=_version(), extra={"tree": str(target.root), "header": HEADER, "build": built.key},
            directory=directory,
        )  # fmt: skip
    return EnableReport(manifest, directory, built.library, cached, installed, tuple(warnings))


def _full_build(root: Path, patched: Any, o: EnableOptions, progress: Progress) -> tuple[Any, bool]:
    """The patched variant built with vLLM's full kernel set for ``o.arch`` and whether it
    came from kvpatch's cache (what ``kvpatch build --all`` made); compiled now with
    ``o.build``; otherwise refused in one line saying what the cache holds."""
    from .. import jit
    from ..jit.library import load_cached

    def cached(all_kernels: bool) -> Any:
        spec = jit.make_spec(root, [patched], o.arch, all_kernels=all_kernels, check_variants=False)
        (p,) = jit.plan(spec)
        return load_cached(p)[0]

    found = cached(True)
    if found is not None:
        if found.problems():
            raise BuildError(f"SASS check failed: {found.problems()[0]}")
        return found, True
    if o.build:
        spec = jit.make_spec(root, [patched], o.arch, all_kernels=True, check_variants=False)
        (built,) = jit.build(spec, jobs=o.jobs, progress=progress).variants
        return built, built.cached
    build = shlex.join(
        ["kvpatch", "build", "--all", "--arch", o.arch, *(["--tree", str(root)] if o.tree is not None else [])]
    )
    partial = cached(False)
    have = (f"the build for {o.arch} holds {len(partial.configs)} of vLLM's configurations (kvpatch build without --all)"
            if partial is not None else f"the tree's patched kernels are not built for {o.arch}")  # fmt: skip
    raise UsageError(f"{have}; the plugin needs the full set, so first run (or pass --build): {build}")


def _version() -> str:
    from .. import __version__

    return __version__


def disable(directory: Optional[Path] = None) -> tuple[Path, bool]:
    """Remove this environment's bundle: (its directory, whether there was one)."""
    from ..vllm_plugin import remove_bundle
    from .common import check_directory

    where, label = _bundle_folder(directory)
    check_directory(label, where, writable=False)
    return where, remove_bundle(where)


def _bundle_folder(directory: Optional[Path]) -> tuple[Path, str]:
    """The bundle's folder (``--dir``, else :func:`~kvpatch.vllm_plugin.bundle_dir`) and how an
    error names it. A ``$KVPATCH_PLUGIN_DIR`` of blanks is refused: it would name a folder of
    that name in the current directory."""
    import os

    from ..vllm_plugin.bundle import ENV_DIR

    if directory is not None:
        return directory, "--dir"
    env = os.environ.get(ENV_DIR, "")
    if env and not env.strip():
        raise UsageError(f"${ENV_DIR} is {env!r}: set it to a folder, or unset it")
    return bundle_dir(), f"${ENV_DIR}" if env else "the bundle's folder"


def status(directory: Optional[Path] = None, *, gpus: bool = False) -> Decision:
    """What vLLM's plugin loader would do in this environment, as a
    :class:`~kvpatch.vllm_plugin.Decision` (every check; nothing registered). With ``gpus``
    each visible GPU is probed (this initialises CUDA). A bundle folder that is a file, or lies
    under one, is refused as enable and disable refuse it."""
    from ..vllm_plugin import Target, decide
    from .common import check_directory

    where, label = _bundle_folder(directory)
    check_directory(label, where, writable=False)  # a file there is a mistyped folder, not a bundle
    return decide(Target(bundle=directory), probe_gpu=gpus)


def check(*, reps: int = 30, graphs: bool = True) -> CheckReport:
    """Register the plugin in this process and compare vLLM's kernel with kvpatch's on the
    GPU (:func:`kvpatch.gpu.plugin_check.check`): the report, whatever it found (the
    caller raises :func:`failure` after writing it)."""
    from ..gpu.env import require_cuda

    if installed_vllm() is None:
        raise UsageError("'kvpatch plugin check' compares vLLM's kernels with kvpatch's, and vLLM is not installed "
                         "in this Python environment")  # fmt: skip
    require_cuda()
    from ..gpu.plugin_check import check as run_check

    return run_check(reps=reps, graphs=graphs)


def failure(report: Any) -> GpuCheckError | None:
    """The error (exit 6) for a check that found a difference, or an error, or compared nothing."""
    if report.ok:
        return None
    f = report.first_failure
    return GpuCheckError(f"{f.label}: {f.error or f.difference}" if f else "no case was compared")
