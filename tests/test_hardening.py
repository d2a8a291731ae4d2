"""Issue 7: each failure a hostile test of every command found, pinned by a test that
failed before its fix. No network: local trees, and package indexes served from a
thread on 127.0.0.1."""

from __future__ import annotations

import errno
import functools
import hashlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

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


def _sigint_default() -> None:
    """For a child the test sends SIGINT to: a shell that starts pytest in the background
    (``cmd &`` without job control) makes children inherit SIGINT ignored, and Python then
    installs no KeyboardInterrupt handler. A user's Ctrl-C at a terminal finds it default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_the_download_exits_130_with_one_line(tmp_path: Path, work: Path) -> None:
    cache = tmp_path / "cache"
    with _Server(_slow_index) as server:
        env = kvpatch_env(work, KVPATCH_CACHE=str(cache), PIP_INDEX_URL=server.url + "/simple")
        proc = subprocess.Popen(
            [KVPATCH, "apply", "--vllm", "0.10.2", "--remote", str(tmp_path / "no-remote.git")],
            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default,
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
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=work, env=kvpatch_env(work), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)  # fmt: skip
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
    from kvpatch.patch.sites import find_sites

    calls = _interrupt_inside_libclangs_visitor(monkeypatch, after)
    with pytest.raises(KeyboardInterrupt):
        find_sites(fixture_text(STOCK), header_path)
    assert calls[0] >= after


def test_ctrl_c_inside_a_libclang_walk_during_apply_exits_130_and_writes_nothing(
        tmp_path: Path, work: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # fmt: skip
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    _interrupt_inside_libclangs_visitor(monkeypatch, 3000)
    code, err = _run_cli(monkeypatch, capsys, work, "apply", "--tree", str(tree))
    assert code == 130 and err.strip().splitlines() == ["error: interrupted (Ctrl-C)"], err
    assert (tree / HEADER).read_text() == fixture_text(STOCK)
    assert not (work / ".kvpatch/state.json").exists()


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


@pytest.mark.parametrize("brk", ["\f", "\v", "\x1c", "\x85", "\u2028", "\u2029", "\r"],
                         ids=["FF", "VT", "FS", "NEL", "LS", "PS", "CR"])  # fmt: skip
def test_the_patch_applies_with_odd_line_breaks_near_a_site(brk: str, tmp_path: Path, work: Path) -> None:
    """Characters str.splitlines breaks at but git does not: the patch split a comment there
    and added 'No newline at end of file' lines that git apply and patch rejected."""
    text = fixture_text(STOCK)
    anchor = "const int64_t physical_block_number ="  # the line above each site: the hunks' context
    assert text.count(anchor) == 2
    text = text.replace(anchor, f"{anchor} /* odd{brk}break */").replace("value loops", f"value{brk}loops", 1)
    tree = make_tree(tmp_path / "vllm", text)
    pristine = make_tree(tmp_path / "pristine", text)
    assert kvpatch("apply", "--tree", str(tree), cwd=work).returncode == 0
    proc = kvpatch("diff", "-o", str(tmp_path / "k.patch"), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert b"No newline" not in (tmp_path / "k.patch").read_bytes()
    git(pristine, "apply", str(tmp_path / "k.patch"))
    assert (pristine / HEADER).read_bytes() == (tree / HEADER).read_bytes()


def test_diff_warns_when_the_header_was_edited_after_apply(applied: Path, work: Path) -> None:
    header = applied / HEADER
    assert kvpatch("diff", cwd=work).stderr == ""
    header.write_text(header.read_text().replace("// Iterate over the key blocks", "// my edit", 1))
    proc = kvpatch("diff", cwd=work)
    assert proc.returncode == 0 and "has edits kvpatch did not make" in proc.stderr
    assert proc.stdout.startswith("diff --git")
    body = header.read_text()
    start = body.index("// kvpatch:begin")
    header.write_text(body[:start] + body[start:].replace("\n", "\n// hand\n", 2))
    assert "regions in" in kvpatch("diff", cwd=work).stderr


# --------------------------------------------------------------------------- 8. bounds through the CLI


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--lookahead", str(2**29)], "at most 1024"),
        (["--lookahead", "9" * 5000], "--lookahead"),
        (["--align", str(2**64)], "at most 4096"),
        (["--size", "1048576"], "at most 1048560 bytes (cp.async.bulk.prefetch's limit)"),
        (["--size", "00000000000016"], ""),  # zero-padded 16: fine, and no "at most" message
        (["--size", "\u00b2"], "invalid size"),  # '2'.isdigit() but int() refuses it
        (["--rule", "fp16/\u00b2=off"], "head size"),
        (["--fp16", "lookahead=\u00b2"], "invalid lookahead"),
        (["--fp16", "lookahead=\u0663"], "invalid lookahead"),  # Arabic-Indic 3: not read as 3
    ],
    ids=["lookahead", "lookahead-5000-digits", "align", "size", "size-zero-padded", "size-superscript",
         "rule-superscript", "setting-superscript", "setting-arabic-indic"],
)
def test_out_of_range_values_are_refused(args: list[str], needle: str, tmp_path: Path, work: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    proc = kvpatch("apply", "--tree", str(tree), *args, cwd=work)
    if not needle:
        assert proc.returncode == 0, proc.stderr
        return
    assert_one_line_error(proc, 2, needle)
    assert (tree / HEADER).read_text() == fixture_text(STOCK)


def test_a_marker_with_odd_digits_is_not_a_crash(tmp_path: Path, work: Path) -> None:
    """A hand-made marker pair whose setting int() cannot read ('2' as a superscript)."""
    anchor = "  // Iterate over the key blocks"
    text = fixture_text(STOCK).replace(anchor, "  // kvpatch:begin key lookahead=\u00b2\n  // kvpatch:end key\n" + anchor, 1)
    tree = make_tree(tmp_path / "vllm", text)
    for command in (["sites"], ["diff"], ["revert"], ["apply"]):
        proc = kvpatch(*command, "--tree", str(tree), cwd=work)
        assert "Traceback" not in proc.stderr and proc.returncode in (0, 2, 4), (command, proc.stderr)
    assert kvpatch("revert", "--force", "--tree", str(tree), cwd=work).returncode == 0
    assert (tree / HEADER).read_text() == fixture_text(STOCK)


# --------------------------------------------------------------------------- 2. edits inside kvpatch's regions


EDIT_IN_REGION = ("kvpatch_next < end_block_idx", "kvpatch_next <= end_block_idx")


def _edit_region(header: Path) -> str:
    text = header.read_text()
    assert text.count(EDIT_IN_REGION[0]) >= 1
    edited = text.replace(EDIT_IN_REGION[0], EDIT_IN_REGION[1], 1)
    header.write_text(edited)
    return edited


@pytest.mark.parametrize("args", [[], ["--caches", "k"], ["--preset", "paper"]], ids=["same-config", "other-config", "paper"])
def test_an_edit_inside_a_region_is_refused_by_apply(args: list[str], applied: Path, work: Path) -> None:
    edited = _edit_region(applied / HEADER)
    proc = kvpatch("apply", "--tree", str(applied), *args, cwd=work)
    assert_one_line_error(proc, 4, "kvpatch's regions (", "were changed", "--force")
    assert (applied / HEADER).read_text() == edited
    forced = kvpatch("apply", "--tree", str(applied), *args, "--force", cwd=work)
    assert forced.returncode == 0, forced.stderr
    assert EDIT_IN_REGION[1] not in (applied / HEADER).read_text()


def test_an_edit_inside_a_region_is_refused_by_revert(applied: Path, work: Path) -> None:
    edited = _edit_region(applied / HEADER)
    assert_one_line_error(kvpatch("revert", cwd=work), 4, "were changed", "--force")
    assert (applied / HEADER).read_text() == edited
    assert kvpatch("revert", "--force", cwd=work).returncode == 0
    assert (applied / HEADER).read_text() == fixture_text(STOCK)


def test_an_edited_marker_is_refused(applied: Path, work: Path) -> None:
    header = applied / HEADER
    header.write_text(header.read_text().replace("// kvpatch:begin key lookahead=1", "// kvpatch:begin key lookahead=2", 1))
    assert_one_line_error(kvpatch("apply", "--tree", str(applied), cwd=work), 4, "2 different configurations")


def test_an_untouched_injection_is_intact_for_every_golden(header_path: str) -> None:
    from kvpatch.config import config_from_marker, make_config
    from kvpatch.patch.plan import inspect, patch

    for options in ({}, {"preset": "paper"}, {"caches": "k", "placement": "end"}, {"issue": "inline", "fp16": "none"},
                    {"cache_hint": "evict_first", "lookahead": 2, "size": 8192, "align": 128, "control": True}):  # fmt: skip
        cfg = make_config(**options)
        patched = patch(fixture_text(STOCK), header_path, cfg).patched
        found = inspect(patched, header_path)
        assert (found.intact, found.config, found.stock) == (True, cfg, fixture_text(STOCK))
        assert config_from_marker(cfg.marker()) == cfg


# --------------------------------------------------------------------------- 3. the local-edit check without git


def test_without_git_the_check_is_off_and_says_so_then_uses_the_recorded_hash(tmp_path: Path, work: Path) -> None:
    tree = make_tree(tmp_path / "plain", fixture_text(STOCK), commit=False)
    proc = kvpatch("apply", "--tree", str(tree), cwd=work)
    assert proc.returncode == 0, proc.stderr
    notes = proc.stderr.strip().splitlines()
    assert len(notes) == 1 and notes[0].startswith("note: local-edit check off: ") and "not a git checkout" in notes[0]
    # Later applies compare with the sha256 of the stock text recorded at the first.
    again = kvpatch("apply", "--tree", str(tree), "--caches", "k", cwd=work)
    assert (again.returncode, again.stderr) == (0, "")
    header = tree / HEADER
    edited = header.read_text().replace("  float acc = 0.f;", "  float acc = 1.f;")
    header.write_text(edited)
    assert_one_line_error(kvpatch("apply", "--tree", str(tree), cwd=work), 4, "changed since the last apply", "--force")
    assert header.read_text() == edited


def test_dubious_ownership_is_not_skipped_silently(tmp_path: Path, work: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the tree to another user")
    tree = make_tree(tmp_path / "theirs", fixture_text(STOCK))
    subprocess.run(["chown", "-R", "12345:12345", str(tree)], check=True)
    proc = kvpatch("apply", "--tree", str(tree), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert "dubious ownership" in proc.stderr and "local-edit check off" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_recorded_release_header_passes_without_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpatch.source import releases, workspace

    stock = fixture_text(STOCK)
    tree = make_tree(tmp_path / "plain", stock, commit=False)
    notes: list[str] = []
    check = functools.partial(workspace.check_no_local_edits, unpatch=lambda t: t, note=notes.append)
    check(workspace.Tree(tree), stock)
    assert len(notes) == 1
    prefix = hashlib.md5(stock.encode()).hexdigest()[:8]
    monkeypatch.setattr(releases, "REVISIONS", (("9.9.9", "9.9.9", prefix),))
    notes.clear()
    check(workspace.Tree(tree), stock)
    check(workspace.Tree(tree), stock.replace("\n", "\r\n"))
    assert notes == []


# --------------------------------------------------------------------------- 4. committed patches, autocrlf


def test_a_committed_patched_header_is_not_a_local_edit(applied: Path, work: Path) -> None:
    git(applied, "commit", "-qam", "patched with kvpatch")
    again = kvpatch("apply", "--tree", str(applied), cwd=work)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("already applied")
    other = kvpatch("apply", "--tree", str(applied), "--caches", "v", cwd=work)
    assert other.returncode == 0, other.stderr
    (applied / HEADER).write_text((applied / HEADER).read_text().replace("  float acc = 0.f;", "  float acc = 1.f;"))
    assert_one_line_error(kvpatch("apply", "--tree", str(applied), cwd=work), 4, "local edits")


def test_autocrlf_checkout_is_not_a_local_edit(tmp_path: Path, work: Path) -> None:
    origin = make_tree(tmp_path / "origin", fixture_text(STOCK))
    clone = tmp_path / "crlf"
    git(tmp_path, "-c", "core.autocrlf=true", "clone", "-q", str(origin), str(clone))
    git(clone, "config", "core.autocrlf", "true")
    before = (clone / HEADER).read_bytes()
    assert b"\r\n" in before
    proc = kvpatch("apply", "--tree", str(clone), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert b"\r\n" in (clone / HEADER).read_bytes() and b"kvpatch:begin" in (clone / HEADER).read_bytes()
    assert kvpatch("revert", cwd=work).returncode == 0
    assert (clone / HEADER).read_bytes() == before


# --------------------------------------------------------------------------- 5. concurrent applies in one directory


def _sdist_index(root: Path, version: str = "0.10.2") -> Path:
    """A file:// index whose vllm-<version> sdist holds the fixture header."""
    from test_fetch import make_index

    return make_index(root, version, extra={HEADER: fixture_text(STOCK)})


