"""What ``--tree`` (or the last apply's tree) may name: a directory that exists and resolves;
a symlink loop, a name too long, a file, nothing there, or a recorded tree that is gone is a
usage error in one line (exit 2), for every command that takes a tree."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from conftest import STOCK, fixture_text, make_tree


@pytest.mark.parametrize("command", ["sites", "apply", "diff", "revert"])
def test_a_tree_naming_a_symlink_loop_is_a_usage_error(command: str, tmp_path: Path, work: Path) -> None:
    (tmp_path / "l1").symlink_to(tmp_path / "l2")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    assert_one_line_error(run_cli(command, "--tree", str(tmp_path / "l1"), cwd=work), 2, "cannot resolve")


def test_a_tree_with_a_name_too_long_is_a_usage_error(work: Path) -> None:
    assert_one_line_error(run_cli("sites", "--tree", "a" * 5000, cwd=work), 2, "File name too long")


@pytest.mark.slow  # applies first (libclang)
def test_the_last_apply_s_tree_gone_is_a_usage_error(tmp_path: Path, work: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    assert run_cli("apply", "--tree", str(tree), cwd=work).returncode == 0
    tree.rename(tmp_path / "moved")
    for command in ("sites", "diff", "revert", "build"):
        assert_one_line_error(run_cli(command, cwd=work), 2, "is gone", "state.json")


def test_tree_naming_a_file_or_nothing_is_a_usage_error(tmp_path: Path, work: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert_one_line_error(run_cli("apply", "--tree", str(tmp_path / "file"), cwd=work), 2, "is not a directory")
    assert_one_line_error(run_cli("apply", "--tree", str(tmp_path / "nonexistent"), cwd=work), 2, "no such directory")
    assert_one_line_error(run_cli("diff", "--tree", str(tmp_path / "nonexistent"), cwd=work), 2, "no such directory")
