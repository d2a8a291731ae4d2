"""Issue 7: each failure a hostile test of every command found, pinned by a test that
failed before its fix. No network: local trees, and package indexes served from a
thread on 127.0.0.1."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from conftest import HEADER, STOCK, fixture_text, git, golden_text, make_tree
from test_cli import KVPATCH, assert_one_line_error, kvpatch, kvpatch_env

from kvpatch import cli
from kvpatch.fsutil import write_atomic


# --------------------------------------------------------------------------- helpers


class _Server:
    """A ThreadingHTTPServer on 127.0.0.1 whose GET answers come from ``routes``."""

    def __init__(self, routes) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.started = threading.Event()  # set when a slow answer has begun
        self.release = threading.Event()  # set to let slow answers finish
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                owner.requests.append((self.path, dict(self.headers)))
                routes(owner, self)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> _Server:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _send(handler, code: int, body: bytes, content_type: str = "text/html", headers: dict | None = None) -> None:
    handler.send_response(code)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for k, v in (headers or {}).items():
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(body)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


# --------------------------------------------------------------------------- 1. Ctrl-C


def _slow_index(owner: _Server, h) -> None:
    """A project page with one sdist whose download stalls after 64 KiB."""
    if h.path.rstrip("/").endswith("/vllm"):
        name = "vllm-0.10.2.tar.gz"
        _send(h, 200, f'<a href="{name}#sha256={"0" * 64}">{name}</a>'.encode())
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
        _send(h, 404, b"no")


def test_ctrl_c_during_the_download_exits_130_with_one_line(tmp_path: Path, work: Path) -> None:
    cache = tmp_path / "cache"
    with _Server(_slow_index) as server:
        env = kvpatch_env(work, KVPATCH_CACHE=str(cache), PIP_INDEX_URL=server.url + "/simple")
        proc = subprocess.Popen(
            [KVPATCH, "apply", "--vllm", "0.10.2", "--remote", str(tmp_path / "no-remote.git")],
            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
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
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: interrupted (Ctrl-C)"], stderr
    assert stderr.splitlines()[-1] == errors[0]
    # nothing half-written: no temp dirs, no partial tree, no half-downloaded archive
    releases = cache / "releases"
    left = sorted(p.name for p in releases.iterdir()) if releases.exists() else []
    assert [n for n in left if not n.endswith(".lock")] == [], left
    assert not list(work.glob(".kvpatch/vllm-*")), list(work.glob(".kvpatch/*"))


def test_ctrl_c_during_a_subprocess_exits_130(tmp_path: Path, work: Path) -> None:
    """A KeyboardInterrupt while a tool (nvcc, git) runs: the tool dies, kvpatch exits 130."""
    started = tmp_path / "started"
    code = (
        "import subprocess, sys, pathlib\n"
        "from kvpatch import api, cli\n"
        "def slow(**kw):\n"
        f"    pathlib.Path({str(started)!r}).touch()\n"
        "    subprocess.run(['sleep', '60'])\n"
        "api.apply = slow\n"
        "sys.argv = ['kvpatch', 'apply', '--tree', '.']\n"
        "cli.run()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=work, env=kvpatch_env(work),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
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
    assert stderr.strip().splitlines() == ["error: interrupted (Ctrl-C)"], stderr


@pytest.mark.parametrize("where", ["api", "callback"])
def test_keyboard_interrupt_anywhere_exits_130(where: str, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture, work: Path) -> None:  # fmt: skip
    def interrupt(*a, **k):
        raise KeyboardInterrupt

    from kvpatch import api

    if where == "api":
        monkeypatch.setattr(api, "apply", interrupt)
    else:
        monkeypatch.setattr(cli, "app", interrupt)  # outside the command typer runs
    monkeypatch.setattr(sys, "argv", ["kvpatch", "apply", "--tree", str(work)])
    monkeypatch.chdir(work)
    with pytest.raises(SystemExit) as info:
        cli.run()
    assert info.value.code == 130
    assert capsys.readouterr().err.strip().splitlines() == ["error: interrupted (Ctrl-C)"]


def test_interrupted_write_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f.txt"
    target.write_text("old\n")

    def interrupt(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


# --------------------------------------------------------------------------- git missing


def test_without_git_every_command_but_fetching_works(tmp_path: Path, work: Path) -> None:
    """GitPython's import dies without a git executable; kvpatch imports it only to fetch."""
    tree = make_tree(tmp_path / "plain", fixture_text(STOCK), commit=False)
    nogit = {"PATH": str(tmp_path / "empty-path")}
    for args in (["apply", "--tree", str(tree)], ["sites"], ["diff"], ["config"], ["revert"]):
        proc = kvpatch(*args, cwd=work, env=nogit)
        assert proc.returncode == 0, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert (tree / HEADER).read_text() == fixture_text(STOCK)  # reverted
    proc = kvpatch("apply", "--vllm", "0.10.2", cwd=work, env=nogit)
    assert_one_line_error(proc, 5, "git not found on PATH", "vLLM 0.10.2")


