"""``kvpatch validate --upstream``: vLLM's own kernel test, unchanged, against built libraries.

The test and its run directory come from :mod:`.upstream_test`. pytest then runs the test once per library (in
parallel, pytest-xdist when present); the shim records a digest of every output, and
:func:`compare_records` counts how many of each variant's outputs equal the
baseline's bit for bit (keyed by test id and call; the test seeds its own inputs).
Tests that fail only because the GPU ran out of memory beside the other workers (vLLM's
test allocates caches of several GiB) are run again afterwards, one at a time, and the
report says how many were (``UpstreamRun.rerun``).

Only :func:`run_upstream` needs a GPU; finding the test, writing the run directory,
reading JUnit XML and comparing records are pure and tested on the CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..config.model import whole_number
from ..errors import UsageError
from .launch import LibSpec
from .upstream_test import (  # noqa: F401  (the test's files: re-exported for callers of this module)
    HELPERS_MODULE,
    OOM_MARKERS,
    SHIM_MODULE,
    TEST_FUNCTION,
    UpstreamError,
    UpstreamTest,
    find_test,
    helper_source,
    write_run_dir,
)  # fmt: skip


@dataclass
class UpstreamRun:
    """One library's pass of the test."""

    name: str
    lib: str
    returncode: int
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    outputs: int = 0  # op calls recorded
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    log_tail: str = ""
    #: Tests that ran out of GPU memory in the parallel pass and were run again one at a time (their
    #: outcome replaces the first one in the counts above).
    rerun: list[str] = field(default_factory=list)
    #: The time limit stopped this library's run (pytest interrupted, its counts are what had
    #: finished): the run is incomplete, and the report not ok.
    cut: bool = False


@dataclass
class UpstreamReport:
    release: str
    test_id: str
    baseline: str
    runs: list[UpstreamRun]
    #: Per non-baseline variant: outputs compared with the baseline's and how many were equal.
    identical: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Per variant: the test ids (and call numbers) whose output differs from the baseline's.
    differing: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: ``K/N`` when only the K-th of N shares of the test's cases ran (``--upstream-shard``),
    #: with how many ran of how many the test has; "" when all of them did.
    shard: str = ""
    selected: int = 0
    collected: int = 0

    @property
    def ok(self) -> bool:
        """Every run finished and passed with no failures/errors, and every output equals the baseline's."""
        runs_ok = all(r.failed == 0 and r.errors == 0 and r.passed > 0 and not r.cut for r in self.runs)
        same = all(v["identical"] == v["compared"] and v["compared"] > 0 for v in self.identical.values())
        return runs_ok and same

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "kvpatch-upstream", "version": 1, "ok": self.ok, **asdict(self)}


def junit_cases(path: str | Path) -> dict[str, dict[str, Any]]:
    """``classname::name`` -> {name, outcome (passed/failed/errors/skipped), oom} from a JUnit XML file;
    ``oom``: the failure was the GPU running out of memory (:data:`OOM_MARKERS`). The nameless
    ``<testcase/>`` pytest writes for a test an interrupt stopped part way is no outcome."""
    out: dict[str, dict[str, Any]] = {}
    for case in ET.parse(path).iter("testcase"):
        if not case.get("name"):
            continue
        kinds = {child.tag for child in case}
        bad = [child for child in case if child.tag in ("failure", "error")]
        outcome = (
            "failed"
            if "failure" in kinds
            else "errors"
            if "error" in kinds
            else "skipped"
            if "skipped" in kinds
            else "passed"
        )
        oom = any(m in f"{c.get('message', '')} {c.text or ''}" for c in bad for m in OOM_MARKERS)
        out[f"{case.get('classname', '')}::{case.get('name', '')}"] = {
            "name": case.get("name", ""),
            "outcome": outcome,
            "oom": oom,
        }
    return out


