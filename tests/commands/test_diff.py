"""``kvpatch diff``: kvpatch's change as a patch that ``git apply`` and ``patch -p1`` take on a
pristine checkout; where it goes (stdout, ``-o FILE``, ``-o -``); what it warns about."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from conftest import HEADER, STOCK, fixture_text, git, make_tree

pytestmark = pytest.mark.slow  # each test applies first (libclang)


def test_diff_applies_to_a_pristine_clone(applied: Path, work: Path, tmp_path: Path) -> None:
    proc = run_cli("diff", cwd=work)  # the tree of the last apply here
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"diff --git a/{HEADER} b/{HEADER}\n--- a/{HEADER}\n+++ b/{HEADER}\n@@ ")
    patch_file = tmp_path / "kvpatch.patch"
    patch_file.write_text(proc.stdout)

    pristine = tmp_path / "pristine"
    git(tmp_path, "clone", "-q", str(applied), str(pristine))
    subprocess.run(["git", "apply", "--check", str(patch_file)], cwd=pristine, check=True)
    subprocess.run(["patch", "-p1", "--dry-run", "-i", str(patch_file)], cwd=pristine, check=True, capture_output=True)
    subprocess.run(["git", "apply", str(patch_file)], cwd=pristine, check=True)
    assert (pristine / HEADER).read_bytes() == (applied / HEADER).read_bytes()


def test_diff_to_a_file(applied: Path, work: Path) -> None:
    shown = run_cli("diff", "--tree", str(applied), cwd=work).stdout
    proc = run_cli("diff", "--tree", str(applied), "--output", "f.patch", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert (proc.stdout, proc.stderr.strip()) == ("", "wrote f.patch")
    assert (work / "f.patch").read_text() == shown != ""


def test_diff_of_a_stock_tree(git_tree: Path, work: Path) -> None:
    proc = run_cli("diff", "--tree", str(git_tree), cwd=work)
    assert (proc.returncode, proc.stdout, proc.stderr.strip()) == (0, "", "no changes: the header is stock")


def test_diff_output_dash_is_stdout(applied: Path, work: Path) -> None:
    shown = run_cli("diff", cwd=work).stdout
    proc = run_cli("diff", "-o", "-", cwd=work)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, shown, "")
    assert not (work / "-").exists() and shown.startswith("diff --git")


def test_diff_output_to_a_directory_is_one_line(applied: Path, work: Path) -> None:
    (work / "out").mkdir()
    assert_one_line_error(run_cli("diff", "-o", "out", cwd=work), 2, "--output", "out", "is a directory")
    assert list((work / "out").iterdir()) == []


def test_diff_output_through_a_symlink(applied: Path, work: Path, tmp_path: Path) -> None:
    real = tmp_path / "real.patch"
    real.write_text("old")
    (work / "link.patch").symlink_to(real)
    assert run_cli("diff", "-o", "link.patch", cwd=work).returncode == 0
    assert (work / "link.patch").is_symlink() and real.read_text().startswith("diff --git")


def test_diff_output_naming_the_header_is_refused(applied: Path, work: Path) -> None:
    before = (applied / HEADER).read_bytes()
    proc = run_cli("diff", "-o", str(applied / HEADER), cwd=work)
    assert_one_line_error(proc, 2, "--output")
    assert (applied / HEADER).read_bytes() == before


@pytest.mark.parametrize("brk", ["\f", "\v", "\x1c", "\x85", "\u2028", "\u2029", "\r"],
                         ids=["FF", "VT", "FS", "NEL", "LS", "PS", "CR"])  # fmt: skip
def test_the_patch_applies_with_odd_line_breaks_near_a_site(brk: str, tmp_path: Path, work: Path) -> None:
    """Characters str.splitlines breaks at but git does not: the patch split a comment there
    and added 'No newline at end of file' lines that git apply and patch rejected."""
    text = fixture_text(STOCK)
    anchor = "const int64_t physical_block_number ="  # the line above each site: the hunks' context
    assert text.count(anchor) == 2
    text = text.replace(anchor, f"{anchor} /* odd{brk}break */").replace("value loops", f"value{brk}loops", 1)
    tree = make_tree(tmp_path / "vllm", text)
    pristine = make_tree(tmp_path / "pristine", text)
    assert run_cli("apply", "--tree", str(tree), cwd=work).returncode == 0
    proc = run_cli("diff", "-o", str(tmp_path / "k.patch"), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert b"No newline" not in (tmp_path / "k.patch").read_bytes()
    git(pristine, "apply", str(tmp_path / "k.patch"))
    assert (pristine / HEADER).read_bytes() == (tree / HEADER).read_bytes()


def test_diff_warns_when_the_header_was_edited_after_apply(applied: Path, work: Path) -> None:
    header = applied / HEADER
    assert run_cli("diff", cwd=work).stderr == ""
    header.write_text(header.read_text().replace("// Iterate over the key blocks", "// my edit", 1))
    proc = run_cli("diff", cwd=work)
    assert proc.returncode == 0 and "has edits kvpatch did not make" in proc.stderr
    assert proc.stdout.startswith("diff --git")
    body = header.read_text()
    start = body.index("// kvpatch:begin")
    header.write_text(body[:start] + body[start:].replace("\n", "\n// hand\n", 2))
    assert "regions in" in run_cli("diff", cwd=work).stderr


def test_diff_output_is_checked_by_the_command_before_the_diff(applied: Path, work: Path) -> None:
    """What ``diff -o`` may not overwrite is the command's check: the header, the state."""
    from kvpatch.commands.diff import check_output
    from kvpatch.errors import UsageError

    with pytest.raises(UsageError, match="header"):
        check_output(applied / HEADER, None, work)
    with pytest.raises(UsageError):
        check_output(work / ".kvpatch" / "state.json", None, work)
    check_output(work / "ok.patch", None, work)  # an ordinary file passes
    check_output(work / "ok.patch", work / "no-tree", work)  # an unresolvable tree: the diff's own error, later
