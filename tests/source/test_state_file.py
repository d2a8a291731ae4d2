"""``.kvpatch/state.json``, the record of the last apply: a corrupt one is one line (exit 1)
naming the file and what to do for every command that needs it; apply rewrites it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from conftest import STOCK, fixture_text, make_tree


@pytest.mark.parametrize(
    "content",
    [
        b"[]",
        b'{"tree": 1, "config": {}}',
        b'{"tree": "/x", "config": []}',
        b"\xff",
        b"{",
        None,
        b'{"tree": "a\\u0000b", "version": null, "config": {}}',
    ],
    ids=["list", "tree-not-str", "config-not-dict", "not-utf8", "not-json", "directory", "tree-with-nul"],
)
def test_a_corrupt_state_file_is_one_line(content: bytes | None, tmp_path: Path) -> None:
    path = tmp_path / ".kvpatch/state.json"
    path.parent.mkdir()
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    for command in ("diff", "revert", "sites"):
        assert_one_line_error(run_cli(command, cwd=tmp_path), 1, str(path), "run 'kvpatch apply' again")


def test_apply_without_a_target_and_a_corrupt_state_says_so(tmp_path: Path) -> None:
    (tmp_path / ".kvpatch").mkdir()
    (tmp_path / ".kvpatch" / "state.json").write_text("{bad")
    assert_one_line_error(run_cli("apply", cwd=tmp_path), 1, "corrupt")


@pytest.mark.slow  # applies (libclang)
def test_apply_over_a_corrupt_state_file_rewrites_it(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    (tmp_path / ".kvpatch").mkdir()
    (tmp_path / ".kvpatch/state.json").write_text("[]")
    assert run_cli("apply", "--tree", str(tree), cwd=tmp_path).returncode == 0
    assert json.loads((tmp_path / ".kvpatch/state.json").read_text())["tree"] == str(tree)