def count_cases(cases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Counts (passed, failed, skipped, errors), the failing ids, and in ``oom`` the names of the
    tests that failed for want of GPU memory."""
    out: dict[str, Any] = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "failures": [], "oom": []}
    for key, c in cases.items():
        out[c["outcome"]] += 1
        if c["outcome"] in ("failed", "errors"):
            out["failures"].append(key)
            if c["oom"]:
                out["oom"].append(c["name"])
    return out


def read_records(folder: str | Path) -> dict[str, dict[str, Any]]:
    """``test#call`` -> record, from every ``record-*.jsonl`` the shim wrote."""
    out: dict[str, dict[str, Any]] = {}
    for f in sorted(Path(folder).glob("record-*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                r = json.loads(line)
                out[f"{r['test']}#{r['call']}"] = r
    return out


def compare_records(
    base: dict[str, dict[str, Any]], other: dict[str, dict[str, Any]]
) -> tuple[dict[str, int], list[str], list[str]]:
    """(counts, differing keys, notes): outputs of the same test call compared by digest.

    Calls whose inputs digests differ are not compared (a note says so): the test
    seeds its inputs, so that would mean the runs did not see the same data."""
    compared = identical = 0
    differing: list[str] = []
    notes: list[str] = []
    for key in sorted(set(base) & set(other)):
        b, o = base[key], other[key]
        if (b["inputs"], b.get("caches")) != (o["inputs"], o.get("caches")):
            notes.append(f"{key}: inputs differ between the runs; not compared")
            continue
        compared += 1
        if b["out"] == o["out"]:
            identical += 1
        else:
            differing.append(key)
    only = len(set(base) ^ set(other))
    if only:
        notes.append(f"{only} call(s) recorded in only one of the runs")
    return {"compared": compared, "identical": identical}, differing, notes


# --------------------------------------------------------------------------- running


def pythonpath_for(run_dir: Path) -> str:
    """The run dir, then the directory holding the ``kvpatch`` package, then what was there."""
    pkg_parent = str(Path(__file__).resolve().parents[2])
    parts = [str(run_dir), pkg_parent] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(parts)


def parse_shard(text: str) -> tuple[int, int]:
    """``'2/3'`` -> (2, 3): the second of three shares of the test's cases (UsageError otherwise)."""
    k, sep, n = text.strip().partition("/")
    try:
        kk, nn = whole_number(k.strip()), whole_number(n.strip())
    except ValueError:
        kk = nn = 0
    if not sep or not (1 <= kk <= nn):
        raise UsageError(f"invalid shard {text!r}: give K/N with 1 <= K <= N, e.g. 1/2")
    return kk, nn


def shard_of(names: Sequence[str], k: int, n: int) -> list[str]:
    """The K-th of N shares of ``names`` (every N-th from the K-th: neighbouring cases, which
    pytest collects in parameter order, land in different shares, so each share gets a like
    mix of dtypes and sizes). The N shares are disjoint and together are ``names``."""
    return list(names[k - 1 :: n])


def collected_names(test: UpstreamTest, stdout: str) -> list[str]:
    """The test's case names (``test_paged_attention[...]``) in the order ``pytest --collect-only
    -q`` printed them."""
    prefix = f"{test.path}::"
    return [line[len(prefix):] for line in (raw.strip() for raw in stdout.splitlines())
            if line.startswith(prefix + test.function + "[") or line == prefix + test.function]  # fmt: skip


def collect(test: UpstreamTest, run_dir: Path, env: dict[str, str], timeout: float = 300.0) -> list[str]:
    """The test's case names as pytest collects them in ``run_dir`` (on the machine that runs
    them: the parametrization can depend on its GPUs)."""
    argv = [sys.executable, "-m", "pytest", "-q", "--collect-only", f"{test.path}::{test.function}"]
    try:
        p = subprocess.run(argv, cwd=run_dir, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise UpstreamError(f"pytest did not collect {test.node_id} within {timeout:.0f} s") from None
    names = collected_names(test, p.stdout)
    if not names:
        tail = " | ".join((p.stdout + p.stderr).strip().splitlines()[-3:])
        raise UpstreamError(f"pytest collected no case of {test.node_id} (rc {p.returncode}): {tail}")
    return names


def _lib_env(spec: LibSpec, run_dir: Path, **extra: str) -> dict[str, str]:
    """The environment pytest runs in against ``spec``: the shim's import path and library."""
    path = spec.path if spec.path.startswith("python:") else str(Path(spec.path).resolve())
    return dict(os.environ, PYTHONPATH=pythonpath_for(run_dir), KVPATCH_UPSTREAM_LIB=f"{path}:{spec.prefix}", **extra)


def pytest_argv(test: UpstreamTest, junit: Path, workers: int, names: Sequence[str] = ()) -> list[str]:
    """pytest on the test function, or on the given test names (``test_paged_attention[...]``) only."""
    ids = [f"{test.path}::{n}" for n in names] or [f"{test.path}::{test.function}"]
    argv = [sys.executable, "-m", "pytest", "-q", "-rN", "--tb=line", *ids, f"--junitxml={junit}"]
    if workers > 1 and importlib.util.find_spec("xdist") is not None:
        argv += ["-n", str(workers)]
    return argv


def _start_pytest(test: UpstreamTest, run_dir: Path, env: dict[str, str], junit: Path, log_path: Path, workers: int,
                  tests: Sequence[str] = ()) -> tuple[subprocess.Popen, Any]:  # fmt: skip
    """pytest on the test (or on ``tests``) in the run directory, its output into ``log_path``:
    the process and the open log, which the caller closes once the process is done."""
    log = open(log_path, "w")
    proc = subprocess.Popen(pytest_argv(test, junit.resolve(), workers, tests), cwd=run_dir, env=env, stdout=log,
                            stderr=subprocess.STDOUT, preexec_fn=_interruptible)  # fmt: skip
    return proc, log


def _interruptible() -> None:
    """In the child, before pytest starts: SIGINT back to its default, so Python turns it into
    KeyboardInterrupt even where kvpatch itself runs with SIGINT ignored (a shell's background
    job), and the time limit's interrupt (:func:`_wait`) is heard."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


#: After the time limit: how long pytest may take, once interrupted, to stop its workers and
#: write its JUnit report of the tests that finished, before it is killed.
INTERRUPT_GRACE = 60.0


def _wait(p: subprocess.Popen, timeout: float) -> tuple[int, bool]:
    """(exit code, cut): once ``timeout`` seconds (at least 1) have passed, pytest is
    interrupted (SIGINT, as Ctrl-C: it stops and still writes the JUnit report of what
    finished), and killed if it has not stopped :data:`INTERRUPT_GRACE` seconds later."""
    try:
        return p.wait(timeout=max(1.0, timeout)), False
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT)
        try:
            rc = p.wait(timeout=INTERRUPT_GRACE)
            return rc, rc != 0  # 0: it finished every test before the interrupt took effect
        except subprocess.TimeoutExpired:
            p.kill()
            return p.wait(), True


def run_upstream(
    tree: str | Path,
    libs: Sequence[LibSpec],
    out_dir: str | Path,
    *,
    release: str = "",
    baseline: str = "stock",
    workers: int | None = None,
    timeout: float = 900.0,
    progress: Any = None,
    tests: Sequence[str] = (),
    shard: tuple[int, int] | None = None,
) -> UpstreamReport:
    """Run the release's test once per library, all at once (``workers`` xdist
    processes in all, split between them), and compare the outputs with the baseline's.
    ``tests``: only these (``test_paged_attention[...]``, as JUnit names them). ``shard``
    ``(k, n)``: only the k-th of n shares of the cases (:func:`shard_of`), collected here.
    ``timeout``: seconds for the whole run; at the limit each pytest still running is
    interrupted, reports what finished, and its run is marked ``cut`` (the report not ok)."""
    t0 = time.perf_counter()
    test = find_test(tree)
    out = Path(out_dir)
    run_dir = out / "run"
    write_run_dir(test, run_dir)
    names = [s.name for s in libs]
    base = baseline if baseline in names else names[0]
    total = workers or os.cpu_count() or 1
    per = max(1, total // max(1, len(libs)))
    selected = collected = 0
    if shard is not None:
        every = list(tests) or collect(test, run_dir, _lib_env(next(s for s in libs if s.name == base), run_dir))
        tests = shard_of(every, *shard)
        selected, collected = len(tests), len(every)
        if progress:
            progress(f"upstream: shard {shard[0]}/{shard[1]}: {selected} of the {collected} cases")
        if not tests:
            raise UpstreamError(f"shard {shard[0]}/{shard[1]} of {collected} case(s) is empty")
    procs = []
    for s in libs:
        junit = out / f"junit-{s.name}.xml"
        rec = out / f"record-{s.name}"
        shutil.rmtree(rec, ignore_errors=True)
        env = _lib_env(s, run_dir, KVPATCH_UPSTREAM_RECORD=str(rec.resolve()))
        if progress:
            progress(f"upstream: {test.node_id} against {s.name} ({per} workers)")
        p, log = _start_pytest(test, run_dir, env, junit, out / f"pytest-{s.name}.log", per, tests)
        procs.append((s, p, log, junit, rec, env, time.perf_counter()))
    runs: list[UpstreamRun] = []
    cases: list[dict[str, dict[str, Any]]] = []
    for s, p, log, junit, _rec, _env, started in procs:
        rc, cut = _wait(p, timeout - (time.perf_counter() - t0))
        log.close()
        runs.append(UpstreamRun(s.name, str(s), rc, seconds=time.perf_counter() - started, cut=cut))
        cases.append(junit_cases(junit) if junit.is_file() else {})
    notes: list[str] = []
    # out of GPU memory beside the other workers: those tests again, one at a time per library
    # (the libraries' reruns side by side, as the first pass ran), now that the GPU is free
    reruns = []
    for (s, _p, _log, _junit, _rec, env, _t), run, got in zip(procs, runs, cases):
        oom = [c["name"] for c in got.values() if c["oom"]]
        if not oom:
            continue
        if timeout - (time.perf_counter() - t0) < 1:
            notes.append(f"{s.name}: {len(oom)} test(s) ran out of GPU memory; no time left to run them again")
            continue
        if progress:
            progress(
                f"upstream: {len(oom)} test(s) against {s.name} ran out of GPU memory beside the others; again, one at a time"
            )
        junit = out / f"junit-{s.name}-rerun.xml"
        p, log = _start_pytest(test, run_dir, env, junit, out / f"pytest-{s.name}-rerun.log", 1, oom)
        reruns.append((s, run, got, oom, junit, p, log))
    for s, run, got, oom, junit, p, log in reruns:
        with log:
            rc, cut = _wait(p, timeout - (time.perf_counter() - t0))
        run.cut = run.cut or cut
        again = junit_cases(junit) if junit.is_file() else {}
        got.update({k: v for k, v in again.items() if k in got})
        run.rerun = sorted(oom)
        counts = count_cases(again)
        notes.append(f"{s.name}: {len(oom)} test(s) ran out of GPU memory in the parallel pass and were run again "
                     f"one at a time (rc {rc}): {counts['passed']} passed, {counts['failed'] + counts['errors']} failed")  # fmt: skip
    for (s, _p, _log, _junit, rec, _env, _t), run, got in zip(procs, runs, cases):
        counts = count_cases(got)
        run.passed, run.failed, run.skipped, run.errors = (counts[k] for k in ("passed", "failed", "skipped", "errors"))
        run.failures = counts["failures"]
        run.outputs = len(read_records(rec)) if rec.is_dir() else 0
        run.log_tail = "\n".join((out / f"pytest-{s.name}.log").read_text(errors="replace").splitlines()[-15:])
    report = UpstreamReport(
        release=release,
        test_id=test.node_id,
        baseline=base,
        runs=runs,
        notes=notes,
        shard=f"{shard[0]}/{shard[1]}" if shard else "",
        selected=selected,
        collected=collected,
    )
    base_rec = read_records(out / f"record-{base}")
    for s in libs:
        if s.name == base:
            continue
        counts, differing, notes = compare_records(base_rec, read_records(out / f"record-{s.name}"))
        report.identical[s.name] = counts
        report.differing[s.name] = differing
        report.notes += [f"{s.name}: {n}" for n in notes]
    for r in runs:
        if r.cut:
            report.notes.append(f"{r.name}: stopped at the time limit ({timeout:.0f} s) after {r.passed + r.failed + r.skipped + r.errors} "
                                "test(s); the counts and comparisons are of those only")  # fmt: skip
        if r.passed == 0 and r.failed == 0:
            report.notes.append(f"{r.name}: no test ran (rc {r.returncode}); log: {out / f'pytest-{r.name}.log'}")
    report.seconds = time.perf_counter() - t0
    return report
