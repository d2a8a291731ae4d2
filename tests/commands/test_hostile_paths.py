"""A working directory or a ``--tree`` whose path is not UTF-8 (a directory named with byte 0xff):
never a traceback. A tree there is one line, exit 2, before any work (libclang takes UTF-8 paths
only); a UTF-8 tree patched from such a working directory works."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, kvpatch, run_cli
from conftest import HEADER, fixture_text, make_tree


@pytest.fixture
def odd(tmp_path: Path) -> Path:
    """A directory whose name is the byte 0xff."""
    path = Path(os.fsdecode(os.fsencode(tmp_path) + b"/\xff"))
    path.mkdir()
    return path


@pytest.mark.parametrize("args, where", [
    (["sites", "--tree", "{tree}"], "--tree"),
    (["apply", "--tree", "{tree}"], "--tree"),
    (["build", "--tree", "{tree}"], "--tree"),
    (["sites", "--vllm", "v0.10.2"], "the working directory"),
    (["apply", "--vllm", "v0.10.2"], "the working directory"),
])  # fmt: skip
def test_a_path_that_is_not_utf8_is_one_line_exit_2_before_any_work(args: list[str], where: str, odd: Path) -> None:
    tree = make_tree(odd / "vllm", fixture_text(), commit=False)
    before = (tree / HEADER).read_bytes()
    proc = run_cli(*[a.format(tree=tree) for a in args], cwd=odd)
    assert_one_line_error(proc, 2, where, "\\udcff", "is not a UTF-8 path")
    assert (tree / HEADER).read_bytes() == before and not (odd / "no-cache").exists()


@pytest.mark.slow  # a new process: its real stdout and stderr
def test_a_working_directory_that_is_not_utf8_patches_a_utf8_tree(odd: Path, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text())
    for args in (["apply", "--tree", str(tree)], ["sites"], ["diff", "-o", os.path.join(odd, "x.patch")], ["revert"]):
        proc = kvpatch(*args, cwd=odd)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
    assert (odd / "x.patch").read_text().startswith("diff --git")
    assert (tree / HEADER).read_text() == fixture_text()


def test_a_non_ascii_path_under_a_locale_that_cannot_spell_it_is_one_line(tmp_path: Path) -> None:
    """Before: with ``LC_ALL=C PYTHONUTF8=0`` (file names in ASCII), a workspace whose recorded tree
    is ``.../é/...`` gave an 84-line UnicodeEncodeError traceback in every command, and ``apply``
    in a fresh ``é`` folder was refused as "not a UTF-8 path" after creating ``.kvpatch/``. After:
    one line, exit 2, naming the locale and the fix; nothing created."""
    import json

    work = tmp_path / "é"
    (work / ".kvpatch").mkdir(parents=True)
    state = {"tree": str(work / ".kvpatch" / "vllm-0.10.2"), "version": "0.10.2", "config": {}, "marker": None}
    (work / ".kvpatch" / "state.json").write_text(json.dumps(state), encoding="utf-8")
    fresh = tmp_path / "é2"
    fresh.mkdir()
    for args, where in ((["diff"], work), (["sites"], work), (["apply", "--vllm", "0.10.2"], fresh)):
        proc = kvpatch(*args, cwd=where, env={"LC_ALL": "C", "PYTHONUTF8": "0", "LANG": "C"})
        assert_one_line_error(proc, 2, "is not ASCII, and this process names files in", "PYTHONUTF8=1")
    assert list(fresh.iterdir()) == []
