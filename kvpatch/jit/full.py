"""``kvpatch build --full``: vLLM's own build of the patched tree (an editable pip install)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

from ..arch import Arch
from ..errors import BuildError, UsageError
from ..progress import QUIET, Progress
from .spec import check_jobs, check_vllm_tree
from .toolchain import first_error, toolchain, validate_archs


def full_build_command(
    tree: str | Path,
    archs: Sequence[Arch],
    jobs: int | None,
    *,
    python: str | None = None,
    base_env: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """vLLM's own editable install of ``tree``: ``pip install -e <tree> --no-build-isolation``.

    Returns the argv and the whole environment to run it with (``base_env``, default
    ``os.environ``, plus ``TORCH_CUDA_ARCH_LIST`` and ``MAX_JOBS``: ``jobs``, or the
    CPU count for ``None``). ``-v`` makes pip show the compiler's progress instead of
    a spinner for half an hour.
    """
    if not archs:
        raise UsageError("no arch given")
    jobs = check_jobs(jobs) or os.cpu_count() or 1
    argv = [
        python or sys.executable,
        "-m",
        "pip",
        "install",
        "-v",
        "-e",
        str(Path(tree).resolve()),
        "--no-build-isolation",
    ]
    env = dict(os.environ if base_env is None else base_env)
    env["TORCH_CUDA_ARCH_LIST"] = ";".join(str(a) for a in archs)
    env["MAX_JOBS"] = str(jobs)
    env["VLLM_TARGET_DEVICE"] = "cuda"
    return argv, env


def run_full_build(tree: str | Path, archs: Sequence[Arch], jobs: int | None, *, progress: Progress = QUIET) -> float:
    """Run :func:`full_build_command`, streaming its output (one ``progress`` line per line
    of it); returns the seconds it took. A tree without vLLM's attention header (exit 2) or an
    arch this nvcc cannot compile for (exit 5) is refused first: pip runs the tree's setup.py."""
    check_vllm_tree(tree)  # the tree, and the archs nvcc compiles for, before pip runs anything there
    validate_archs(archs, toolchain())
    argv, env = full_build_command(tree, archs, jobs)
    settings = f"TORCH_CUDA_ARCH_LIST={env['TORCH_CUDA_ARCH_LIST']}, MAX_JOBS={env['MAX_JOBS']}"
    progress.say(f"$ {' '.join(argv)}  ({settings})")
    start = time.perf_counter()
    tail: list[str] = []
    try:
        proc = subprocess.Popen(argv, env=env, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)  # fmt: skip
    except OSError as e:
        raise BuildError(f"cannot run {argv[0]}: {e}") from None
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            progress.say(line.rstrip("\n"))
            tail = (tail + [line.rstrip()])[-20:]
        rc = proc.wait()
    except BaseException:  # an interrupt: pip, cmake and every compiler under them stop too
        from .library import kill_group

        kill_group(proc)
        raise
    if rc != 0:
        raise BuildError(f"vLLM's build failed (exit {rc}): {first_error(chr(10).join(tail))}")
    return time.perf_counter() - start
