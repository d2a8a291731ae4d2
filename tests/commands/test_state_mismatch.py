"""The header and ``.kvpatch/state.json`` disagreeing about a tree's configuration (a crash
between two writes of an older kvpatch, a hand edit): the header wins, and the commands that
read the tree's configuration say so in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli.cli_helpers import run_cli

pytestmark = pytest.mark.slow  # each test applies first (libclang)


def _record(work: Path, marker: str) -> None:
    path = work / ".kvpatch/state.json"
    state = json.loads(path.read_text())
    state["marker"] = marker
    path.write_text(json.dumps(state))


def test_a_header_state_mismatch_is_reported(applied: Path, work: Path) -> None:
    path = work / ".kvpatch/state.json"
    _record(work, json.loads(path.read_text())["marker"].replace("lookahead=1", "lookahead=7"))
    proc = run_cli("diff", cwd=work)
    assert proc.returncode == 0 and proc.stdout.startswith("diff --git")
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ") and "state.json records" in lines[0]
    assert "lookahead=7" in lines[0] and "lookahead=1" in lines[0]


def test_the_tree_configuration_of_build_and_the_gpu_commands_is_the_headers(applied: Path, work: Path) -> None:
    """build, validate, bench and tune read the tree's configuration through tree_config."""
    from kvpatch.commands.tree import tree_config
    from kvpatch.progress import Recorder
    from kvpatch.source.workspace import Tree

    _record(work, "preset=paper caches=kv")
    said = Recorder()
    cfg = tree_config(Tree(applied), work, said)
    assert cfg.preset == "default"  # the header wins
    assert len(said.lines) == 1 and "state.json records 'preset=paper caches=kv'" in said.lines[0]


def test_no_mismatch_warning_after_revert(applied: Path, work: Path) -> None:
    assert run_cli("revert", cwd=work).returncode == 0
    proc = run_cli("diff", cwd=work)
    assert (proc.returncode, proc.stdout, proc.stderr.strip()) == (0, "", "no changes: the header is stock")
