"""Ctrl-C wherever it lands (a download, a tool kvpatch runs, libclang's walk of the AST,
outside any command) ends kvpatch with exit 130 and one line, ``error: ... interrupted
(Ctrl-C)``, and leaves nothing half-written. No network: a package index served from a thread
on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli.cli_helpers import KVPATCH, kvpatch_env, run_cli, signals_default
from conftest import HEADER, STOCK, fixture_text, make_tree
from source.source_helpers import IndexServer, send


def _slow_index(owner: IndexServer, h) -> None:
    """A project page with one sdist whose download stalls after 64 KiB."""
    if h.path.rstrip("/").endswith("/vllm"):
        name = "vllm-0.10.2.tar.gz"
        send(h, 200, f'<a href="{name}#sha256={"0" * 64}">{name}</a>'.encode())
    elif h.path.endswith(".tar.gz"):
        h.send_response(200)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(50 << 20))
        h.end_headers()
        h.wfile.write(b"\0" * (64 << 10))
        h.wfile.flush()
        owner.started.set()
        owner.release.wait(60)
    else:
        send(h, 404, b"no")


def _interrupted_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_ctrl_c_during_the_download_exits_130_with_one_line(tmp_path: Path, work: Path) -> None:
    cache = tmp_path / "cache"
    with IndexServer(_slow_index) as server:
        env = kvpatch_env(work, KVPATCH_CACHE=str(cache), PIP_INDEX_URL=server.url + "/simple")
        proc = subprocess.Popen(
            [KVPATCH, "apply", "--vllm", "0.10.2", "--remote", str(tmp_path / "no-remote.git")],
            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=signals_default,
        )  # fmt: skip
        try:
            assert server.started.wait(60), "the download never started"
            time.sleep(0.3)
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    errors = _interrupted_lines(stderr)
    assert errors == ["error: kvpatch apply: interrupted (Ctrl-C)"], stderr
    assert stderr.splitlines()[-1] == errors[0]
    # nothing half-written: no temp dirs, no partial tree, no half-downloaded archive
    releases = cache / "releases"
    left = sorted(p.name for p in releases.iterdir()) if releases.exists() else []
    assert [n for n in left if not n.endswith(".lock")] == [], left
    assert not list(work.glob(".kvpatch/vllm-*")), list(work.glob(".kvpatch/*"))


@pytest.mark.slow
def test_ctrl_c_during_a_subprocess_exits_130(tmp_path: Path, work: Path) -> None:
    """A KeyboardInterrupt while a tool (nvcc, git) runs: the tool dies, kvpatch exits 130."""
    started = tmp_path / "started"
    code = (
        "import subprocess, sys, pathlib\n"
        "from kvpatch import cli\n"
        "from kvpatch.commands import apply\n"
        "def slow(*a, **kw):\n"
        f"    pathlib.Path({str(started)!r}).touch()\n"
        "    subprocess.run(['sleep', '60'])\n"
        "apply.run = slow\n"
        "sys.argv = ['kvpatch', 'apply', '--tree', '.']\n"
        "cli.run()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=work, env=kvpatch_env(work), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=signals_default)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines() == ["error: kvpatch apply: interrupted (Ctrl-C)"], stderr


def _interrupt(*a, **k):
    raise KeyboardInterrupt


def test_keyboard_interrupt_in_a_command_exits_130(monkeypatch: pytest.MonkeyPatch, work: Path) -> None:
    from kvpatch.commands import apply

    monkeypatch.setattr(apply, "run", _interrupt)
    proc = run_cli("apply", "--tree", str(work), cwd=work)
    assert (proc.returncode, proc.stdout) == (130, "")
    assert proc.stderr.strip().splitlines() == ["error: kvpatch apply: interrupted (Ctrl-C)"]


def test_keyboard_interrupt_outside_any_command_exits_130(monkeypatch: pytest.MonkeyPatch, work: Path) -> None:
    """Outside the command typer runs: the error line still comes, without a command to name
    (the commands are not there to read)."""
    from kvpatch import cli

    monkeypatch.setattr(cli, "app", _interrupt)
    proc = run_cli("apply", "--tree", str(work), cwd=work)
    assert proc.returncode == 130
    assert proc.stderr.strip().splitlines() == ["error: interrupted (Ctrl-C)"]


def _interrupt_inside_libclangs_visitor(monkeypatch: pytest.MonkeyPatch, after: int) -> list[int]:
    """Raise KeyboardInterrupt inside libclang's child-visitor callback (a ctypes callback,
    where a real Ctrl-C lands most of the time) on its ``after``-th call."""
    import clang.cindex as ci

    real = ci.conf.lib.clang_getNullCursor  # the visitor calls it for every child
    calls = [0]

    def null_cursor(*args):
        calls[0] += 1
        if calls[0] == after:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(ci.conf.lib, "clang_getNullCursor", null_cursor)
    return calls


@pytest.mark.parametrize("after", [1, 50, 900, 1700])  # of ~1800 visits
def test_ctrl_c_inside_a_libclang_walk_is_not_swallowed(after: int, header_path: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """ctypes prints and drops an exception raised in a callback and libclang stops
    visiting: without the guard the walk ends early and find_sites works on part of the AST."""
    from kvpatch.patch import find_sites

    calls = _interrupt_inside_libclangs_visitor(monkeypatch, after)
    with pytest.raises(KeyboardInterrupt):
        find_sites(fixture_text(STOCK), header_path)
    assert calls[0] >= after


def test_ctrl_c_inside_a_libclang_walk_during_apply_exits_130_and_writes_nothing(
        tmp_path: Path, work: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    _interrupt_inside_libclangs_visitor(monkeypatch, 3000)
    proc = run_cli("apply", "--tree", str(tree), cwd=work)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().splitlines() == ["error: kvpatch apply: interrupted (Ctrl-C)"]
    assert (tree / HEADER).read_text() == fixture_text(STOCK)
    assert not (work / ".kvpatch/state.json").exists()


_SIGNAL_ON_IMPORT = """\
import builtins, os, signal

_import = builtins.__import__


def _slow(name, *args, **kwargs):
    if name == "typer":  # the first heavy import of the command's modules: a signal lands here
        builtins.__import__ = _import
        os.kill(os.getpid(), signal.{sig})
    return _import(name, *args, **kwargs)


builtins.__import__ = _slow
"""


@pytest.mark.parametrize("sig,code,said", [("SIGINT", 130, "interrupted (Ctrl-C)"), ("SIGTERM", 143,
                                           "terminated (SIGTERM)"), ("SIGHUP", 129, "terminated (SIGHUP)")])  # fmt: skip
def test_a_signal_while_the_command_loads_is_one_line_and_its_code(tmp_path: Path, sig: str, code: int,
                                                                   said: str) -> None:  # fmt: skip
    """Before: the console script imported the command's modules (typer, rich, ...) before it set
    its handlers, so a Ctrl-C in its first tenth of a second printed a traceback of an import.
    After: the installed ``kvpatch`` loads them under a handler of its own: one line, the code."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_SIGNAL_ON_IMPORT.format(sig=sig))
    env = kvpatch_env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(hook), env["PYTHONPATH"]])
    proc = subprocess.run([KVPATCH, "plugin", "status", "--dir", str(tmp_path / "none")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, preexec_fn=signals_default)  # fmt: skip
    assert proc.returncode == code and proc.stderr == f"error: kvpatch: {said}\n", proc.stderr
    assert proc.stdout == ""
