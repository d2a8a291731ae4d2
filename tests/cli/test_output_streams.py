"""Where output goes: a zero-width terminal eats none of it, a piped table keeps every cell
whole, a closed stdout is no crash. Each test runs the command as a new process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli.cli_helpers import KVPATCH, kvpatch, kvpatch_env
from conftest import fixture_text, make_tree

pytestmark = pytest.mark.slow


def test_a_zero_width_terminal_eats_no_output(tmp_path: Path) -> None:
    """``COLUMNS=0``: errors still print, in one line, and JSON is whole."""
    tree = make_tree(tmp_path / "vllm", fixture_text())
    env = {**os.environ, "COLUMNS": "0", "LINES": "0"}
    bad = subprocess.run([sys.executable, "-m", "kvpatch", "apply", "--tree", str(tmp_path / "nope")], cwd=tmp_path,
                         env=env, capture_output=True, text=True)  # fmt: skip
    assert (
        bad.returncode == 2 and bad.stderr.startswith("error: kvpatch apply: --tree ") and bad.stderr.count("\n") == 1
    )
    out = subprocess.run([sys.executable, "-m", "kvpatch", "sites", "--tree", str(tree), "--json", "-"], cwd=tmp_path,
                         env=env, capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["key"]["loop_var"] == "block_idx"
    table = subprocess.run([sys.executable, "-m", "kvpatch", "sites", "--tree", str(tree)], cwd=tmp_path,
                           env=env, capture_output=True, text=True)  # fmt: skip
    assert "block_idx += NUM_WARPS" in table.stdout and "k_cache[...]" in table.stdout


def test_piped_tables_keep_every_cell_whole(tmp_path: Path) -> None:
    """Piped (stdout not a terminal), a table is as wide as its cells, whatever COLUMNS says."""
    tree = make_tree(tmp_path / "vllm", fixture_text())
    env = {**os.environ, "COLUMNS": "20"}
    out = subprocess.run([sys.executable, "-m", "kvpatch", "sites", "--tree", str(tree)], cwd=tmp_path, env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0
    assert any("block_idx += NUM_WARPS" in line for line in out.stdout.splitlines())


def test_a_closed_stdout_is_not_a_crash(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    tree = make_tree(tmp_path / "vllm", fixture_text())
    assert kvpatch("apply", "--tree", str(tree), cwd=work).returncode == 0
    for command in ("diff", "config", "sites"):
        proc = subprocess.run(f"{KVPATCH} {command} >&-", shell=True, cwd=work, env=kvpatch_env(work),
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (command, proc.stderr)


def _with_reader_gone(args: list[str], cwd: Path, streams: str = "stdout") -> subprocess.CompletedProcess:
    """``kvpatch ARGS`` with ``streams`` (stdout, stderr or both) a pipe whose reader has gone,
    as after ``| head -1`` has read its line; stderr is captured where it is not that pipe."""
    read, write = os.pipe()
    os.close(read)
    try:
        out = write if "stdout" in streams or streams == "both" else subprocess.DEVNULL
        err = write if "stderr" in streams or streams == "both" else subprocess.PIPE
        return subprocess.run([KVPATCH, *args], cwd=cwd, env=kvpatch_env(cwd), stdout=out, stderr=err, text=True,
                              timeout=120)  # fmt: skip
    finally:
        os.close(write)


def test_a_reader_that_goes_away_ends_the_command_as_sigpipe_would(tmp_path: Path) -> None:
    """``kvpatch sites | head -1``: exit 141 (what a shell reports for SIGPIPE), nothing on stderr;
    before, the CLI library ended each such command with a silent 1, 'another failure'."""
    work = tmp_path / "work"
    work.mkdir()
    tree = make_tree(tmp_path / "vllm", fixture_text())
    assert kvpatch("apply", "--tree", str(tree), cwd=work).returncode == 0
    for args in (["sites"], ["diff"], ["diff", "-o", "-"], ["config"], ["sites", "--json", "-"], ["--help"],
                 ["build", "--help"], ["--version"]):  # fmt: skip
        proc = _with_reader_gone(args, work)
        assert (proc.returncode, proc.stderr) == (141, ""), args


def test_an_error_keeps_its_exit_code_when_stderrs_reader_has_gone(tmp_path: Path) -> None:
    """The code is then all the caller learns: an invalid option is still 2, not the pipe's 141."""
    for args in (["apply", "--lookahead", "x"], ["apply", "--tree", str(tmp_path / "nope")]):
        assert _with_reader_gone(args, tmp_path, "stderr").returncode == 2, args


def test_an_apply_whose_readers_have_gone_leaves_the_header_whole(tmp_path: Path) -> None:
    """Stopped at its first write (as SIGPIPE stops a program), ``apply`` leaves the header stock or
    wholly patched, never between, and the next ``apply`` runs as if nothing had happened."""
    work = tmp_path / "work"
    work.mkdir()
    tree = make_tree(tmp_path / "vllm", fixture_text())
    header = tree / "csrc" / "attention" / "attention_kernels.cuh"
    stock = header.read_text()
    assert _with_reader_gone(["apply", "--tree", str(tree)], work, "both").returncode == 141
    assert header.read_text() == stock or "kvpatch:begin" in header.read_text()
    assert kvpatch("apply", "--tree", str(tree), cwd=work).returncode == 0
    assert kvpatch("revert", cwd=work).returncode == 0 and header.read_text() == stock
    assert sorted(p.name for p in header.parent.iterdir() if p.name.endswith(".tmp")) == []
