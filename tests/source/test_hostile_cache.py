"""A release cache this user cannot write (a shared cache another user owns, or a read-only one)
is read without writing to it: a release it holds is checked out (git is told, for that one
command and that one repository, that the other owner's repository is safe); one it does not
hold is one line saying what is wrong and what to do, not "the cache is damaged"."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from conftest import HEADER, fixture_text, git, make_tree

from kvpatch.fsutil import locks


def _cache_holding(cache: Path) -> Path:
    """A cache whose v0.10.2 is complete (a git tree tagged v0.10.2 holding the fixture header)."""
    tree = make_tree(cache / "releases" / "v0.10.2", fixture_text())
    git(tree, "tag", "v0.10.2")
    (cache / "releases" / "v0.10.2.complete").write_text("git test v0.10.2\ntag -\n")
    return tree


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_mode) for p in folder.rglob("*")}


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("git") is None, reason="giving files to another user needs root")
def test_a_release_cache_another_user_owns_is_read_without_writing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _cache_holding(cache)
    for p in [cache, *cache.rglob("*")]:
        os.chown(p, 65534, 65534, follow_symlinks=False)  # nobody
        if not p.is_symlink():
            p.chmod(p.stat().st_mode & ~0o222)  # read-only too (root writes anyway: it must not)
    before = _snapshot(cache)
    work = tmp_path / "work"
    work.mkdir()
    proc = run_cli("apply", "--vllm", "v0.10.2", cwd=work, env={"KVPATCH_CACHE": str(cache)})
    assert proc.returncode == 0, proc.stderr
    assert "prefetch" in (work / ".kvpatch" / "vllm-0.10.2" / HEADER).read_text()
    assert _snapshot(cache) == before
    assert sorted(p.name for p in (work / ".kvpatch").iterdir()) == ["lock", "state.json", "vllm-0.10.2"]


def test_a_cache_that_cannot_be_written_and_lacks_the_release_says_so(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    cache = tmp_path / "cache"
    (cache / "releases").mkdir(parents=True)

    real_open = os.open

    def refused(path, *a, **k):  # the lock file cannot be made, as in a directory of another user's
        if str(path).endswith(".lock"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(locks.os, "open", refused)
    work = tmp_path / "work"
    work.mkdir()
    proc = run_cli("apply", "--vllm", "v0.10.2", cwd=work, env={"KVPATCH_CACHE": str(cache)})
    line = assert_one_line_error(proc, 1, str(cache / "releases"), "does not hold v0.10.2", "KVPATCH_CACHE")
    assert "damaged" not in line
