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


@pytest.mark.parametrize("config", [{"inherit_rules": "yes"}, {"zzz": 1}, {"rules": 5}])
def test_a_state_whose_configuration_no_option_could_give_is_the_corrupt_state_error(config: dict,
                                                                                      tmp_path: Path) -> None:  # fmt: skip
    """Before: where the header's markers name no configuration, a state.json edited into a
    configuration no option gives was said as an option the user had not given ("invalid
    inherit-rules 'yes'", exit 2). After: the corrupt state's error, naming the file (exit 1)."""
    from kvpatch.commands.tree import tree_config
    from kvpatch.errors import KvpatchError, UsageError
    from kvpatch.progress import QUIET
    from kvpatch.source.workspace import State, Tree

    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    State(tree=str(tree), version="0.10.2", config=config, marker=None).save(tmp_path)
    path = tmp_path / ".kvpatch" / "state.json"
    with pytest.raises(KvpatchError, match=rf"^corrupt {path} \(its configuration: .*\); delete it") as e:
        tree_config(Tree(tree), tmp_path, QUIET)
    assert not isinstance(e.value, UsageError)
