"""A stop whose exception is lost still stops the command: a signal that lands while libclang
walks the AST runs its handler inside a ctypes callback, where Python prints the exception and
drops it. The stop is noted all the same: nothing is renamed into place after it, and the command
ends with the signal's exit code and one line, not 0 (a Ctrl-C taken for success) or a traceback.
Run as a process of its own: the test runner's own hook for dropped exceptions is not Python's."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli.cli_helpers import kvpatch_env
from conftest import fixture_text, make_tree

#: kvpatch apply, with a signal raised inside a ctypes callback outside the patch package's
#: entry points (as a libclang string's finalizer may run one), just before the header is written
DRIVER = """
import ctypes, signal, sys
import kvpatch.commands.apply as apply
from kvpatch import cli

SIGNUM, TREE = int(sys.argv[1]), sys.argv[2]
real = apply.check_header_writable
CALLBACK = ctypes.CFUNCTYPE(None)

def check_then_signal(*args, **kwargs):
    CALLBACK(lambda: signal.raise_signal(SIGNUM))()  # its handler's exception is dropped by ctypes
    return real(*args, **kwargs)

apply.check_header_writable = check_then_signal
sys.argv = ["kvpatch", "apply", "--tree", TREE]
cli.run()
"""


@pytest.mark.parametrize(("signum", "code", "said"), [(signal.SIGHUP, 129, "terminated (SIGHUP)"),
                                                     (signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                                     (signal.SIGINT, 130, "interrupted (Ctrl-C)")])  # fmt: skip
def test_a_signal_lost_in_a_libclang_callback_stops_apply_before_it_writes(
    tmp_path: Path, signum: int, code: int, said: str
) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text())
    stock = tree.joinpath("csrc/attention/attention_kernels.cuh").read_bytes()
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(int(signum)), str(tree)], cwd=work, env=kvpatch_env(work),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert (proc.returncode, proc.stderr.splitlines()) == (code, [f"error: kvpatch apply: {said}"])
    assert tree.joinpath("csrc/attention/attention_kernels.cuh").read_bytes() == stock
    assert not (work / ".kvpatch" / "state.json").exists()


def test_a_stop_wrapped_by_ctypes_in_an_argument_error_ends_a_libclang_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGHUP or SIGTERM landing while ctypes converts an argument reaches the patch package as
    an ArgumentError that names the stop's own exception ('Terminated: SIGHUP'): a stop."""
    import ctypes

    from kvpatch.fsutil import files
    from kvpatch.patch.interrupts import interruptible

    @interruptible
    def walk() -> None:
        files.note_stop(signal.SIGHUP)
        raise ctypes.ArgumentError("argument 1: Terminated: SIGHUP")

    monkeypatch.setattr(files, "_STOPPED", [])
    with pytest.raises(KeyboardInterrupt):
        walk()
