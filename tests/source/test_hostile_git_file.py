"""A tree whose ``.git`` is a file naming a directory elsewhere (``gitdir: /elsewhere``), or a link
to one, makes kvpatch create nothing outside the tree: its lock goes beside the header. Only
git's own record of a linked worktree (whose ``gitdir`` file points back at the tree) takes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli.cli_helpers import run_cli
from conftest import HEADER, fixture_text, git, make_tree

from kvpatch.source import workspace
from kvpatch.source.workspace import Tree


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("how", ["absolute", "relative", "link", "a repository"])
def test_a_git_file_naming_another_directory_gets_nothing_written_there(how: str, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(), commit=False)
    elsewhere = tmp_path / "elsewhere"
    if how == "a repository":  # a real git directory of another checkout
        other = make_tree(tmp_path / "other", fixture_text())
        elsewhere = other / ".git"
    else:
        elsewhere.mkdir()
    if how == "link":
        (tree / ".git").symlink_to(elsewhere)
    else:
        named = "../elsewhere" if how == "relative" else str(elsewhere)
        (tree / ".git").write_text(f"gitdir: {named}\n")
    before = _listing(elsewhere)
    work = tmp_path / "work"
    work.mkdir()
    proc = run_cli("apply", "--tree", str(tree), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert _listing(elsewhere) == before  # no lock, nothing else
    assert workspace.tree_lock_path(Tree(tree)) == tree / HEADER.rsplit("/", 1)[0] / ".kvpatch.lock"


def test_a_real_worktree_keeps_its_lock_in_its_git_directory(tmp_path: Path) -> None:
    main = make_tree(tmp_path / "vllm", fixture_text())
    git(main, "worktree", "add", "-q", str(tmp_path / "wt"))
    gitdir = Path(git(tmp_path / "wt", "rev-parse", "--absolute-git-dir").strip())
    assert workspace.tree_lock_path(Tree(tmp_path / "wt")) == gitdir / "kvpatch-lock"
