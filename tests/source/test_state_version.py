"""Class: a non-canonical version in state.json is a traceback.

State.load accepts a version only as normalize_version returns it (or null); anything
else is the documented one-line corrupt-state error, exit 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli

from kvpatch.errors import KvpatchError
from kvpatch.source.workspace import STATE_DIR, State

BAD = ["v0.10.2", "abc", "", "0.10.2\n", " 0.10.2", "0.10.02", "0.10.2.post01", "0.10.2-post1", "V0.10.2",
       "0." + "1" * 5000, 10.2, 0, True, [], {"release": "0.10.2"}]  # fmt: skip


def _write_state(work: Path, version) -> Path:
    path = work / STATE_DIR / "state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tree = work / STATE_DIR / f"vllm-{version}"  # kvpatch's own checkout, removed: apply checks it out again
    path.write_text(json.dumps({"tree": str(tree)[:200], "version": version, "config": {}}))
    return path


@pytest.mark.parametrize("version", BAD, ids=lambda v: repr(v)[:20])
def test_a_non_canonical_version_is_the_corrupt_state_error(version, tmp_path: Path) -> None:
    _write_state(tmp_path, version)
    with pytest.raises(KvpatchError, match="corrupt") as info:
        State.load(tmp_path)
    assert info.value.exit_code == 1 and "delete it and run 'kvpatch apply' again" in str(info.value)


@pytest.mark.parametrize("version", ["v0.10.2", "abc", "0.10.2\n", ""], ids=repr)
def test_every_command_says_one_line(version: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    path = _write_state(work, version)
    never = {"PIP_INDEX_URL": "http://127.0.0.1:9/never-asked"}  # no download, whatever happens
    for command in (["apply"], ["diff"], ["revert"], ["sites"], ["build"]):
        assert_one_line_error(
            run_cli(*command, cwd=work, env=never), 1, str(path), "delete it and run 'kvpatch apply' again"
        )


@pytest.mark.parametrize("version", [None, "0.10.2", "0.10.1.1", "0.6.6.post1", "0.20"])
def test_canonical_versions_and_null_load(version, tmp_path: Path) -> None:
    _write_state(tmp_path, version)
    assert State.load(tmp_path).version == version
