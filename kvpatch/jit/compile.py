"""``kvpatch build``: a :class:`~kvpatch.jit.spec.BuildSpec` planned (:mod:`.plan`), built
through the one JIT path (:func:`~kvpatch.jit.library.build_libraries`), SASS checked."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..progress import QUIET, Progress
from .flags import vllm_nvcc_flags
from .library import build_libraries
from .plan import plan
from .result import BuildResult
from .spec import BuildSpec, check_jobs
from .toolchain import find_inspector, toolchain, validate_archs


def build(spec: BuildSpec, *, jobs: int | None = None, cache: Path | None = None, progress: Progress = QUIET,
          check: bool = True) -> BuildResult:  # fmt: skip
    """Build every variant of ``spec`` (or take it from the cache) and check its SASS.

    Compiles run ``jobs`` at a time (``None``: the CPU count; otherwise >= 1, a
    :class:`~kvpatch.errors.UsageError` before anything runs). Building and loading a
    variant happen under one file lock per cache entry; a cached entry counts only when its
    library still has the size and sha256 recorded in its ``result.json``. Raises
    :class:`~kvpatch.errors.BuildError` when nvcc fails, a tool is missing, or (``check``)
    a kernel's SASS does not hold the prefetch it should (:meth:`BuildResult.check`).
    """
    jobs = check_jobs(jobs)
    start = time.perf_counter()
    tc = toolchain()
    validate_archs(spec.archs, tc)
    tools = find_inspector(tc.nvcc)
    plans = plan(spec, cache=cache, tc=tc)
    results = build_libraries(plans, tc=tc, tools=tools, jobs=jobs or os.cpu_count() or 1, progress=progress)
    result = BuildResult(tuple(results[v.name] for v in spec.variants), time.perf_counter() - start, vllm_nvcc_flags())
    if check:
        result.check()
    return result
