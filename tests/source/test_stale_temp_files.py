"""Class: temporary files a killed apply left (``.<name>.<8 random>.tmp``, beside the
header and in ``.kvpatch/``) are never cleaned.

The next write removes them: only names of kvpatch's exact pattern, only regular files,
only when older than fsutil.STALE_AFTER seconds (a concurrent writer's are young), under
the tree's lock. Removing is idempotent."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli.cli_helpers import kvpatch_env, run_cli
from conftest import HEADER, STOCK, fixture_text, golden_text, make_tree

from kvpatch import fsutil
from kvpatch.source.workspace import STATE_DIR

HOUR_AGO = time.time() - 3600


def _touch(path: Path, *, old: bool = True) -> Path:
    path.write_text("partial")
    if old:
        os.utime(path, (HOUR_AGO, HOUR_AGO))
    return path


def _kill_during_apply(tree: Path, work: Path) -> None:
    """An apply killed (os._exit, like SIGKILL: no cleanup) just before the header's rename."""
    code = (
        "import os, sys\n"
        "real = os.replace\n"
        "def replace(src, dst, *a, **k):\n"
        "    if str(dst).endswith('attention_kernels.cuh'):\n"
        "        os._exit(143)\n"
        "    return real(src, dst, *a, **k)\n"
        "os.replace = replace\n"
        "from kvpatch import cli\n"
        f"sys.argv = ['kvpatch', 'apply', '--tree', {str(tree)!r}]\n"
        "cli.run()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=work, env=kvpatch_env(work), capture_output=True, text=True)
    assert proc.returncode == 143, proc.stderr


@pytest.mark.slow  # a killed process, then an apply
def test_a_killed_apply_leaves_temp_files_the_next_one_removes(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    work = tmp_path / "work"
    work.mkdir()
    _kill_during_apply(tree, work)
    beside = [p for p in (tree / HEADER).parent.iterdir() if p.name.endswith(".tmp")]
    state = [p for p in (work / STATE_DIR).iterdir() if p.name.endswith(".tmp")]
    assert len(beside) == 1 and len(state) == 1, (beside, state)  # what the kill left
    for path in beside + state:
        os.utime(path, (HOUR_AGO, HOUR_AGO))
    proc = run_cli("apply", "--tree", str(tree), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert (tree / HEADER).read_text() == golden_text("default")
    assert sorted(p.name for p in (tree / HEADER).parent.iterdir()) == ["attention_kernels.cuh"]
    assert sorted(p.name for p in (work / STATE_DIR).iterdir()) == ["lock", "state.json"]


def test_only_kvpatchs_own_old_temp_files_are_removed(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    work = tmp_path / "work"
    (work / STATE_DIR).mkdir(parents=True)
    folder = (tree / HEADER).parent
    stale = [
        _touch(folder / ".attention_kernels.cuh.ab12cd_4.tmp"),
        _touch(work / STATE_DIR / ".state.json.zz9_yy8x.tmp"),
    ]
    kept = [
        _touch(folder / ".attention_kernels.cuh.k3j4h5g6.tmp", old=False),  # young: maybe a writer's, now
        _touch(folder / ".attention_kernels.cuh.tmp"),  # not the pattern
        _touch(folder / ".attention_kernels.cuh.ABCDEFGH.tmp"),  # mkstemp never writes capitals
        _touch(folder / ".attention_kernels.cuh.abc.tmp"),
        _touch(folder / "attention_kernels.cuh.orig"),
        _touch(folder / ".other.cuh.ab12cd34.tmp"),  # another file's, beside the header
        _touch(folder / ".attention_kernels.cuh.ab12cd34.tmp.bak"),
    ]
    link = folder / ".attention_kernels.cuh.linkxxxx.tmp"
    link.symlink_to(tree / "README-missing")
    (folder / ".attention_kernels.cuh.dirxxxxx.tmp").mkdir()
    proc = run_cli("apply", "--tree", str(tree), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert not any(p.exists() for p in stale)
    assert (
        all(p.exists() for p in kept)
        and link.is_symlink()
        and (folder / ".attention_kernels.cuh.dirxxxxx.tmp").is_dir()
    )


def test_remove_stale_temps_is_idempotent_and_exact(tmp_path: Path) -> None:
    _touch(tmp_path / ".a.txt.abcdefgh.tmp")
    _touch(tmp_path / ".b.txt.abcdefgh.tmp")
    assert [p.name for p in fsutil.remove_stale_temps(tmp_path, ["a.txt"])] == [".a.txt.abcdefgh.tmp"]
    assert fsutil.remove_stale_temps(tmp_path, ["a.txt"]) == []
    assert [p.name for p in fsutil.remove_stale_temps(tmp_path)] == [".b.txt.abcdefgh.tmp"]
    assert fsutil.remove_stale_temps(tmp_path / "missing") == []


def test_the_pattern_is_what_stage_writes(tmp_path: Path) -> None:
    staged = fsutil.stage(tmp_path / "state.json", "{}")
    try:
        assert fsutil.is_temp_name(staged.tmp.name, "state.json")
        assert fsutil.remove_stale_temps(tmp_path, older_than=3600) == []  # a live one is young
    finally:
        staged.discard()
