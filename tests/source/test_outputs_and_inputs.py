"""Class: an output that names an input (or kvpatch's own files) destroys it.

``fsutil.check_outputs(..., inputs=..., protected=...)`` refuses, before anything is
written, an output that is an input or a protected path however it is spelled: through
symlinks, ``..``, a hard link, a ``/dev/fd/N`` of it; and anything inside a protected
directory (``.kvpatch/``). ``workspace.protected_paths`` names a workspace's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import HEADER, fixture_text, make_tree

from kvpatch.errors import UsageError
from kvpatch.fsutil import check_outputs, same_file
from kvpatch.source.cache import cache_folders
from kvpatch.source.workspace import STATE_DIR, Tree, protected_paths


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "runs" / "tune.json"
    path.parent.mkdir()
    path.write_text('{"measurements": "hours of them"}\n')
    return path


def _refused(needle: str, **kw) -> str:
    with pytest.raises(UsageError) as info:
        check_outputs(**kw)
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    assert needle in str(info.value), str(info.value)
    return str(info.value)


def _spellings(saved: Path, tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "link.json").symlink_to(saved)
    (tmp_path / "runs-link").symlink_to(saved.parent)
    os.link(saved, tmp_path / "hard.json")
    (tmp_path / "other").mkdir()
    return {"same": saved, "symlink": tmp_path / "link.json", "dotdot": tmp_path / "other" / ".." / "runs" / "tune.json",
            "symlinked-dir": tmp_path / "runs-link" / "tune.json", "hard-link": tmp_path / "hard.json",
            "relative": Path(os.path.relpath(saved))}  # fmt: skip


@pytest.mark.parametrize("how", ["same", "symlink", "dotdot", "symlinked-dir", "hard-link", "relative"])
def test_an_output_naming_an_input_is_refused(how: str, saved: Path, tmp_path: Path) -> None:
    output = _spellings(saved, tmp_path)[how]
    _refused("--from", output=output, json=None, inputs={"--from": saved})
    _refused("an input", output=output, inputs=[saved])
    assert saved.read_text() == '{"measurements": "hours of them"}\n'


def test_an_output_as_an_open_descriptor_of_an_input_is_refused(saved: Path) -> None:
    fd = os.open(saved, os.O_RDWR)  # writable: refused for naming the input, not for its mode
    try:
        _refused("--from", output=f"/dev/fd/{fd}", inputs={"--from": saved})
    finally:
        os.close(fd)


def test_other_outputs_pass(saved: Path, tmp_path: Path) -> None:
    check_outputs(output=tmp_path / "new.toml", json=tmp_path / "new.json", inputs={"--from": saved},
                  protected={"kvpatch's state directory": tmp_path / STATE_DIR})  # fmt: skip
    check_outputs(output=None, inputs=None, protected=None)
    assert not same_file(saved, tmp_path / "new.json")


def test_two_outputs_through_a_hard_link_are_one_file(saved: Path, tmp_path: Path) -> None:
    os.link(saved, tmp_path / "twin.json")
    _refused("name the same file", output=saved, json=tmp_path / "twin.json")


@pytest.fixture
def workspace(tmp_path: Path) -> tuple[Path, Tree]:
    cwd = tmp_path / "work"
    (cwd / STATE_DIR).mkdir(parents=True)
    (cwd / STATE_DIR / "state.json").write_text("{}\n")
    tree = Tree(make_tree(tmp_path / "vllm", fixture_text()))
    return cwd, tree


def test_protected_paths_name_the_header_and_the_state(workspace: tuple[Path, Tree]) -> None:
    cwd, tree = workspace
    paths = protected_paths(cwd, tree)
    assert tree.header in paths.values() and cwd / STATE_DIR in paths.values()
    assert all(isinstance(label, str) and label for label in paths)


@pytest.mark.parametrize(
    "target",
    [
        "header",
        "header-via-symlinked-tree",
        "header-hard-link",
        "state",
        "lock",
        "inside-state-dir",
        "state-dir-via-symlink",
        "state-via-dotdot",
    ],
)
def test_an_output_onto_the_workspace_is_refused(target: str, workspace: tuple[Path, Tree], tmp_path: Path) -> None:
    cwd, tree = workspace
    (tmp_path / "tree-link").symlink_to(tree.root)
    (tmp_path / "state-link").symlink_to(cwd / STATE_DIR)
    os.link(tree.header, tmp_path / "header-twin.cuh")
    output = {
        "header": tree.header,
        "header-via-symlinked-tree": tmp_path / "tree-link" / HEADER,
        "header-hard-link": tmp_path / "header-twin.cuh",
        "state": cwd / STATE_DIR / "state.json",
        "lock": cwd / STATE_DIR / "lock",
        "inside-state-dir": cwd / STATE_DIR / "my.diff",
        "state-dir-via-symlink": tmp_path / "state-link" / "x.diff",
        "state-via-dotdot": cwd / "sub" / ".." / STATE_DIR / "state.json",
    }[target]
    before = tree.header.read_bytes(), (cwd / STATE_DIR / "state.json").read_bytes()
    _refused(str(output), output=output, protected=protected_paths(cwd, tree))
    assert (tree.header.read_bytes(), (cwd / STATE_DIR / "state.json").read_bytes()) == before
    assert sorted(p.name for p in (cwd / STATE_DIR).iterdir()) == ["state.json"]


def test_protected_paths_without_a_tree_come_from_the_state(workspace: tuple[Path, Tree]) -> None:
    import json

    cwd, tree = workspace
    (cwd / STATE_DIR / "state.json").write_text(json.dumps({"tree": str(tree.root), "version": None, "config": {}}))
    assert tree.header in protected_paths(cwd).values()
    (cwd / STATE_DIR / "state.json").write_text("not json")  # a corrupt state names no tree, and is no error here
    assert list(protected_paths(cwd).values()) == [cwd / STATE_DIR, *cache_folders().values()]