def _parallel(argss: list[list[str]], cwd: Path, env: dict[str, str]) -> list[subprocess.CompletedProcess]:
    procs = [subprocess.Popen([KVPATCH, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for args in argss]  # fmt: skip
    done = []
    for args, p in zip(argss, procs):
        out, err = p.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(args, p.returncode, out, err))
    return done


def test_three_first_applies_at_once_all_succeed(tmp_path: Path, work: Path) -> None:
    env = kvpatch_env(work, KVPATCH_CACHE=str(tmp_path / "cache"), PIP_INDEX_URL=_sdist_index(tmp_path / "index").as_uri())
    remote = ["--remote", str(tmp_path / "no-remote.git")]
    results = _parallel([["apply", "--vllm", "0.10.2", *remote]] * 3, work, env)
    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr for r in results]
    header = work / ".kvpatch/vllm-0.10.2" / HEADER
    assert header.read_text() == golden_text("default")
    assert not list(work.glob(".kvpatch/*.partial"))


def test_parallel_applies_with_different_configs_leave_header_and_state_agreeing(tmp_path: Path, work: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    results = _parallel([["apply", "--tree", str(tree), "--lookahead", str(n)] for n in (1, 2, 3, 4)], work, kvpatch_env(work))
    assert [r.returncode for r in results] == [0, 0, 0, 0], [r.stderr for r in results]
    state = json.loads((work / ".kvpatch/state.json").read_text())
    assert f"// kvpatch:begin key {state['marker']}\n" in (tree / HEADER).read_text()
    assert f"lookahead={state['config']['lookahead']} " in state["marker"]


def test_a_header_state_mismatch_is_reported(applied: Path, work: Path) -> None:
    path = work / ".kvpatch/state.json"
    state = json.loads(path.read_text())
    state["marker"] = state["marker"].replace("lookahead=1", "lookahead=7")
    path.write_text(json.dumps(state))
    proc = kvpatch("diff", cwd=work)
    assert proc.returncode == 0 and proc.stdout.startswith("diff --git")
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ") and "state.json records" in lines[0]
    assert "lookahead=7" in lines[0] and "lookahead=1" in lines[0]


def test_build_reports_a_header_state_mismatch(applied: Path, work: Path) -> None:
    """build (and validate/bench/tune) read the tree's configuration through api.tree_config."""
    import io

    from rich.console import Console

    from kvpatch import api
    from kvpatch.source.workspace import Tree

    path = work / ".kvpatch/state.json"
    state = json.loads(path.read_text())
    state["marker"] = "preset=paper caches=kv"
    path.write_text(json.dumps(state))
    buf = io.StringIO()
    cfg = api.tree_config(Tree(applied), work, Console(file=buf, width=400))
    assert cfg.preset == "default"  # the header wins
    assert buf.getvalue().count("\n") == 1 and "state.json records 'preset=paper caches=kv'" in buf.getvalue()


# --------------------------------------------------------------------------- 6. a full disk


def _enospc_for(monkeypatch: pytest.MonkeyPatch, where: Callable[[Path], bool], step: str) -> None:
    from kvpatch import fsutil

    real_stage, real_replace = fsutil.stage, os.replace

    def stage(path, *a, **k):
        if step == "stage" and where(Path(path)):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_stage(path, *a, **k)

    def replace(src, dst, *a, **k):
        if step == "commit" and where(Path(dst)):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(fsutil, "stage", stage)
    monkeypatch.setattr(fsutil.os, "replace", replace)
    from kvpatch.source import workspace

    monkeypatch.setattr(workspace, "stage", stage)


def _run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, cwd: Path, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["kvpatch", *args])
    monkeypatch.chdir(cwd)
    cli._DEBUG["on"] = False
    with pytest.raises(SystemExit) as info:
        cli.run()
    return info.value.code, capsys.readouterr().err


