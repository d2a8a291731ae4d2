"""The local-edit check: edits kvpatch did not make are refused (exit 4) unless ``--force``.
In a git checkout the stock text is compared with what git has committed (a committed patch
and an autocrlf checkout are no edit); without git the check says it is off, then compares
with the stock text's hash recorded at the first apply, or with a release's known revision."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from conftest import HEADER, STOCK, fixture_text, git, make_tree


@pytest.mark.slow
def test_without_git_the_check_is_off_and_says_so_then_uses_the_recorded_hash(tmp_path: Path, work: Path) -> None:
    tree = make_tree(tmp_path / "plain", fixture_text(STOCK), commit=False)
    proc = run_cli("apply", "--tree", str(tree), cwd=work)
    assert proc.returncode == 0, proc.stderr
    notes = proc.stderr.strip().splitlines()
    assert len(notes) == 1 and notes[0].startswith("note: local-edit check off: ") and "not a git checkout" in notes[0]
    # Later applies compare with the sha256 of the stock text recorded at the first.
    again = run_cli("apply", "--tree", str(tree), "--caches", "k", cwd=work)
    assert (again.returncode, again.stderr) == (0, "")
    header = tree / HEADER
    edited = header.read_text().replace("  float acc = 0.f;", "  float acc = 1.f;")
    header.write_text(edited)
    assert_one_line_error(run_cli("apply", "--tree", str(tree), cwd=work), 4, "changed since the last apply", "--force")
    assert header.read_text() == edited


@pytest.mark.slow
def test_dubious_ownership_is_not_skipped_silently(tmp_path: Path, work: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the tree to another user")
    tree = make_tree(tmp_path / "theirs", fixture_text(STOCK))
    subprocess.run(["chown", "-R", "12345:12345", str(tree)], check=True)
    proc = run_cli("apply", "--tree", str(tree), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert "dubious ownership" in proc.stderr and "local-edit check off" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_recorded_release_header_passes_without_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpatch.source import releases, workspace

    stock = fixture_text(STOCK)
    tree = make_tree(tmp_path / "plain", stock, commit=False)
    notes: list[str] = []
    check = functools.partial(workspace.check_no_local_edits, unpatch=lambda t: t, note=notes.append)
    check(workspace.Tree(tree), stock)
    assert len(notes) == 1  # unknown text, no git: the check is off, and says so
    prefix = hashlib.md5(stock.encode()).hexdigest()[:8]
    monkeypatch.setattr(releases, "REVISIONS", (("9.9.9", "9.9.9", prefix),))
    notes.clear()
    check(workspace.Tree(tree), stock)
    check(workspace.Tree(tree), stock.replace("\n", "\r\n"))
    assert notes == []


@pytest.mark.slow
def test_a_committed_patched_header_is_not_a_local_edit(applied: Path, work: Path) -> None:
    git(applied, "commit", "-qam", "patched with kvpatch")
    again = run_cli("apply", "--tree", str(applied), cwd=work)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("already applied")
    other = run_cli("apply", "--tree", str(applied), "--caches", "v", cwd=work)
    assert other.returncode == 0, other.stderr
    (applied / HEADER).write_text((applied / HEADER).read_text().replace("  float acc = 0.f;", "  float acc = 1.f;"))
    assert_one_line_error(run_cli("apply", "--tree", str(applied), cwd=work), 4, "local edits")


@pytest.mark.slow
def test_autocrlf_checkout_is_not_a_local_edit(tmp_path: Path, work: Path) -> None:
    origin = make_tree(tmp_path / "origin", fixture_text(STOCK))
    clone = tmp_path / "crlf"
    git(tmp_path, "-c", "core.autocrlf=true", "clone", "-q", str(origin), str(clone))
    git(clone, "config", "core.autocrlf", "true")
    before = (clone / HEADER).read_bytes()
    assert b"\r\n" in before
    proc = run_cli("apply", "--tree", str(clone), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert b"\r\n" in (clone / HEADER).read_bytes() and b"kvpatch:begin" in (clone / HEADER).read_bytes()
    assert run_cli("revert", cwd=work).returncode == 0
    assert (clone / HEADER).read_bytes() == before
