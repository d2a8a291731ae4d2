"""Class: where the cache lives must not matter.

A relative KVPATCH_CACHE is taken relative to the directory kvpatch was started in, once,
as an absolute path (another module hands it to tools running elsewhere); a cache on
another file system than the working directory is checked out by copying, since git
cannot hardlink across devices (nor where hardlinks are not allowed)."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from conftest import HEADER
from source_helpers import quiet, sdist_index

from kvpatch.source import workspace
from kvpatch.source.fetch import cache_root, fetch_release
from kvpatch.source.workspace import checkout


@pytest.fixture
def other_device(tmp_path: Path) -> Iterator[Path]:
    """A directory on another file system than tmp_path (/dev/shm), removed afterwards."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no writable /dev/shm on another file system than the tmp dir")
    path = shm / f"kvpatch-test-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_relative_cache_is_absolute_from_the_start_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVPATCH_CACHE", "rel/cache")
    assert cache_root() == tmp_path / "rel" / "cache"
    assert cache_root().is_absolute()
    monkeypatch.setenv("KVPATCH_CACHE", "~/kv-cache")
    assert cache_root() == Path.home() / "kv-cache"


def test_a_relative_cache_still_works_after_a_chdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", sdist_index(tmp_path / "index").as_uri())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVPATCH_CACHE", "cache")
    tree = fetch_release("0.10.2", remote=str(tmp_path / "none.git"), console=quiet())
    assert tree.is_absolute() and tree == tmp_path / "cache" / "releases" / "v0.10.2"
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    assert (tree / HEADER).is_file()
    assert fetch_release("0.10.2", remote=str(tmp_path / "none.git"), cache=Path("../cache"), console=quiet()) == \
        other / ".." / "cache" / "releases" / "v0.10.2"  # fmt: skip


def test_a_cache_on_another_file_system_is_checked_out(other_device: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("PIP_INDEX_URL", sdist_index(tmp_path / "index").as_uri())
    release = fetch_release("0.10.2", remote=str(tmp_path / "none.git"), cache=other_device, console=quiet())
    dest = tmp_path / "work" / ".kvpatch" / "vllm-0.10.2"
    checkout(release, dest, "v0.10.2")
    assert (dest / HEADER).read_bytes() == (release / HEADER).read_bytes()
    assert not (tmp_path / "work" / ".kvpatch" / "vllm-0.10.2.partial").exists()


def test_a_failed_hardlink_falls_back_to_a_copy(other_device: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Hardlinks can fail on one device too (fs.protected_hardlinks, a cache of another
    user's): told the devices are the same, the checkout still succeeds."""
    monkeypatch.setenv("PIP_INDEX_URL", sdist_index(tmp_path / "index").as_uri())
    release = fetch_release("0.10.2", remote=str(tmp_path / "none.git"), cache=other_device, console=quiet())
    monkeypatch.setattr(workspace, "_same_device", lambda a, b: True, raising=False)
    dest = tmp_path / "work" / ".kvpatch" / "vllm-0.10.2"
    checkout(release, dest, "v0.10.2")
    assert (dest / HEADER).is_file()


@pytest.mark.slow  # a release fetched (from a local index) and applied
def test_apply_and_diff_with_a_relative_cache_on_another_device(other_device: Path, tmp_path: Path) -> None:
    from cli.cli_helpers import run_cli
    from conftest import STOCK, fixture_text
    from source_helpers import sdist_index as index

    work = other_device / "work"  # the working directory on /dev/shm, the cache relative to it
    work.mkdir()
    env = {
        "KVPATCH_CACHE": "../rel-cache",
        "PIP_INDEX_URL": index(tmp_path / "index", extra={HEADER: fixture_text(STOCK)}).as_uri(),
    }
    proc = run_cli("apply", "--vllm", "0.10.2", "--remote", str(tmp_path / "none.git"), cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (other_device / "rel-cache" / "releases" / "v0.10.2.complete").is_file()
    proc = run_cli("diff", cwd=work, env=env)
    assert proc.returncode == 0 and proc.stdout.startswith("diff --git"), proc.stderr


def test_a_cache_under_a_home_that_does_not_exist_is_one_line(tmp_path, monkeypatch):
    from kvpatch.errors import UsageError
    from kvpatch.source.fetch import cache_root

    monkeypatch.setenv("KVPATCH_CACHE", "~no-such-user-kvpatch/cache")
    with pytest.raises(UsageError, match=r"KVPATCH_CACHE=~no-such-user-kvpatch/cache: its '~' names no home"):
        cache_root()
