"""Ending a command: Ctrl-C, SIGTERM and SIGHUP stop it within seconds, with every child
stopped, exit 130 / 143 / 129 and one line.

The build runs against a stand-in nvcc that records its pid and sleeps, so the test sees
whether an interrupt stops the compiles already running and starts no new ones.
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli.cli_helpers import signals_default

pytestmark = pytest.mark.slow

FAKE_NVCC = """#!/bin/sh
case "$1" in
  --version) echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0 ;;
  --list-gpu-arch) echo compute_80; echo compute_90; exit 0 ;;
esac
echo $$ >> "$KVPATCH_TEST_MARKS/pids"
exec sleep 60
"""


def _compiling(work: Path, env: dict[str, str], marks: Path, preexec=signals_default) -> subprocess.Popen:
    """``kvpatch build --all`` started in ``work``, once its first compile runs."""
    proc = subprocess.Popen([sys.executable, "-m", "kvpatch", "build", "--all", "--jobs", "2"], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec)  # fmt: skip
    deadline = time.time() + 60
    while not (marks / "pids").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert (marks / "pids").exists(), "no compile started"
    time.sleep(0.3)
    return proc


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.fixture
def build_setup(tmp_path: Path, vllm_release) -> tuple[Path, dict[str, str], Path]:
    """vLLM 0.10.2 patched, and an environment whose nvcc is the stand-in."""
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    nvcc = cuda / "bin" / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    marks = tmp_path / "marks"
    marks.mkdir()
    import shutil

    tree = tmp_path / "vllm"
    shutil.copytree(vllm_release("0.10.2") / "csrc", tree / "csrc")
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **os.environ,
        "CUDA_HOME": str(cuda),
        "KVPATCH_TEST_MARKS": str(marks),
        "KVPATCH_CACHE": str(tmp_path / "cache"),
    }
    done = subprocess.run([sys.executable, "-m", "kvpatch", "apply", "--tree", str(tree)], cwd=work, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return work, env, marks


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper is gone too
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.network
@pytest.mark.parametrize("sig, code, words", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"),
                                              (signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                              (signal.SIGHUP, 129, "terminated (SIGHUP)")])  # fmt: skip
def test_a_signal_stops_a_build_and_its_compiles_within_seconds(build_setup, sig: int, code: int, words: str) -> None:
    work, env, marks = build_setup
    proc = _compiling(work, env, marks)
    t0 = time.time()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert time.time() - t0 < 10
    assert proc.returncode == code
    assert _errors(err) == [f"error: kvpatch build: {words}"]
    time.sleep(0.5)
    pids = [int(p) for p in (marks / "pids").read_text().split()]
    assert pids and not [p for p in pids if _alive(p)]
    assert len(pids) <= 2  # no compile started after the signal (two run at a time)


#: tgkill(2), which sends a signal to one thread of a process, by machine
_TGKILL = {"x86_64": 234, "aarch64": 131}


@pytest.mark.network
@pytest.mark.skipif(platform.machine() not in _TGKILL, reason="tgkill's number is known for x86_64 and aarch64")
def test_ctrl_c_that_lands_on_a_compile_thread_stops_the_build_too(build_setup) -> None:
    """Linux hands a signal sent to a process to any of its threads. Before: one delivered to a
    thread waiting on a compile left the main thread asleep until that compile ended (a minute
    here). After: the main thread wakes often enough to run Ctrl-C's handler within seconds."""
    work, env, marks = build_setup
    proc = _compiling(work, env, marks)
    threads = sorted(int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid)
    assert threads, "the build runs its compiles from threads of their own"
    libc = ctypes.CDLL(None, use_errno=True)
    t0 = time.time()
    assert libc.syscall(_TGKILL[platform.machine()], proc.pid, threads[-1], signal.SIGINT) == 0
    _, err = proc.communicate(timeout=30)
    assert time.time() - t0 < 10
    assert proc.returncode == 130
    assert _errors(err) == ["error: kvpatch build: interrupted (Ctrl-C)"]


def _hangup_ignored() -> None:
    """As ``nohup`` starts a command: SIGHUP ignored (the rest as a terminal leaves them)."""
    signals_default()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


@pytest.mark.network
def test_a_build_started_under_nohup_outlives_a_hangup(build_setup) -> None:
    """Before: kvpatch replaced the SIGHUP that nohup ignores with its own handler, so closing the
    terminal stopped a build started with ``nohup kvpatch build``. After: an ignored SIGHUP stays
    ignored; SIGTERM still stops the build."""
    work, env, marks = build_setup
    proc = _compiling(work, env, marks, preexec=_hangup_ignored)
    try:
        proc.send_signal(signal.SIGHUP)
        time.sleep(2)
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143
    assert _errors(err) == ["error: kvpatch build: terminated (SIGTERM)"]
