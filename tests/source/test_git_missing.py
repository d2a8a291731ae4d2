"""Without a git executable every command but fetching works: GitPython's import dies
without git, and kvpatch imports it only to fetch a release; fetching says git is missing."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, kvpatch
from conftest import HEADER, STOCK, fixture_text, make_tree


@pytest.mark.slow  # a new process per command: PATH without git from its start
def test_without_git_every_command_but_fetching_works(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    tree = make_tree(tmp_path / "plain", fixture_text(STOCK), commit=False)
    nogit = {"PATH": str(tmp_path / "empty-path")}
    for args in (["apply", "--tree", str(tree)], ["sites"], ["diff"], ["config"], ["revert"]):
        proc = kvpatch(*args, cwd=work, env=nogit)
        assert proc.returncode == 0, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert (tree / HEADER).read_text() == fixture_text(STOCK)  # reverted
    proc = kvpatch("apply", "--vllm", "0.10.2", cwd=work, env=nogit)
    assert_one_line_error(proc, 5, "git not found on PATH", "vLLM 0.10.2")
