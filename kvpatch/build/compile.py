"""Running a build: :func:`build` takes the plans, locks them, reuses what the cache
holds, writes the inputs (write-if-different), runs nvcc on every shard in parallel,
links, inspects, and writes ``result.json`` last."""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import json
import os
import subprocess
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable

import filelock
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ..errors import BuildError
from ..fsutil import write_atomic, write_if_different
from .flags import vllm_nvcc_flags
from .inspect import inspect_variant, reread_sass
from .plan import VariantPlan, plan
from .result import BuildResult, StepTime, VariantResult
from .spec import BuildSpec, check_jobs
from .toolchain import Inspector, Toolchain, find_inspector, first_error, toolchain, validate_archs


def build(
    spec: BuildSpec,
    *,
    jobs: int | None = None,
    cache: Path | None = None,
    console: Console | None = None,
    check: bool = True,
) -> BuildResult:
    """Build every variant of ``spec`` (or take it from the cache) and check its SASS.

    Compiles run ``jobs`` at a time (``None``: the CPU count; otherwise >= 1, a
    :class:`~kvpatch.errors.UsageError` before anything runs), with a progress line per
    step. Building and loading a variant happen under one file lock per cache entry. A
    cached entry counts only when its library still has the size and sha256 recorded
    in its ``result.json``; otherwise it is rebuilt. Raises :class:`BuildError` when
    nvcc fails, a tool is missing, or (``check``) a kernel's SASS does not hold the
    prefetch it should.
    """
    jobs = check_jobs(jobs)
    start = time.perf_counter()
    console = console if console is not None else Console(stderr=True)
    tc = toolchain()
    validate_archs(spec.archs, tc)
    tools = find_inspector(tc.nvcc)
    plans = plan(spec, cache=cache, tc=tc)
    workers = jobs or os.cpu_count() or 1
    results: dict[str, VariantResult] = {}
    with ExitStack() as stack:
        for p in sorted(plans, key=lambda p: p.key):
            p.lock_path.parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(filelock.FileLock(str(p.lock_path)))
        todo = []
        for p in plans:
            cached, why = load_cached(p)
            if cached is not None:
                results[p.variant.name] = cached
                console.print(f"[green]✓[/] {escape(p.variant.name)}: cached ({escape(str(p.dir))})")
            else:
                if why:
                    console.print(f"[yellow]![/] {escape(p.variant.name)}: {escape(why)}: rebuilding")
                todo.append(p)
        if todo:
            for p in todo:
                _write_inputs(p)
            results.update(_compile_all(todo, tc, tools, workers, console))
    result = BuildResult(tuple(results[v.name] for v in spec.variants), time.perf_counter() - start, vllm_nvcc_flags())
    if check:
        problems = result.problems()
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise BuildError(problems[0] + more)
    return result


