"""The one JIT path: a shared library built from generated sources, cached by content.

Both kinds of library kvpatch builds go through :func:`build_libraries`: a variant's
attention kernels (:class:`~kvpatch.jit.plan.VariantPlan`) and the L2 weight-prefetch
kernel (:class:`PrefetchPlan`). A plan holds every input (files, nvcc command lines, the
nvcc version) and derives its cache directory ``<cache>/builds/<key>`` from a hash of them
(FlashInfer's JitSpec in spirit). Building, under one file lock per plan: an entry whose
``result.json`` records the library's size and sha256, and whose library still has both,
is reused; otherwise the inputs are written (write-if-different), every shard compiled in
parallel, linked, inspected (the SASS), and ``result.json`` written last.

nvcc runs in its own process group: on an interrupt (Ctrl-C, or SIGTERM/SIGHUP turned into
an exception by the CLI) no new compile starts, the running ones are killed with their
children, and the interrupt goes on up.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence

from ..errors import BuildError
from ..fsutil import hold_lock, machine_problem, problem_in_text, read_regular, write_if_different, write_own
from ..fsutil.reading import file_digest, parse_json
from ..progress import QUIET, Progress
from .toolchain import Inspector, Toolchain, first_error


class LibraryPlan(Protocol):
    """What :func:`build_libraries` needs of a plan (paths relative to :attr:`dir`)."""

    name: str
    files: tuple[tuple[str, str], ...]
    shards: int

    @property
    def key(self) -> str: ...
    @property
    def dir(self) -> Path: ...
    @property
    def lock_path(self) -> Path: ...
    @property
    def library(self) -> Path: ...
    @property
    def result_path(self) -> Path: ...
    def shard_source(self, i: int) -> str: ...
    def shard_object(self, i: int) -> str: ...
    def shard_log(self, i: int) -> str: ...
    def compile_argv(self, nvcc: Path, i: int, threads: int = 1) -> list[str]: ...
    def link_argv(self, nvcc: Path) -> list[str]: ...
    def inspect(self, tools: Inspector, step: Callable[[str, Callable[[], None]], None]) -> Any: ...
    def read_result(self, data: dict) -> Any: ...
    def result_json(self, result: Any) -> dict: ...


# --------------------------------------------------------------------------- processes


class Processes:
    """The tool processes a build runs, so an interrupt can stop every one of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self.stopped = False

    def run(self, argv: Sequence[str], cwd: Path) -> tuple[int, str]:
        """Run a tool to its end (exit status, stdout+stderr); BuildError if stopped."""
        with self._lock:
            if self.stopped:
                raise BuildError("build stopped")
            proc = subprocess.Popen(list(argv), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)  # fmt: skip
            self._running.add(proc)
        try:
            out, _ = proc.communicate()
        finally:
            with self._lock:
                self._running.discard(proc)
        return proc.returncode, out

    def stop(self) -> None:
        """Start nothing more; kill what runs (its whole process group: nvcc's cicc, ptxas...)."""
        with self._lock:
            self.stopped = True
            running = list(self._running)
        for proc in running:
            kill_group(proc)


