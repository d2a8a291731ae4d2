"""Unpacking an sdist needs tarfile's data filter (Python 3.11.4): links chained out of the
unpack directory never write outside it, with the filter or, on a Python without it, by
refusing in one line."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tomllib
from pathlib import Path

import pytest
from cli.cli_helpers import ROOT
from conftest import HEADER
from rich.console import Console

from kvpatch.errors import FetchError
from kvpatch.source.fetch import fetch_release


def _chain_sdist_index(tmp_path: Path) -> Path:
    """An sdist whose links chain out of the unpack directory: l1 -> ., then l1/l2,
    l1/l2/l3, l1/l2/l3/l4 -> .. each, then a file written through l4. Each link alone
    stays inside the top directory for a check that does not resolve the links
    before it (l1 is the top directory itself, so each '..' climbs one level out)."""
    top = "vllm-0.10.2"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:

        def add(name: str, data: bytes = b"", link: str | None = None) -> None:
            info = tarfile.TarInfo(f"{top}/{name}")
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

        add(HEADER, b"// header\n")
        add("l1", link=".")
        add("l1/l2", link="..")
        add("l1/l2/l3", link="..")
        add("l1/l2/l3/l4", link="..")
        add("l1/l2/l3/l4/escaped.txt", b"outside\n")
    index = tmp_path / "index"
    (index / "vllm").mkdir(parents=True)
    (index / "vllm" / f"{top}.tar.gz").write_bytes(buf.getvalue())
    digest = hashlib.sha256(buf.getvalue()).hexdigest()
    (index / "vllm" / "index.html").write_text(f'<a href="{top}.tar.gz#sha256={digest}">{top}.tar.gz</a>')
    return index


@pytest.mark.parametrize("with_filter", [True, False], ids=["data-filter", "python-without-filter"])
def test_a_symlink_chain_never_writes_outside(
    with_filter: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = _chain_sdist_index(tmp_path)
    if not with_filter:
        monkeypatch.delattr(tarfile, "data_filter")
    monkeypatch.setenv("PIP_INDEX_URL", index.as_uri())
    with pytest.raises(FetchError) as info:
        fetch_release("0.10.2", remote=str(tmp_path / "no-remote.git"), cache=tmp_path / "cache",
                      console=Console(file=open(os.devnull, "w")))  # fmt: skip
    assert info.value.exit_code == 3 and "\n" not in str(info.value)
    assert not list(tmp_path.rglob("escaped.txt"))
    if not with_filter:
        assert "3.11.4" in str(info.value)


def test_pyproject_requires_a_python_with_the_filter() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert data["project"]["requires-python"] == ">=3.11.4"
    assert any(d.startswith("pypi-simple") for d in data["project"]["dependencies"])