# --------------------------------------------------------------------------- 7. writes through symlinks


def test_symlinked_header_is_patched_at_its_target(tmp_path: Path, work: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    real = tmp_path / "elsewhere" / "attention_kernels.cuh"
    real.parent.mkdir()
    (tree / HEADER).rename(real)
    (tree / HEADER).symlink_to(real)
    proc = kvpatch("apply", "--tree", str(tree), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert (tree / HEADER).is_symlink() and os.readlink(tree / HEADER) == str(real)
    assert real.read_text() == golden_text("default")
    assert kvpatch("revert", cwd=work).returncode == 0
    assert (tree / HEADER).is_symlink() and real.read_text() == fixture_text(STOCK)


def test_write_atomic_through_a_symlink_chain(tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_text("old")
    real.chmod(0o640)
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to(real)
    write_atomic(tmp_path / "a", "new")
    assert (tmp_path / "a").is_symlink() and (tmp_path / "b").is_symlink()
    assert real.read_text() == "new" and (real.stat().st_mode & 0o777) == 0o640
    (tmp_path / "dangling").symlink_to(tmp_path / "sub" / "made.txt")
    write_atomic(tmp_path / "dangling", "x")
    assert (tmp_path / "dangling").is_symlink() and (tmp_path / "sub" / "made.txt").read_text() == "x"


def test_write_atomic_to_a_device_writes_in_place(tmp_path: Path) -> None:
    """``diff -o /dev/stdout`` as root replaced the device link; a FIFO stands in for it here."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "link").symlink_to(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_atomic(tmp_path / "link", "through the pipe")
    reader.join(10)
    assert got == [b"through the pipe"]
    assert fifo.exists() and not fifo.is_file() and (tmp_path / "link").is_symlink()


@pytest.fixture
def applied(tmp_path: Path, work: Path) -> Path:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    assert kvpatch("apply", "--tree", str(tree), cwd=work).returncode == 0
    return tree


def test_diff_output_dash_is_stdout(applied: Path, work: Path) -> None:
    shown = kvpatch("diff", cwd=work).stdout
    proc = kvpatch("diff", "-o", "-", cwd=work)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, shown, "")
    assert not (work / "-").exists() and shown.startswith("diff --git")


def test_diff_output_to_a_directory_is_one_line(applied: Path, work: Path) -> None:
    (work / "out").mkdir()
    assert_one_line_error(kvpatch("diff", "-o", "out", cwd=work), 2, "--output out is a directory")
    assert list((work / "out").iterdir()) == []


def test_diff_output_through_a_symlink(applied: Path, work: Path, tmp_path: Path) -> None:
    real = tmp_path / "real.patch"
    real.write_text("old")
    (work / "link.patch").symlink_to(real)
    assert kvpatch("diff", "-o", "link.patch", cwd=work).returncode == 0
    assert (work / "link.patch").is_symlink() and real.read_text().startswith("diff --git")


# --------------------------------------------------------------------------- 8. bounds through the CLI


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--lookahead", str(2**29)], "at most 1024"),
        (["--lookahead", "9" * 5000], "--lookahead"),
        (["--align", str(2**64)], "at most 4096"),
        (["--size", "1048576"], "at most 1048560 bytes (cp.async.bulk.prefetch's limit)"),
    ],
    ids=["lookahead", "lookahead-5000-digits", "align", "size"],
)
def test_out_of_range_values_are_refused(args: list[str], needle: str, tmp_path: Path, work: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    assert_one_line_error(kvpatch("apply", "--tree", str(tree), *args, cwd=work), 2, needle)
    assert (tree / HEADER).read_text() == fixture_text(STOCK)
