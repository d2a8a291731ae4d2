"""Running the ``kvpatch`` command in tests: as a user runs it (a subprocess of the console
script), or in this process through :func:`kvpatch.cli.run` (the same parsing, errors and exit
codes, without the start-up of a new interpreter). Importable from every room as
``from cli.cli_helpers import ...`` (``tests/`` is on the path)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

KVPATCH = str(Path(sys.executable).parent / "kvpatch")
#: The checkout under test: the console script imports kvpatch from wherever it was
#: installed (editable, maybe another checkout), so PYTHONPATH puts this one first.
ROOT = Path(__file__).resolve().parents[2]


def kvpatch_env(cwd: Path, **extra: str) -> dict[str, str]:
    """The environment of a command run in ``cwd``: plain output, a cache of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "KVPATCH_CACHE")}
    env.update(COLUMNS="400", NO_COLOR="1", TERM="dumb", KVPATCH_CACHE=str(cwd / "no-cache"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))  # fmt: skip
    env.update(extra)
    return env


def signals_default() -> None:
    """``preexec_fn`` of a child the test sends signals to: Ctrl-C, SIGTERM and SIGHUP as a user's
    terminal leaves them. A shell that starts pytest in the background (``cmd &`` without job
    control) makes children inherit SIGINT ignored, ``nohup`` SIGHUP; kvpatch, like Python, keeps
    an ignored signal ignored."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def kvpatch(*args: str, cwd: Path, columns: int = 400, env: dict[str, str] | None = None,
            input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:  # fmt: skip
    """The console script in a new process."""
    full = kvpatch_env(cwd, COLUMNS=str(columns), **(env or {}))
    return subprocess.run([KVPATCH, *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout,
                          input=input)  # fmt: skip


@contextlib.contextmanager
def _as_a_process(argv: list[str], cwd: Path, env: dict[str, str]) -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """argv, the working directory, the environment and both streams as a new process has
    them, restored afterwards (with the signal handlers ``cli.run`` installs)."""
    from kvpatch import cli

    saved_env, saved_argv, saved_cwd = dict(os.environ), sys.argv, os.getcwd()
    from kvpatch.fsutil import files as F

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    hook = sys.unraisablehook
    out, err = io.StringIO(), io.StringIO()
    os.environ.clear()
    os.environ.update(env)
    sys.argv = argv
    os.chdir(cwd)
    cli.DEBUG["on"] = False
    cli._SIGNAL["num"] = None
    F._STOPPED.clear()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield out, err
    finally:
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        for s, h in handlers.items():
            signal.signal(s, h)
        sys.unraisablehook = hook
        F._STOPPED.clear()
        cli.DEBUG["on"] = False


def kvpatch_process(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """``kvpatch ARGS`` as a user runs it (the console script, in its own process), killed and the
    test failed if it runs longer than ``timeout`` (a command that hangs)."""
    import pytest

    try:
        return subprocess.run([KVPATCH, *args], cwd=cwd, env=kvpatch_env(cwd), capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"kvpatch {' '.join(args)} hung (> {timeout} s)")


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``kvpatch ARGS`` run by :func:`kvpatch.cli.run` in this process, in ``cwd``, with the
    environment :func:`kvpatch_env` gives a subprocess; its exit code and both streams."""
    from kvpatch import cli

    code: object = 0
    with _as_a_process(["kvpatch", *args], cwd, kvpatch_env(cwd, **(env or {}))) as (out, err):
        try:
            cli.run()
        except SystemExit as e:
            code = e.code
    code = 0 if code is None else code if isinstance(code, int) else 1
    return subprocess.CompletedProcess(["kvpatch", *args], code, out.getvalue(), err.getvalue())


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """Exit ``code``, nothing on stdout, and exactly one line 'error: ...' on stderr; the line."""
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def error_text(line: str) -> str:
    """An error line without its ``error: kvpatch COMMAND: `` prefix."""
    assert line.startswith("error: "), line
    rest = line.removeprefix("error: ")
    if rest.startswith("kvpatch "):
        rest = rest.split(": ", 1)[1]
    return rest