@pytest.mark.parametrize("step", ["stage", "commit"])
def test_disk_full_writing_the_state_leaves_the_header_as_it_was(step: str, tmp_path: Path, work: Path,
                                                                 monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # fmt: skip
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    _enospc_for(monkeypatch, lambda p: p.name == "state.json", step)
    code, err = _run_cli(monkeypatch, capsys, work, "apply", "--tree", str(tree))
    assert code == 1 and err.count("\n") == 1 and "No space left on device" in err and "Traceback" not in err
    assert (tree / HEADER).read_text() == fixture_text(STOCK)
    assert not (work / ".kvpatch/state.json").exists()
    assert sorted(p.name for p in (work / ".kvpatch").iterdir()) == ["lock"]
    assert sorted(p.name for p in (tree / HEADER).parent.iterdir()) == ["attention_kernels.cuh"]


@pytest.mark.parametrize("errno_", [errno.ENOSPC, errno.EROFS, errno.EACCES], ids=["ENOSPC", "EROFS", "EACCES"])
def test_a_tree_that_cannot_be_written_is_one_line(errno_: int, tmp_path: Path, work: Path,
                                                   monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # fmt: skip
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    from kvpatch import fsutil

    real = fsutil.stage

    def stage(path, *a, **k):
        if Path(path).name == "attention_kernels.cuh":
            raise OSError(errno_, os.strerror(errno_), str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(fsutil, "stage", stage)
    code, err = _run_cli(monkeypatch, capsys, work, "apply", "--tree", str(tree))
    assert code == 4 and err.count("\n") == 1, err
    assert err.startswith(f"error: cannot write {tree / HEADER}: {os.strerror(errno_)} (the header is unchanged)")
    assert (tree / HEADER).read_text() == fixture_text(STOCK) and not (work / ".kvpatch/state.json").exists()


# --------------------------------------------------------------------------- tracebacks -> one line


def test_tree_naming_a_loop_or_a_long_name_or_a_deleted_tree_is_a_usage_error(applied: Path, tmp_path: Path,
                                                                               work: Path) -> None:  # fmt: skip
    (tmp_path / "l1").symlink_to(tmp_path / "l2")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    for command in ("sites", "apply", "diff", "revert"):
        assert_one_line_error(kvpatch(command, "--tree", str(tmp_path / "l1"), cwd=work), 2, "cannot resolve")
    assert_one_line_error(kvpatch("sites", "--tree", "a" * 5000, cwd=work), 2, "File name too long")
    applied.rename(tmp_path / "moved")
    for command in ("sites", "diff", "revert", "build"):
        assert_one_line_error(kvpatch(command, cwd=work), 2, "is gone", "state.json")


def test_a_closed_stdout_is_not_a_crash(applied: Path, work: Path) -> None:
    for command in ("diff", "config", "sites"):
        proc = subprocess.run(f"{KVPATCH} {command} >&-", shell=True, cwd=work, env=kvpatch_env(work),
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (command, proc.stderr)


def test_broken_markers_say_how_to_get_a_stock_header_back(applied: Path, work: Path) -> None:
    header = applied / HEADER
    text = header.read_text()
    header.write_text(text.replace("// kvpatch:end key\n", "", 1))
    for command in (["revert", "--force"], ["apply", "--force", "--tree", str(applied)]):
        assert_one_line_error(kvpatch(*command, cwd=work), 4, "markers are broken", "git checkout")


def test_tree_naming_a_file_or_nothing_is_a_usage_error(tmp_path: Path, work: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert_one_line_error(kvpatch("apply", "--tree", str(tmp_path / "file"), cwd=work), 2, "is not a directory")
    assert_one_line_error(kvpatch("apply", "--tree", str(tmp_path / "nonexistent"), cwd=work), 2, "no such directory")
    assert_one_line_error(kvpatch("diff", "--tree", str(tmp_path / "nonexistent"), cwd=work), 2, "no such directory")


@pytest.mark.parametrize("command", [["apply"], ["sites"], ["diff"], ["revert"]])
def test_a_header_that_is_not_utf8_is_refused(command: list[str], tmp_path: Path, work: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    data = (tree / HEADER).read_bytes().replace(b"float acc = 0.f;", b"float acc = 0.f; // \xff", 1)
    (tree / HEADER).write_bytes(data)
    proc = kvpatch(*command, "--tree", str(tree), cwd=work)
    assert_one_line_error(proc, 4, "is not UTF-8 (byte 0xff at line", "UTF-8 header only")
    assert (tree / HEADER).read_bytes() == data


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "is a directory"),
        (b"lookahead = 2 # \xff\n", "is not UTF-8 (byte 0xff"),
        (b"lookahead = " + b"9" * 5000 + b"\n", "invalid TOML"),
        (b'lookahead = 2\n[kvpatch]\nsize = 64\n', "key(s) lookahead outside [kvpatch]"),
        (b'[kvpatch]\ncache-hint = "none"\ncache_hint = "evict_last"\n', "'cache-hint' and 'cache_hint' are the same setting"),
        (b'[kvpatch.fp16]\nissue = "call"\n"issue" = "inline"\n', "invalid TOML"),
        (b'"[red]x[/]" = 1\n', "unknown configuration key(s): [red]x[/]"),
    ],
    ids=["directory", "not-utf8", "huge-int", "keys-beside-table", "both-spellings", "duplicate", "markup-in-key"],
)
def test_bad_config_files_are_one_line(content: bytes | None, needle: str, work: Path) -> None:
    path = work / "k.toml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    assert_one_line_error(kvpatch("config", "--config", "k.toml", cwd=work), 2, needle)


@pytest.mark.parametrize(
    "content", [b"[]", b'{"tree": 1, "config": {}}', b'{"tree": "/x", "config": []}', b"\xff", b"{", None,
                b'{"tree": "a\\u0000b", "version": null, "config": {}}'],
    ids=["list", "tree-not-str", "config-not-dict", "not-utf8", "not-json", "directory", "tree-with-nul"],
)
def test_a_corrupt_state_file_is_one_line(content: bytes | None, work: Path) -> None:
    path = work / ".kvpatch/state.json"
    path.parent.mkdir()
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    for command in ("diff", "revert", "sites"):
        assert_one_line_error(kvpatch(command, cwd=work), 1, str(path), "run 'kvpatch apply' again")


def test_apply_over_a_corrupt_state_file_rewrites_it(tmp_path: Path, work: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    (work / ".kvpatch").mkdir()
    (work / ".kvpatch/state.json").write_text("[]")
    assert kvpatch("apply", "--tree", str(tree), cwd=work).returncode == 0
    assert json.loads((work / ".kvpatch/state.json").read_text())["tree"] == str(tree)


@pytest.mark.parametrize("vllm", ["0." + "1" * 5000, "v" + "0.10.2" * 50], ids=["5000-digits", "300-chars"])
def test_absurd_vllm_values_are_usage_errors(vllm: str, work: Path) -> None:
    line = assert_one_line_error(kvpatch("apply", "--vllm", vllm, cwd=work), 2, "not a vLLM release number")
    assert len(line) < 150


def test_an_unsupported_release_is_refused_before_any_download(work: Path) -> None:
    env = {"PIP_INDEX_URL": "http://127.0.0.1:9/never-asked"}
    line = assert_one_line_error(kvpatch("apply", "--vllm", "0.25.0", cwd=work, env=env), 3, "0.6.4 through 0.22.1")
    assert "git clone" not in line and not (work / "no-cache").exists() and not (work / ".kvpatch").exists()


def test_brackets_in_paths_and_values_are_shown_literally(tmp_path: Path, work: Path) -> None:
    odd = tmp_path / "[bold]x[/bold]" / "[red]"
    tree = make_tree(odd, fixture_text(STOCK))
    proc = kvpatch("apply", "--tree", str(tree), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"patched {tree / HEADER}"
    empty = tmp_path / "[x]"
    empty.mkdir()
    assert_one_line_error(kvpatch("apply", "--tree", str(empty), cwd=work), 4, f"{empty} has no {HEADER}")
    assert_one_line_error(kvpatch("apply", "--tree", str(tree), "--caches", "[red]k", cwd=work), 2, "'[red]k'")


@pytest.mark.parametrize("args", [["apply", "--bogus"], ["apply", "--lookahead", "two"], ["frobnicate"], ["diff", "-o"]])
def test_usage_errors_are_one_line(args: list[str], work: Path) -> None:
    proc = kvpatch(*args, cwd=work)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--help" in lines[0], proc.stderr


def test_a_truncated_object_in_the_cache_names_the_entry_to_delete(tmp_path: Path, work: Path) -> None:
    cache = tmp_path / "cache"
    env = {"KVPATCH_CACHE": str(cache), "PIP_INDEX_URL": _sdist_index(tmp_path / "index").as_uri()}
    remote = ["--remote", str(tmp_path / "no-remote.git")]
    assert kvpatch("apply", "--vllm", "0.10.2", *remote, cwd=work, env=env).returncode == 0
    release = cache / "releases" / "v0.10.2"
    blob = git(release, "rev-parse", f"HEAD:{HEADER}").strip()
    obj = release / ".git" / "objects" / blob[:2] / blob[2:]
    obj.chmod(0o644)
    obj.write_bytes(obj.read_bytes()[:10])
    other = tmp_path / "other-work"
    other.mkdir()
    proc = kvpatch("apply", "--vllm", "0.10.2", *remote, cwd=other, env=env)
    line = assert_one_line_error(proc, 1, "could not check out v0.10.2", f"delete {release}")
    assert not list(other.glob(".kvpatch/vllm-*"))


def test_an_empty_checkout_dir_is_repaired(tmp_path: Path, work: Path) -> None:
    env = {"KVPATCH_CACHE": str(tmp_path / "cache"), "PIP_INDEX_URL": _sdist_index(tmp_path / "index").as_uri()}
    (work / ".kvpatch/vllm-0.10.2").mkdir(parents=True)
    proc = kvpatch("apply", "--vllm", "0.10.2", "--remote", str(tmp_path / "nothing.git"), cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (work / ".kvpatch/vllm-0.10.2" / HEADER).read_text() == golden_text("default")


# --------------------------------------------------------------------------- 9. the package index client


AUTH = "Basic " + __import__("base64").b64encode(b"user:s3cret").decode()


def _sdist_bytes(tmp_path: Path) -> tuple[bytes, str]:
    from test_fetch import make_sdist

    data = make_sdist(tmp_path / "vllm-0.10.2.tar.gz")
    return data, hashlib.sha256(data).hexdigest()


def _fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index: str):
    from rich.console import Console

    from kvpatch.source.fetch import fetch_release

    monkeypatch.setenv("PIP_INDEX_URL", index)
    return fetch_release("0.10.2", remote=str(tmp_path / "no-remote.git"), cache=tmp_path / "cache",
                         console=Console(file=open(os.devnull, "w")))  # fmt: skip


def _other_host(data: bytes) -> _Server:
    """A second server, reached as 'localhost' (another host than 127.0.0.1 to a client)."""
    return _Server(lambda owner, h: _send(h, 200, data, "application/octet-stream"))


@pytest.mark.parametrize("link", ["relative", "same-host-absolute"])
def test_credentials_go_to_the_index_host_for_its_links(link: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data, digest = _sdist_bytes(tmp_path)

    def routes(owner: _Server, h) -> None:
        if h.headers.get("Authorization") != AUTH:
            _send(h, 401, b"who are you", headers={"WWW-Authenticate": 'Basic realm="index"'})
        elif h.path == "/simple/vllm/":
            href = "../../files/vllm-0.10.2.tar.gz" if link == "relative" else f"{owner.url}/files/vllm-0.10.2.tar.gz"
            _send(h, 200, f'<a href="{href}#sha256={digest}">vllm-0.10.2.tar.gz</a>'.encode())
        elif h.path == "/files/vllm-0.10.2.tar.gz":
            _send(h, 200, data, "application/octet-stream")
        else:
            _send(h, 404, b"no")

    with _Server(routes) as index:
        tree = _fetch(tmp_path, monkeypatch, index.url.replace("http://", "http://user:s3cret@") + "/simple")
    assert (tree / HEADER).is_file()
    assert [(path, headers.get("Authorization")) for path, headers in index.requests] == [
        ("/simple/vllm/", AUTH), ("/files/vllm-0.10.2.tar.gz", AUTH),
    ]  # fmt: skip


@pytest.mark.parametrize("how", ["redirect", "link"])
def test_credentials_never_reach_another_host(how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data, digest = _sdist_bytes(tmp_path)
    with _other_host(data) as files:
        elsewhere = files.url.replace("127.0.0.1", "localhost") + "/vllm-0.10.2.tar.gz"

        def routes(owner: _Server, h) -> None:
            if h.path == "/simple/vllm/":
                href = "/files/vllm-0.10.2.tar.gz" if how == "redirect" else elsewhere
                _send(h, 200, f'<a href="{href}#sha256={digest}">vllm-0.10.2.tar.gz</a>'.encode())
            elif h.path == "/files/vllm-0.10.2.tar.gz":
                _send(h, 302, b"", headers={"Location": elsewhere})
            else:
                _send(h, 404, b"no")

        with _Server(routes) as index:
            tree = _fetch(tmp_path, monkeypatch, index.url.replace("http://", "http://user:s3cret@") + "/simple")
    assert (tree / HEADER).is_file()
    assert all(headers.get("Authorization") == AUTH for _, headers in index.requests)
    assert [(path, headers.get("Authorization")) for path, headers in files.requests] == [("/vllm-0.10.2.tar.gz", None)]


@pytest.mark.parametrize("href", ["file:///etc/hostname", "ftp://127.0.0.1/vllm-0.10.2.tar.gz"])
def test_links_with_other_schemes_are_refused(href: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpatch.errors import FetchError

    page = f'<a href="{href}#sha256={"0" * 64}">vllm-0.10.2.tar.gz</a>'.encode()
    with _Server(lambda owner, h: _send(h, 200, page)) as index:
        with pytest.raises(FetchError, match=r"refusing the link .* only http or https links") as info:
            _fetch(tmp_path, monkeypatch, index.url + "/simple")
    assert info.value.exit_code == 3


@pytest.mark.parametrize(
    ("body", "content_type"),
    [(b"{not json", "application/vnd.pypi.simple.v1+json"), (b'{"files": 3}', "application/vnd.pypi.simple.v1+json"),
     (b"[]", "application/vnd.pypi.simple.v1+json"), (b"<a>", "application/x-unknown")],
    ids=["not-json", "files-not-a-list", "list", "unknown-type"],
)
def test_a_malformed_index_page_is_one_line(body: bytes, content_type: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpatch.errors import FetchError

    with _Server(lambda owner, h: _send(h, 200, body, content_type)) as index:
        with pytest.raises(FetchError) as info:
            _fetch(tmp_path, monkeypatch, index.url + "/simple")
    assert info.value.exit_code == 3 and "\n" not in str(info.value) and "cannot read" in str(info.value)


def test_a_malformed_local_index_page_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpatch.errors import FetchError

    (tmp_path / "index/vllm").mkdir(parents=True)
    (tmp_path / "index/vllm/index.json").write_text('{"files": [{"filename": 1}]}')
    with pytest.raises(FetchError, match="cannot read") as info:
        _fetch(tmp_path, monkeypatch, (tmp_path / "index").as_uri())
    assert info.value.exit_code == 3


@pytest.mark.parametrize("index", ["not a url", "ftp://mirror.example/simple", "127.0.0.1:8080/simple", "http://"])
def test_an_index_url_that_is_not_a_url_is_one_line(index: str, tmp_path: Path, work: Path) -> None:
    env = {"PIP_INDEX_URL": index, "KVPATCH_CACHE": str(tmp_path / "cache")}
    proc = kvpatch("apply", "--vllm", "0.10.2", "--remote", str(tmp_path / "none.git"), cwd=work, env=env)
    assert proc.returncode == 3, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "is not an http(s):// or file:// URL" in errors[0] and "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- 10. unpacking needs tarfile's data filter


def _chain_sdist_index(tmp_path: Path) -> Path:
    """An sdist whose links chain out of the unpack directory: l1 -> ., then l1/l2,
    l1/l2/l3, l1/l2/l3/l4 -> .. each, then a file written through l4. Each link alone
    stays inside the top directory for a check that does not resolve the links
    before it (l1 is the top directory itself, so each '..' climbs one level out)."""
    import io
    import tarfile

    top = "vllm-0.10.2"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        def add(name: str, data: bytes = b"", link: str | None = None) -> None:
            info = tarfile.TarInfo(f"{top}/{name}")
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

        add(HEADER, b"// header\n")
        add("l1", link=".")
        add("l1/l2", link="..")
        add("l1/l2/l3", link="..")
        add("l1/l2/l3/l4", link="..")
        add("l1/l2/l3/l4/escaped.txt", b"outside\n")
    index = tmp_path / "index"
    (index / "vllm").mkdir(parents=True)
    (index / "vllm" / f"{top}.tar.gz").write_bytes(buf.getvalue())
    digest = hashlib.sha256(buf.getvalue()).hexdigest()
    (index / "vllm" / "index.html").write_text(f'<a href="{top}.tar.gz#sha256={digest}">{top}.tar.gz</a>')
    return index


@pytest.mark.parametrize("with_filter", [True, False], ids=["data-filter", "python-without-filter"])
def test_a_symlink_chain_never_writes_outside(with_filter: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tarfile

    from kvpatch.errors import FetchError

    index = _chain_sdist_index(tmp_path)
    if not with_filter:
        monkeypatch.delattr(tarfile, "data_filter")
    with pytest.raises(FetchError) as info:
        _fetch(tmp_path, monkeypatch, index.as_uri())
    assert info.value.exit_code == 3 and "\n" not in str(info.value)
    assert not list(tmp_path.rglob("escaped.txt"))
    if not with_filter:
        assert "3.11.4" in str(info.value)


def test_pyproject_requires_a_python_with_the_filter() -> None:
    import tomllib

    data = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert data["project"]["requires-python"] == ">=3.11.4"
    assert any(d.startswith("pypi-simple") for d in data["project"]["dependencies"])


def test_no_mismatch_warning_after_revert(applied: Path, work: Path) -> None:
    assert kvpatch("revert", cwd=work).returncode == 0
    proc = kvpatch("diff", cwd=work)
    assert (proc.returncode, proc.stdout, proc.stderr.strip()) == (0, "", "no changes: the header is stock")
