"""``kvpatch revert``: the header stock again, byte for byte (line endings and all), and the
work tree clean; nothing to do on a stock header."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli.cli_helpers import run_cli
from conftest import HEADER, STOCK, fixture_text, git, make_tree

pytestmark = pytest.mark.slow  # each test applies first (libclang)


def committed(tree: Path) -> bytes:
    return git(tree, "show", f"HEAD:{HEADER}", text=False)


def test_revert_restores_the_committed_bytes(git_tree: Path, work: Path) -> None:
    header = git_tree / HEADER
    assert run_cli("apply", "--tree", str(git_tree), "--preset", "paper", cwd=work).returncode == 0
    assert header.read_bytes() != committed(git_tree)
    proc = run_cli("revert", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"reverted {header}"
    assert header.read_bytes() == committed(git_tree)
    again = run_cli("revert", "--tree", str(git_tree), cwd=work)
    assert (again.returncode, again.stdout.strip()) == (0, f"nothing to revert: {header} is stock")
    assert git(git_tree, "status", "--porcelain") == ""


def test_revert_restores_a_crlf_header(tmp_path: Path, work: Path) -> None:
    tree = make_tree(tmp_path / "crlf", fixture_text(STOCK).replace("\n", "\r\n"))
    before = (tree / HEADER).read_bytes()
    assert run_cli("apply", "--tree", str(tree), cwd=work).returncode == 0
    assert b"kvpatch:begin" in (tree / HEADER).read_bytes()
    assert run_cli("revert", cwd=work).returncode == 0
    assert (tree / HEADER).read_bytes() == before


def test_a_header_without_regions_is_called_stock_only_where_it_is(git_tree: Path, work: Path) -> None:
    """Before: an emptied header (or one with any edit and no kvpatch regions) was "stock" to
    revert and diff. After: "stock" only where it matches the committed header; otherwise what is
    true, that it carries none of kvpatch's regions, and that it has edits kvpatch did not make."""
    header = git_tree / HEADER
    header.write_text("")
    proc = run_cli("revert", "--tree", str(git_tree), cwd=work)
    assert (proc.returncode, proc.stdout.strip()) == (
        0, f"nothing to revert: {header} carries none of kvpatch's regions, but has edits kvpatch did not make")  # fmt: skip
    proc = run_cli("diff", "--tree", str(git_tree), cwd=work)
    assert (proc.returncode, proc.stdout, proc.stderr.strip()) == (
        0, "", "no changes: the header carries none of kvpatch's regions, but has edits kvpatch did not make")  # fmt: skip
    plain = make_tree(git_tree.parent / "plain", "// no git and no recorded release\n", commit=False)
    proc = run_cli("revert", "--tree", str(plain), cwd=work)
    assert proc.returncode == 0 and "(whether it is the release's could not be checked)" in proc.stdout
