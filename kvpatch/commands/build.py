"""``kvpatch build``: the tree's stock and patched kernels compiled into two shared libraries,
their SASS checked (or, ``--full``, vLLM's own build of the patched tree).

The data flow: the tree's header -> the variants (stock: kvpatch's regions stripped;
patched: the header as it is) -> a :class:`~kvpatch.jit.spec.BuildSpec` (archs, the
instantiations) -> one plan per variant (every file, nvcc command line and a content hash)
-> the one JIT path (cached by content, locked, parallel nvcc, link, cuobjdump) -> the
SASS check (``UBLKPF`` exactly where the configuration prefetches).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import UsageError
from ..gpu.defaults import DEFAULT_ARCH
from ..progress import QUIET, Progress
from ..source.includes import check_tree_files
from .tree import resolve, variants_for


@dataclass
class BuildOptions:
    tree: Optional[Path] = None
    cwd: Path = field(default_factory=Path.cwd)
    arch: str = DEFAULT_ARCH
    dtypes: Optional[list[str]] = None
    head_sizes: Optional[list[int]] = None
    block_sizes: Optional[list[int]] = None
    kv_cache_dtypes: Optional[list[str]] = None
    all_kernels: bool = False
    jobs: Optional[int] = None
    full: bool = False  # vLLM's own build of the patched tree (pip install -e)


@dataclass(frozen=True)
class BuildReport:
    result: object = None  # kvpatch.jit.BuildResult (None after --full)
    warnings: tuple[str, ...] = ()
    full_seconds: float | None = None


def run(o: BuildOptions, *, progress: Progress = QUIET) -> BuildReport:
    from .. import jit
    from .common import check_arch

    jit.check_jobs(o.jobs)
    check_arch(o.arch)
    if o.full:
        selection = [f"--{n}" for n, v in (("dtypes", o.dtypes), ("head-sizes", o.head_sizes),
                                            ("block-sizes", o.block_sizes), ("kv-cache-dtypes", o.kv_cache_dtypes))
                     if v is not None] + (["--all"] if o.all_kernels else [])  # fmt: skip
        if selection:
            raise UsageError(
                f"--full runs vLLM's own build (its whole kernel set): {', '.join(selection)} do not apply"
            )
        archs = jit.parse_arch_list(o.arch)
        target = resolve(o.tree, o.cwd)
        return BuildReport(full_seconds=jit.run_full_build(target.root, archs, o.jobs, progress=progress))
    target = resolve(o.tree, o.cwd)
    check_tree_files(target.root)  # before make_spec reads the launcher
    spec = jit.make_spec(target.root, [], o.arch, dtypes=o.dtypes, head_sizes=o.head_sizes,
                         block_sizes=o.block_sizes, kv_cache_dtypes=o.kv_cache_dtypes, all_kernels=o.all_kernels,
                         check_variants=False)  # fmt: skip
    variants = variants_for(target, o.cwd, progress)
    from dataclasses import replace

    result = jit.build(replace(spec, variants=tuple(variants)), jobs=o.jobs, progress=progress)
    return BuildReport(result, tuple(result.split_warnings() + result.schedule_warnings() + result.grouped_warnings()))
