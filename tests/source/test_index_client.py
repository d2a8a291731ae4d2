"""The package-index client: an index URL's credentials go to the index's host only (its
links, relative or absolute), never to another host (a redirect, a link); links of other
schemes and malformed pages are refused in one line (exit 3). Indexes served from a thread on
127.0.0.1, the other host reached as 'localhost'."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import pytest
from cli.cli_helpers import run_cli
from conftest import HEADER
from rich.console import Console
from source_helpers import IndexServer, sdist_members, send, tar_bytes

from kvpatch.errors import FetchError
from kvpatch.source.fetch import fetch_release

AUTH = "Basic " + base64.b64encode(b"user:s3cret").decode()


def _sdist_bytes() -> tuple[bytes, str]:
    data = tar_bytes(sdist_members())
    return data, hashlib.sha256(data).hexdigest()


def _fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index: str) -> Path:
    monkeypatch.setenv("PIP_INDEX_URL", index)
    return fetch_release("0.10.2", remote=str(tmp_path / "no-remote.git"), cache=tmp_path / "cache",
                         console=Console(file=open(os.devnull, "w")))  # fmt: skip


def _other_host(data: bytes) -> IndexServer:
    """A second server, reached as 'localhost' (another host than 127.0.0.1 to a client)."""
    return IndexServer(lambda owner, h: send(h, 200, data, "application/octet-stream"))


@pytest.mark.parametrize("link", ["relative", "same-host-absolute"])
def test_credentials_go_to_the_index_host_for_its_links(
    link: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, digest = _sdist_bytes()

    def routes(owner: IndexServer, h) -> None:
        if h.headers.get("Authorization") != AUTH:
            send(h, 401, b"who are you", headers={"WWW-Authenticate": 'Basic realm="index"'})
        elif h.path == "/simple/vllm/":
            href = "../../files/vllm-0.10.2.tar.gz" if link == "relative" else f"{owner.url}/files/vllm-0.10.2.tar.gz"
            send(h, 200, f'<a href="{href}#sha256={digest}">vllm-0.10.2.tar.gz</a>'.encode())
        elif h.path == "/files/vllm-0.10.2.tar.gz":
            send(h, 200, data, "application/octet-stream")
        else:
            send(h, 404, b"no")

    with IndexServer(routes) as index:
        tree = _fetch(tmp_path, monkeypatch, index.url.replace("http://", "http://user:s3cret@") + "/simple")
    assert (tree / HEADER).is_file()
    assert [(path, headers.get("Authorization")) for path, headers in index.requests] == [
        ("/simple/vllm/", AUTH), ("/files/vllm-0.10.2.tar.gz", AUTH),
    ]  # fmt: skip


@pytest.mark.parametrize("how", ["redirect", "link"])
def test_credentials_never_reach_another_host(how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data, digest = _sdist_bytes()
    with _other_host(data) as files:
        elsewhere = files.url.replace("127.0.0.1", "localhost") + "/vllm-0.10.2.tar.gz"

        def routes(owner: IndexServer, h) -> None:
            if h.path == "/simple/vllm/":
                href = "/files/vllm-0.10.2.tar.gz" if how == "redirect" else elsewhere
                send(h, 200, f'<a href="{href}#sha256={digest}">vllm-0.10.2.tar.gz</a>'.encode())
            elif h.path == "/files/vllm-0.10.2.tar.gz":
                send(h, 302, b"", headers={"Location": elsewhere})
            else:
                send(h, 404, b"no")

        with IndexServer(routes) as index:
            tree = _fetch(tmp_path, monkeypatch, index.url.replace("http://", "http://user:s3cret@") + "/simple")
    assert (tree / HEADER).is_file()
    assert all(headers.get("Authorization") == AUTH for _, headers in index.requests)
    assert [(path, headers.get("Authorization")) for path, headers in files.requests] == [("/vllm-0.10.2.tar.gz", None)]


@pytest.mark.parametrize("href", ["file:///etc/hostname", "ftp://127.0.0.1/vllm-0.10.2.tar.gz"])
def test_links_with_other_schemes_are_refused(href: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = f'<a href="{href}#sha256={"0" * 64}">vllm-0.10.2.tar.gz</a>'.encode()
    with IndexServer(lambda owner, h: send(h, 200, page)) as index:
        with pytest.raises(FetchError, match=r"refusing the link .* only http or https links") as info:
            _fetch(tmp_path, monkeypatch, index.url + "/simple")
    assert info.value.exit_code == 3


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"{not json", "application/vnd.pypi.simple.v1+json"),
        (b'{"files": 3}', "application/vnd.pypi.simple.v1+json"),
        (b"[]", "application/vnd.pypi.simple.v1+json"),
        (b"<a>", "application/x-unknown"),
    ],
    ids=["not-json", "files-not-a-list", "list", "unknown-type"],
)
def test_a_malformed_index_page_is_one_line(
    body: bytes, content_type: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with IndexServer(lambda owner, h: send(h, 200, body, content_type)) as index:
        with pytest.raises(FetchError) as info:
            _fetch(tmp_path, monkeypatch, index.url + "/simple")
    assert info.value.exit_code == 3 and "\n" not in str(info.value) and "cannot read" in str(info.value)


def test_a_malformed_local_index_page_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "index/vllm").mkdir(parents=True)
    (tmp_path / "index/vllm/index.json").write_text('{"files": [{"filename": 1}]}')
    with pytest.raises(FetchError, match="cannot read") as info:
        _fetch(tmp_path, monkeypatch, (tmp_path / "index").as_uri())
    assert info.value.exit_code == 3


@pytest.mark.parametrize("index", ["not a url", "ftp://mirror.example/simple", "127.0.0.1:8080/simple", "http://"])
def test_an_index_url_that_is_not_a_url_is_one_line(index: str, tmp_path: Path) -> None:
    env = {"PIP_INDEX_URL": index, "KVPATCH_CACHE": str(tmp_path / "cache")}
    proc = run_cli("apply", "--vllm", "0.10.2", "--remote", str(tmp_path / "none.git"), cwd=tmp_path, env=env)
    assert proc.returncode == 3, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "is not an http(s):// or file:// URL" in errors[0] and "Traceback" not in proc.stderr
