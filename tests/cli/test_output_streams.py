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
