"""Class: an edit saved to the header while apply (or revert) runs is lost.

The header is compared with what the command read just before the staged file is
renamed over it; a change (bytes, or with the read's snapshot, inode and mtime) is a
PatchError (exit 4) and the user's text stays. The test edits at a deterministic point:
right after the header's replacement is staged, before it is renamed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import HEADER, STOCK, fixture_text, golden_text, make_tree

from kvpatch import fsutil
from kvpatch.commands import apply as A
from kvpatch.commands import revert as R
from kvpatch.errors import PatchError
from kvpatch.source import workspace
from kvpatch.source.workspace import STATE_DIR, State, Tree, write_header_and_state

USER_LINE = "// a line the user saved while kvpatch ran\n"


def _edit_when_staged(monkeypatch: pytest.MonkeyPatch, header: Path, edit=None) -> list[Path]:
    """Make every staging of the header also edit the real header (as an editor saving
    at that moment would); returns the list of staged paths seen."""
    real = fsutil.stage
    seen: list[Path] = []

    def stage(path, data, *a, **k):
        staged = real(path, data, *a, **k)
        if Path(path).name == header.name:
            seen.append(Path(path))
            (edit or (lambda: header.open("a").write(USER_LINE)))()
        return staged

    monkeypatch.setattr(fsutil, "stage", stage)
    monkeypatch.setattr(workspace, "stage", stage)
    return seen


def _no_temp_files(*folders: Path) -> None:
    for folder in folders:
        assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")], folder


def test_an_edit_during_apply_is_kept_and_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    header = tree / HEADER
    cwd = tmp_path / "work"
    cwd.mkdir()
    seen = _edit_when_staged(monkeypatch, header)
    with pytest.raises(PatchError, match="changed while") as info:
        A.run(A.ApplyOptions(tree=tree, cwd=cwd))
    assert seen, "the header was never staged"
    assert info.value.exit_code == 4 and "\n" not in str(info.value)
    assert header.read_text() == fixture_text(STOCK) + USER_LINE
    assert not State.path(cwd).exists()
    _no_temp_files(header.parent, cwd / STATE_DIR)


def test_an_edit_during_revert_is_kept_and_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    header = tree / HEADER
    cwd = tmp_path / "work"
    cwd.mkdir()
    A.run(A.ApplyOptions(tree=tree, cwd=cwd))
    state = State.path(cwd).read_text()
    _edit_when_staged(monkeypatch, header)
    with pytest.raises(PatchError, match="changed while"):
        R.run(R.RevertOptions(tree=tree, cwd=cwd))
    assert header.read_text() == golden_text("default") + USER_LINE
    assert State.path(cwd).read_text() == state


def test_a_replaced_file_with_the_same_bytes_is_refused_given_the_snapshot(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """An editor that saves by writing a new file and renaming it: the same bytes, another
    inode. With the snapshot of the read, that counts as a change too."""
    tree = Tree(make_tree(tmp_path / "vllm", fixture_text(STOCK)))
    cwd = tmp_path / "work"
    cwd.mkdir()
    old, seen = tree.read_header_snapshot()

    def save_as_new_file() -> None:
        copy = tree.header.with_name("copy")
        copy.write_bytes(tree.header.read_bytes())
        os.replace(copy, tree.header)

    _edit_when_staged(monkeypatch, tree.header, save_as_new_file)
    with pytest.raises(PatchError, match="changed while"):
        write_header_and_state(tree, old, old + "// patched\n", None, cwd, seen=seen)
    assert tree.header.read_text() == fixture_text(STOCK)


def test_without_an_edit_the_write_goes_through(tmp_path: Path) -> None:
    tree = Tree(make_tree(tmp_path / "vllm", fixture_text(STOCK)))
    cwd = tmp_path / "work"
    cwd.mkdir()
    old, seen = tree.read_header_snapshot()
    state = State(tree=str(tree.root), version=None, config={}, marker=None, stock_sha256=None)
    write_header_and_state(tree, old, old + "// patched\n", state, cwd, seen=seen)
    assert tree.header.read_text() == fixture_text(STOCK) + "// patched\n"
    assert json.loads(State.path(cwd).read_text())["tree"] == str(tree.root)
