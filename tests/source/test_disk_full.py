"""A full disk (or a read-only or forbidden tree) while apply writes: one line, and the header
and the state as they were; the header is never changed without its state."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Callable

import pytest
from cli.cli_helpers import run_cli
from conftest import HEADER, STOCK, fixture_text, make_tree

pytestmark = pytest.mark.slow  # each test parses and patches the header (libclang)


def _enospc_for(monkeypatch: pytest.MonkeyPatch, where: Callable[[Path], bool], step: str) -> None:
    """ENOSPC where ``where(path)`` holds: writing the temporary file (``stage``) or renaming
    it over the target (``commit``)."""
    import kvpatch.fsutil.files as files
    from kvpatch import fsutil
    from kvpatch.source import workspace

    real_stage, real_replace = fsutil.stage, os.replace

    def stage(path, *a, **k):
        if step == "stage" and where(Path(path)):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_stage(path, *a, **k)

    def replace(src, dst, *a, **k):
        if step == "commit" and where(Path(dst)):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(fsutil, "stage", stage)
    monkeypatch.setattr(workspace, "stage", stage)
    monkeypatch.setattr(files.os, "replace", replace)


@pytest.mark.parametrize("step", ["stage", "commit"])
def test_disk_full_writing_the_state_leaves_the_header_as_it_was(step: str, tmp_path: Path, work: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    _enospc_for(monkeypatch, lambda p: p.name == "state.json", step)
    proc = run_cli("apply", "--tree", str(tree), cwd=work)
    err = proc.stderr
    assert proc.returncode == 1 and err.count("\n") == 1 and "No space left on device" in err and "Traceback" not in err
    assert err.startswith("error: kvpatch apply: ")
    assert (tree / HEADER).read_text() == fixture_text(STOCK)
    assert not (work / ".kvpatch/state.json").exists()
    assert sorted(p.name for p in (work / ".kvpatch").iterdir()) == ["lock"]
    assert sorted(p.name for p in (tree / HEADER).parent.iterdir()) == ["attention_kernels.cuh"]


def test_a_full_disk_staging_the_state_names_the_state_file(tmp_path: Path, work: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Before: a write that fails with no file name (a full tmpfs under .kvpatch/) was said as
    "... writing the output", which names nothing. After: the state file, and that the header is
    unchanged."""
    from kvpatch import fsutil
    from kvpatch.source import workspace

    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    real_stage = fsutil.stage

    def stage(path, *a, **k):
        if Path(path).name == "state.json":
            raise OSError(errno.ENOSPC, "No space left on device")  # as f.write raises it: no file name
        return real_stage(path, *a, **k)

    monkeypatch.setattr(workspace, "stage", stage)
    proc = run_cli("apply", "--tree", str(tree), cwd=work)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert str(work / ".kvpatch" / "state.json") in proc.stderr and "the header is unchanged" in proc.stderr
    assert (tree / HEADER).read_text() == fixture_text(STOCK)


@pytest.mark.parametrize("errno_", [errno.EROFS, errno.EACCES], ids=["EROFS", "EACCES"])  # ENOSPC: test_hostile_disk
def test_a_tree_that_cannot_be_written_is_one_line(errno_: int, tmp_path: Path, work: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    from kvpatch import fsutil

    real = fsutil.stage

    def stage(path, *a, **k):
        if Path(path).name == "attention_kernels.cuh":
            raise OSError(errno_, os.strerror(errno_), str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(fsutil, "stage", stage)
    proc = run_cli("apply", "--tree", str(tree), cwd=work)
    assert proc.returncode == 4 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(
        f"error: kvpatch apply: cannot write {tree / HEADER}: {os.strerror(errno_)} (the header is unchanged)"
    )
    assert (tree / HEADER).read_text() == fixture_text(STOCK) and not (work / ".kvpatch/state.json").exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_a_full_disk_under_stdout_is_said_without_a_nameless_path(tmp_path: Path) -> None:
    """Before: 'No space left on device: ? (the disk is full ...)', the '?' standing for a stream
    that has no name. After: what was being written."""
    import subprocess

    from cli.cli_helpers import KVPATCH, kvpatch_env

    with open("/dev/full", "w") as full:
        proc = subprocess.run([KVPATCH, "config"], cwd=tmp_path, env=kvpatch_env(tmp_path), stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("error: kvpatch config: No space left on device writing the output (the disk is "
                                   "full: free some space and run the command again)")  # fmt: skip