def kill_group(proc: subprocess.Popen) -> None:
    """Stop a process started with ``start_new_session`` and every process of its group
    (TERM, then KILL after 2 s)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=2)
            return
        except subprocess.TimeoutExpired:
            continue


# --------------------------------------------------------------------------- the cache


#: The most of a cached build's result.json read (a full-set build's is a few MB).
RESULT_LIMIT = 256 << 20


def load_cached(p: LibraryPlan) -> tuple[Any | None, str]:
    """The finished build of ``p`` from its ``result.json``, or None and why not.

    The reason is empty when there simply is no finished build; it names the damage
    when there is one whose library is missing, truncated or changed.
    """
    try:  # a regular file of bounded size only: a FIFO or a device there must not hang or fill memory
        result = p.read_result(parse_json(read_regular(p.result_path, limit=RESULT_LIMIT)))
    except (OSError, ValueError, KeyError, TypeError):
        return None, ""
    try:
        size, digest = file_digest(p.library)
    except OSError:
        return None, f"cached {p.library.name} is missing"
    if size != result.library_bytes:
        return None, f"cached {p.library.name} is damaged ({size} bytes, recorded {result.library_bytes})"
    if digest != result.library_sha256:
        return (
            None,
            f"cached {p.library.name} is damaged (sha256 {digest[:12]}..., recorded {result.library_sha256[:12]}...)",
        )
    return result, ""


def save_result(p: LibraryPlan, result: Any) -> None:
    """Write result.json last: it marks the build complete."""
    write_own(p.result_path, json.dumps(p.result_json(result), indent=1) + "\n")


# --------------------------------------------------------------------------- building


def build_libraries(plans: Sequence[LibraryPlan], *, tc: Toolchain, tools: Inspector, jobs: int,
                    progress: Progress = QUIET) -> dict[str, Any]:  # fmt: skip
    """Build (or take from the cache) every plan; ``{plan name: its result}``."""
    results: dict[str, Any] = {}
    with contextlib.ExitStack() as locks:
        for p in sorted(plans, key=lambda p: p.key):  # one order for every process: no deadlock
            try:
                p.lock_path.parent.mkdir(parents=True, exist_ok=True)
                locks.enter_context(hold_lock(p.lock_path, what="this build folder"))
            except PermissionError:  # a shared or read-only cache: builds, cached or not, take a lock there
                raise BuildError(f"the build cache {p.lock_path.parent} is not writable by this user (each build "
                                 "takes a lock in it, cached or not): set KVPATCH_CACHE to a folder you can "
                                 "write") from None  # fmt: skip
        todo = []
        for p in plans:
            cached, why = load_cached(p)
            if cached is not None:
                results[p.name] = cached
                progress.say(f"{p.name}: cached ({p.dir})")
            else:
                if why:
                    progress.say(f"{p.name}: {why}: rebuilding")
                todo.append(p)
        if todo:
            for p in todo:
                p.dir.mkdir(parents=True, exist_ok=True)
                for rel, text in p.files:
                    write_if_different(p.dir / rel, text)
            results.update(_compile_all(todo, tc, tools, jobs, progress))
    return results


def _compile_all(plans: list[LibraryPlan], tc: Toolchain, tools: Inspector, jobs: int,
                 progress: Progress) -> dict[str, Any]:  # fmt: skip
    """Compile every shard of every plan in parallel, then link and inspect each."""
    tasks = [(p, i) for p in plans for i in range(p.shards) if not _shard_done(p, i)]
    threads = max(1, min(len(getattr(plans[0], "archs", ())) or 1, jobs // max(1, len(tasks))))
    steps: dict[str, list[tuple[str, float]]] = {p.name: [] for p in plans}
    procs = Processes()
    pool = concurrent.futures.ThreadPoolExecutor(jobs)
    try:

        def step(p: LibraryPlan, name: str, fn: Callable[[], None]) -> None:
            import time

            t0 = time.perf_counter()
            with progress.step(f"{p.name}: {name}"):
                fn()
            steps[p.name].append((name, round(time.perf_counter() - t0, 2)))

        def compile_shard(p: LibraryPlan, i: int) -> None:
            what = f"compile {p.shard_source(i)} ({i + 1} of {p.shards})" if p.shards > 1 else "compile"
            step(p, what, lambda: _compile_shard(p, i, tc, threads, procs))

        _wait([pool.submit(compile_shard, p, i) for p, i in tasks], procs)
        _wait([pool.submit(step, p, "link", lambda p=p: _link(p, tc, procs)) for p in plans], procs)
        for p in plans:
            progress.say(_reading_sass(p))
        inspected = {p.name: pool.submit(p.inspect, tools, lambda name, fn, p=p: step(p, name, fn)) for p in plans}
        _wait(list(inspected.values()), procs)
    except BaseException:
        procs.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    results = {}
    for p in plans:
        size, digest = file_digest(p.library)
        result = inspected[p.name].result()
        if hasattr(result, "steps"):
            from .result import StepTime

            result = replace(result, steps=tuple(StepTime(n, s) for n, s in steps[p.name]))
        result = replace(result, library_bytes=size, library_sha256=digest)
        save_result(p, result)
        results[p.name] = result
    return results


def _reading_sass(p: LibraryPlan) -> str:
    """What a plan's inspection is about to do, in a line (cuobjdump's dump of vLLM's full
    set takes minutes, during which nothing else is said)."""
    configs, archs = getattr(p, "configs", ()), [f"sm_{a.sm}" for a in getattr(p, "archs", ())]
    where = ", ".join(archs) or "its archs"
    if not configs:
        return f"{p.name}: reading its SASS ({where})"
    from .sass import kernel_count

    slow = "; minutes for vLLM's full set" if len(configs) >= 100 else ""
    return (f"{p.name}: reading the SASS of {kernel_count(configs, len(archs))} kernels (v1 and v2 of "
            f"{len(configs)} configurations and their reduce kernels, {where}) to check the prefetch{slow}")  # fmt: skip


#: How long the main thread sleeps at a time while the build's threads work. Linux hands a signal
#: sent to the process to any of its threads; Python runs the handler (Ctrl-C's KeyboardInterrupt,
#: SIGTERM's) in the main thread, and a main thread asleep in a wait without end would run it only
#: once that wait ends: after a compile of minutes.
WAKE_S = 0.2


def _wait(futures: Iterable[concurrent.futures.Future], procs: Processes) -> None:
    """Wait for all; on the first failure stop the rest (nothing new starts) and re-raise it."""
    futures = list(futures)
    while True:
        done, pending = concurrent.futures.wait(futures, WAKE_S, return_when=concurrent.futures.FIRST_EXCEPTION)
        failed = [f for f in futures if f in done and f.exception() is not None]
        if failed or not pending:
            break
    if failed:
        for f in pending:
            f.cancel()
        procs.stop()
        concurrent.futures.wait(pending)
        raise failed[0].exception()


def _shard_done(p: LibraryPlan, i: int) -> bool:
    """An object and its ptxas log from an interrupted build of the same inputs: regular files,
    the object the one its compile recorded (size and sha256: a truncated or replaced one is
    compiled again, not linked)."""
    import stat

    obj, log, stamp = p.dir / p.shard_object(i), p.dir / p.shard_log(i), p.dir / _stamp(p, i)
    try:
        if not all(stat.S_ISREG(f.lstat().st_mode) for f in (obj, log, stamp)):
            return False
        size, digest = file_digest(obj)
        return read_regular(stamp, limit=256).decode("ascii", "replace") == f"{size} {digest}\n"
    except OSError:
        return False


def _stamp(p: LibraryPlan, i: int) -> str:
    """Where a compiled shard records its object's size and sha256."""
    return p.shard_object(i) + ".sha256"


