"""Class: one bad source poisons the cache.

"vX has no header" is remembered (``releases/vX.noheader``) only from a canonical
source: kvpatch's default git remote, or the package index pip is configured for, and
then only for that index (another index asks again). A wrong --remote is never
remembered. The refusal names the record's file, so a user can delete it."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import HEADER
from source_helpers import quiet, remote_repo, sdist_index

from kvpatch.errors import FetchError
from kvpatch.source import fetch
from kvpatch.source.fetch import fetch_release


def _headerless_index(root: Path, version: str = "0.10.2") -> Path:
    from source_helpers import index_with, member, tar_bytes

    return index_with(root, tar_bytes([member(f"vllm-{version}/PKG-INFO", b"Name: vllm\n")]), version)


def _no_io(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a, **k):
        raise AssertionError("no fetch expected")

    monkeypatch.setattr(fetch, "_obtain", boom)


def test_a_wrong_remote_is_not_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fork = remote_repo(tmp_path, header=False)  # tags v0.10.2, but holds no header
    cache = tmp_path / "cache"
    monkeypatch.setenv("PIP_INDEX_URL", sdist_index(tmp_path / "index").as_uri())
    with pytest.raises(FetchError, match="has no") as info:
        fetch_release("0.10.2", remote=str(fork), cache=cache, console=quiet())
    assert "not remembered" in str(info.value) and str(fork) in str(info.value)
    assert not (cache / "releases" / "v0.10.2.noheader").exists()
    tree = fetch_release("0.10.2", remote=str(tmp_path / "none.git"), cache=cache, console=quiet())
    assert (tree / HEADER).is_file()


def test_a_verdict_of_one_index_does_not_bind_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    record = cache / "releases" / "v0.10.2.noheader"
    monkeypatch.setenv("PIP_INDEX_URL", _headerless_index(tmp_path / "bad-index").as_uri())
    with pytest.raises(FetchError) as info:
        fetch_release("0.10.2", remote=str(tmp_path / "none.git"), cache=cache, console=quiet())
    assert str(record) in str(info.value) and "delete" in str(info.value)
    assert record.is_file()
    with pytest.raises(FetchError, match="earlier fetch") as info:  # the same index: refused from the record
        fetch_release("0.10.2", remote=str(tmp_path / "none.git"), cache=cache, console=quiet())
    assert str(record) in str(info.value)
    monkeypatch.setenv("PIP_INDEX_URL", sdist_index(tmp_path / "good-index").as_uri())
    tree = fetch_release("0.10.2", remote=str(tmp_path / "none.git"), cache=cache, console=quiet())
    assert (tree / HEADER).is_file() and not record.exists()


def test_the_default_remotes_verdict_is_remembered_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    canonical = str(remote_repo(tmp_path, header=False))
    monkeypatch.setattr(fetch, "DEFAULT_REMOTE", canonical)
    cache = tmp_path / "cache"
    record = cache / "releases" / "v0.10.2.noheader"
    with pytest.raises(FetchError) as info:
        fetch_release("0.10.2", remote=canonical, cache=cache, console=quiet())
    assert record.is_file() and f"remembered in {record}" in str(info.value)
    _no_io(monkeypatch)
    for remote in (canonical, str(tmp_path / "another-remote.git")):  # the canonical answer holds for any remote
        with pytest.raises(FetchError, match="0.6.4 through 0.22.1") as info:
            fetch_release("0.10.2", remote=remote, cache=cache, console=quiet())
        assert str(record) in str(info.value)


def test_an_old_record_from_a_fork_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record an older kvpatch wrote after a wrong --remote (its one line names the remote)."""
    cache = tmp_path / "cache"
    record = cache / "releases" / "v0.10.2.noheader"
    record.parent.mkdir(parents=True)
    record.write_text("git /home/someone/fork.git v0.10.2\n")
    monkeypatch.setenv("PIP_INDEX_URL", sdist_index(tmp_path / "index").as_uri())
    tree = fetch_release("0.10.2", remote=str(tmp_path / "none.git"), cache=cache, console=quiet())
    assert (tree / HEADER).is_file() and not record.exists()


def test_an_old_record_from_pypi_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    record = cache / "releases" / "v0.10.2.noheader"
    record.parent.mkdir(parents=True)
    record.write_text("sdist https://files.pythonhosted.org/packages/x/vllm-0.10.2.tar.gz sha256=00\n")
    _no_io(monkeypatch)
    with pytest.raises(FetchError, match="earlier fetch") as info:
        fetch_release("0.10.2", cache=cache, console=quiet())
    assert str(record) in str(info.value)
