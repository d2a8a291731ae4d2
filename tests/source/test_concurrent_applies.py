"""Applies started at once in one directory: each waits for the workspace lock, none fails,
and the header and ``.kvpatch/state.json`` end up agreeing (whichever came last)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from cli.cli_helpers import KVPATCH, kvpatch_env
from conftest import HEADER, STOCK, fixture_text, golden_text, make_tree
from source_helpers import sdist_index

pytestmark = pytest.mark.slow  # several kvpatch processes at once


def _parallel(argss: list[list[str]], cwd: Path, env: dict[str, str]) -> list[subprocess.CompletedProcess]:
    procs = [subprocess.Popen([KVPATCH, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for args in argss]  # fmt: skip
    done = []
    for args, p in zip(argss, procs):
        out, err = p.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(args, p.returncode, out, err))
    return done


def test_three_first_applies_at_once_all_succeed(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    index = sdist_index(tmp_path / "index", extra={HEADER: fixture_text(STOCK)})
    env = kvpatch_env(work, KVPATCH_CACHE=str(tmp_path / "cache"), PIP_INDEX_URL=index.as_uri())
    remote = ["--remote", str(tmp_path / "no-remote.git")]
    results = _parallel([["apply", "--vllm", "0.10.2", *remote]] * 3, work, env)
    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr for r in results]
    header = work / ".kvpatch/vllm-0.10.2" / HEADER
    assert header.read_text() == golden_text("default")
    assert not list(work.glob(".kvpatch/*.partial"))


def test_parallel_applies_with_different_configs_leave_header_and_state_agreeing(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    results = _parallel(
        [["apply", "--tree", str(tree), "--lookahead", str(n)] for n in (1, 2, 3, 4)], work, kvpatch_env(work)
    )
    assert [r.returncode for r in results] == [0, 0, 0, 0], [r.stderr for r in results]
    state = json.loads((work / ".kvpatch/state.json").read_text())
    assert f"// kvpatch:begin key {state['marker']}\n" in (tree / HEADER).read_text()
    assert f"lookahead={state['config']['lookahead']} " in state["marker"]