def _compile_shard(p: LibraryPlan, i: int, tc: Toolchain, threads: int, procs: Processes) -> None:
    doing = f"compiling {p.shard_source(i)}"
    rc, log = procs.run(p.compile_argv(tc.nvcc, i, threads), p.dir)
    error_log = p.dir / f"{Path(p.shard_source(i)).stem}.error.log"
    with _machine_problems(doing):
        if rc != 0:
            _raise_machine_problem(p, log, doing)
            write_own(error_log, log)
            raise BuildError(f"nvcc failed for {p.name!r}: {first_error(log)} (log: {error_log})")
        (p.dir / (p.shard_object(i) + ".tmp")).replace(p.dir / p.shard_object(i))
        write_if_different(p.dir / p.shard_log(i), log)
        size, digest = file_digest(p.dir / p.shard_object(i))
        write_if_different(p.dir / _stamp(p, i), f"{size} {digest}\n")  # last: the shard is done
        error_log.unlink(missing_ok=True)


def _link(p: LibraryPlan, tc: Toolchain, procs: Processes) -> None:
    doing = f"linking {p.library.name}"
    if p.library.is_dir() and not p.library.is_symlink():  # nothing would ever be renamed over it
        raise BuildError(f"{p.library} is a directory, not the library: delete the cache entry {p.dir} and build "
                         "again")  # fmt: skip
    rc, log = procs.run(p.link_argv(tc.nvcc), p.dir)
    with _machine_problems(doing):
        if rc != 0:
            _raise_machine_problem(p, log, doing)
            raise BuildError(f"linking {p.library.name} failed: {first_error(log)}")
        (p.dir / (p.library.name + ".tmp")).replace(p.library)


def _raise_machine_problem(p: LibraryPlan, log: str, doing: str) -> None:
    """A tool that failed for the machine (its output says ``No space left on device``, ``Disk
    quota exceeded`` or ``File name too long``, as the assembler and the linker nvcc runs do): said
    as that (:func:`kvpatch.fsutil.problem_in_text`), with the build directory, never as a failed
    build. nvcc also writes under ``$TMPDIR``: the tool's own line names where it failed."""
    line = next((ln.strip() for ln in log.splitlines() if problem_in_text(ln, None) is not None), None)
    if line is not None:
        said = line if len(line) <= 160 else f"{line[:60]}...{line[-90:]}"
        raise problem_in_text(line, p.dir, doing=f"{doing} (nvcc: {said})")  # type: ignore[misc]


@contextlib.contextmanager
def _machine_problems(doing: str) -> Iterator[None]:
    """A full disk, a full quota or a path too long while a step writes (the object, the library,
    the logs) is said as that (:func:`kvpatch.fsutil.machine_problem`); other errors pass."""
    try:
        yield
    except OSError as e:
        problem = machine_problem(e, doing=doing)
        if problem is None:
            raise
        raise problem from None
