"""Class: the header's permissions are bypassed by the atomic rename.

A header its owner made read-only (no owner write bit; root passes os.access, so the
mode is checked too), or one this user may not write, is refused with PatchError
(exit 4) and left as it is, unless the caller passes force_write=True (then the new
header keeps the old one's mode)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from conftest import STOCK, fixture_text, make_tree

from kvpatch.errors import PatchError
from kvpatch.source import workspace
from kvpatch.source.workspace import State, Tree, write_header_and_state


@pytest.fixture
def read_only(tmp_path: Path) -> Tree:
    tree = Tree(make_tree(tmp_path / "vllm", fixture_text(STOCK)))
    tree.header.chmod(0o444)
    return tree


@pytest.mark.slow  # applies (libclang)
@pytest.mark.parametrize("command", [["apply"], ["revert"]])
def test_a_read_only_header_is_refused_by_the_cli(command: list[str], read_only: Tree, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    if command == ["revert"]:  # patch it first, then make it read-only
        read_only.header.chmod(0o644)
        assert run_cli("apply", "--tree", str(read_only.root), cwd=work).returncode == 0
        read_only.header.chmod(0o444)
    before = read_only.header.read_bytes()
    proc = run_cli(*command, "--tree", str(read_only.root), cwd=work)
    assert_one_line_error(proc, 4, str(read_only.header), "read-only", "--force-write")  # apply's and revert's option
    assert read_only.header.read_bytes() == before
    assert stat.S_IMODE(read_only.header.stat().st_mode) == 0o444


def test_the_check_and_the_override(read_only: Tree, tmp_path: Path) -> None:
    from kvpatch.source.workspace import check_header_writable

    with pytest.raises(PatchError, match="read-only"):
        check_header_writable(read_only)
    check_header_writable(read_only, force_write=True)
    old = read_only.read_header()
    with pytest.raises(PatchError, match="read-only"):
        write_header_and_state(read_only, old, old + "// new\n", None, tmp_path)
    assert read_only.read_header() == old
    write_header_and_state(read_only, old, old + "// new\n", None, tmp_path, force_write=True)
    assert read_only.read_header() == old + "// new\n"
    assert stat.S_IMODE(read_only.header.stat().st_mode) == 0o444  # its permissions kept


def test_a_header_this_user_may_not_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user's 0644 header (simulated: os.access says no) in a writable directory."""
    tree = Tree(make_tree(tmp_path / "vllm", fixture_text(STOCK)))
    real = os.access
    monkeypatch.setattr(
        workspace.os,
        "access",
        lambda p, mode, **k: False if Path(p) == tree.header and mode == os.W_OK else real(p, mode, **k),
    )
    old = tree.read_header()
    state = State(tree=str(tree.root), version=None, config={})
    with pytest.raises(PatchError, match="not writable"):
        write_header_and_state(tree, old, old + "// new\n", state, tmp_path)
    assert tree.read_header() == old and not State.path(tmp_path).exists()


def test_an_unchanged_read_only_header_needs_no_write(read_only: Tree, tmp_path: Path) -> None:
    """'already applied' writes only the state: the header's permissions do not matter."""
    old = read_only.read_header()
    state = State(tree=str(read_only.root), version=None, config={})
    write_header_and_state(read_only, old, old, state, tmp_path)
    assert State.path(tmp_path).is_file()


def test_a_header_on_a_read_only_mount_is_said_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not 'not writable by this user (mode 0600)' with a --force-write that cannot help either."""
    from types import SimpleNamespace

    tree = Tree(make_tree(tmp_path / "vllm", fixture_text(STOCK)))
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    monkeypatch.setattr(os, "statvfs", lambda p: SimpleNamespace(f_flag=os.ST_RDONLY))
    with pytest.raises(PatchError, match="is on a read-only file system") as e:
        workspace.check_header_writable(tree)
    assert "--force-write" not in str(e.value)
    monkeypatch.setattr(os, "statvfs", lambda p: SimpleNamespace(f_flag=0))
    with pytest.raises(PatchError, match="not writable by this user"):
        workspace.check_header_writable(tree)