def file_digest(path: Path) -> tuple[int, str]:
    """(size in bytes, sha256 hex) of a file."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def load_cached(p: VariantPlan) -> tuple[VariantResult | None, str]:
    """The finished build of ``p`` from its ``result.json``, or None and why not.

    The reason is empty when there simply is no finished build; it names the damage
    when there is one whose library is missing, truncated or changed.
    """
    try:
        data = json.loads(p.result_path.read_text(encoding="utf-8"))
        result = _relocate(VariantResult.from_dict(data, cached=True), p.dir)
    except (OSError, ValueError, KeyError, TypeError):
        return None, ""
    try:
        size, digest = file_digest(p.library)
    except OSError:
        return None, f"cached {p.library.name} is missing"
    if size != result.library_bytes:
        return None, f"cached {p.library.name} is damaged ({size} bytes, recorded {result.library_bytes})"
    if digest != result.library_sha256:
        return None, f"cached {p.library.name} is damaged (sha256 {digest[:12]}..., recorded {result.library_sha256[:12]}...)"
    if any("load_use" not in k for k in data["kernels"]) and result.sass.is_file():
        # built by a kvpatch that did not read the load-use distance (and cut FP op counts at 0xffff):
        # read both from the kept SASS, once
        try:
            result = reread_sass(result)
        except (OSError, EOFError, ValueError):
            return result, ""
        _save_result(p, result)
    return result, ""


def _relocate(r: VariantResult, new_dir: Path) -> VariantResult:
    """Paths in result.json are stored relative to the build dir; make them absolute."""

    def fix(path: Path) -> Path:
        return new_dir / path if not path.is_absolute() else path

    return replace(r, dir=new_dir, library=fix(r.library), sass=fix(r.sass), cubins=tuple(fix(c) for c in r.cubins))


def _write_inputs(p: VariantPlan) -> None:
    p.dir.mkdir(parents=True, exist_ok=True)
    for rel, text in p.files:
        write_if_different(p.dir / rel, text)


def _compile_all(
    plans: list[VariantPlan], tc: Toolchain, tools: Inspector, jobs: int, console: Console
) -> dict[str, VariantResult]:
    """Compile every shard of every plan in parallel, then link and inspect each."""
    tasks = [(p, i) for p in plans for i in range(p.shards) if not _shard_done(p, i)]
    threads = max(1, min(len(plans[0].archs), jobs // max(1, len(tasks))))
    steps: dict[str, list[StepTime]] = {p.variant.name: [] for p in plans}
    columns = (SpinnerColumn(finished_text="[green]✓[/]"), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress, concurrent.futures.ThreadPoolExecutor(jobs) as pool:

        def step(p: VariantPlan, name: str, fn: Callable[[], None]) -> None:
            label = f"{p.variant.name}: {name}"
            task = progress.add_task(escape(label), total=1)
            t0 = time.perf_counter()
            fn()
            seconds = time.perf_counter() - t0
            steps[p.variant.name].append(StepTime(name, round(seconds, 2)))
            progress.update(task, completed=1, description=escape(f"{label} ({seconds:.1f} s)"))

        def compile_shard(p: VariantPlan, i: int) -> None:
            archs = " ".join(a.code for a in p.archs)
            what = f"compile {p.shard_source(i)} for {archs}" if p.shards > 1 else f"compile for {archs}"
            step(p, what, lambda: _compile_shard(p, i, tc, threads))

        _wait(pool.submit(compile_shard, p, i) for p, i in tasks)
        _wait(pool.submit(step, p, "link", functools.partial(_link, p, tc)) for p in plans)
        inspected = {p.variant.name: pool.submit(inspect_variant, p, tools, functools.partial(step, p)) for p in plans}
        _wait(inspected.values())
    results = {}
    for p in plans:
        size, digest = file_digest(p.library)
        result = replace(
            inspected[p.variant.name].result(),
            steps=tuple(steps[p.variant.name]),
            library_bytes=size,
            library_sha256=digest,
        )
        _save_result(p, result)
        results[p.variant.name] = result
    return results


def _save_result(p: VariantPlan, result: VariantResult) -> None:
    """Write result.json last, with paths relative to the build dir: it marks the build complete."""
    d = result.to_dict()
    d["dir"] = "."
    for name in ("library", "sass"):
        d[name] = str(Path(d[name]).relative_to(p.dir))
    d["cubins"] = [str(Path(c).relative_to(p.dir)) for c in d["cubins"]]
    del d["cached"]
    write_atomic(p.result_path, json.dumps(d, indent=1) + "\n")


def _wait(futures: Iterable[concurrent.futures.Future]) -> None:
    """Wait for all; on the first failure cancel what has not started and re-raise it."""
    futures = list(futures)
    done, pending = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
    failed = [f for f in futures if f in done and f.exception() is not None]
    if failed:
        for f in pending:
            f.cancel()
        concurrent.futures.wait(pending)
        raise failed[0].exception()


def _shard_done(p: VariantPlan, i: int) -> bool:
    """An object and its ptxas log from an interrupted build of the same inputs."""
    return (p.dir / p.shard_object(i)).is_file() and (p.dir / p.shard_log(i)).is_file()


def _compile_shard(p: VariantPlan, i: int, tc: Toolchain, threads: int) -> None:
    argv = p.compile_argv(tc.nvcc, i, threads)
    done = subprocess.run(argv, cwd=p.dir, capture_output=True, text=True, check=False)
    log = done.stdout + done.stderr
    error_log = p.dir / f"launcher_{i}.error.log"
    if done.returncode != 0:
        write_atomic(error_log, log)
        raise BuildError(f"nvcc failed for variant {p.variant.name!r}: {first_error(log)} (log: {error_log})")
    (p.dir / (p.shard_object(i) + ".tmp")).replace(p.dir / p.shard_object(i))
    write_if_different(p.dir / p.shard_log(i), log)
    error_log.unlink(missing_ok=True)


def _link(p: VariantPlan, tc: Toolchain) -> None:
    done = subprocess.run(p.link_argv(tc.nvcc), cwd=p.dir, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError(f"linking {p.library.name} failed: {first_error(done.stdout + done.stderr)}")
    (p.dir / (p.library.name + ".tmp")).replace(p.library)
