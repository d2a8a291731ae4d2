"""Class: malformed input crashes (RecursionError, ValueError tracebacks).

Deeply nested JSON (state.json, an index's JSON page, a file:// index's index.json) and
URLs Python cannot parse (an IPv6 bracket left open, a port that is not a number or out
of range: in PIP_INDEX_URL, in --remote, in a link on an index page) end in one line:
FetchError (exit 3) for a source, the corrupt-state error (exit 1) for state.json."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from source_helpers import IndexServer, quiet, sdist_index, sdist_members, send, tar_bytes

from kvpatch.errors import FetchError
from kvpatch.source.fetch import fetch_release
from kvpatch.source.sdist import _redact

DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"files": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001
DEEP_HTML = b"<div>" * 100_000 + b'<a href="vllm-0.10.2.tar.gz">vllm-0.10.2.tar.gz</a>' + b"</div>" * 100_000
BAD_URLS = ["http://[::1", "http://[::1/simple", "http://127.0.0.1:abc/simple", "http://127.0.0.1:99999/simple",
            "https://user:pw@[::1/simple", "http://127.0.0.1:-1/simple"]  # fmt: skip


def _fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index: str, remote: str | None = None) -> Path:
    monkeypatch.setenv("PIP_INDEX_URL", index)
    return fetch_release("0.10.2", remote=remote or str(tmp_path / "no-remote.git"), cache=tmp_path / "cache",
                         console=quiet())  # fmt: skip


def _one_line_fetch_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index: str, remote: str | None = None,
                          needle: str = "") -> str:  # fmt: skip
    with pytest.raises(FetchError) as info:
        _fetch(tmp_path, monkeypatch, index, remote)
    text = str(info.value)
    assert info.value.exit_code == 3 and "\n" not in text and needle in text, text
    return text


@pytest.mark.parametrize("body", [DEEP, DEEP_OBJECT], ids=["array", "object"])
def test_a_deep_json_state_is_the_corrupt_state_error(body: bytes, tmp_path: Path) -> None:
    path = tmp_path / ".kvpatch" / "state.json"
    path.parent.mkdir()
    path.write_bytes(body)
    for command in ("diff", "revert", "sites", "apply"):
        assert_one_line_error(run_cli(command, cwd=tmp_path), 1, str(path), "delete it and run 'kvpatch apply' again")


@pytest.mark.parametrize("body", [DEEP, DEEP_OBJECT], ids=["array", "object"])
def test_a_deep_local_index_json_is_one_line(body: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "index" / "vllm").mkdir(parents=True)
    (tmp_path / "index" / "vllm" / "index.json").write_bytes(body)
    _one_line_fetch_error(tmp_path, monkeypatch, (tmp_path / "index").as_uri(), needle="cannot read")


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (DEEP, "application/vnd.pypi.simple.v1+json"),
        (DEEP_OBJECT, "application/vnd.pypi.simple.v1+json"),
        pytest.param(DEEP_HTML, "text/html", marks=pytest.mark.slow),
    ],
    ids=["array", "object", "html"],
)  # html: a page nested 100,000 deep, seconds to parse
def test_a_deep_index_page_is_one_line(body: bytes, content_type: str, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    with IndexServer(lambda owner, h: send(h, 200, body, content_type)) as index:
        with pytest.raises(FetchError) as info:
            _fetch(tmp_path, monkeypatch, index.url + "/simple")
    assert info.value.exit_code == 3 and "\n" not in str(info.value)


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_malformed_index_url_is_one_line(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = _one_line_fetch_error(tmp_path, monkeypatch, url, needle="not a valid URL")
    assert "pw" not in text


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_malformed_index_url_in_the_cli_is_one_line(url: str, tmp_path: Path) -> None:
    env = {"PIP_INDEX_URL": url, "KVPATCH_CACHE": str(tmp_path / "cache")}
    proc = run_cli("apply", "--vllm", "0.10.2", "--remote", str(tmp_path / "none.git"), cwd=tmp_path, env=env)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.startswith("error:")]) == 1, proc.stderr


@pytest.mark.parametrize("remote", BAD_URLS + ["ext::sh -c touch% /tmp/kvpatch-ext-ran"])
def test_a_malformed_remote_falls_back_to_the_sdist(
    remote: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = _fetch(tmp_path, monkeypatch, sdist_index(tmp_path / "index").as_uri(), remote)
    assert tree.is_dir() and not Path("/tmp/kvpatch-ext-ran").exists()


@pytest.mark.parametrize("remote", BAD_URLS)
def test_a_malformed_remote_in_the_cli_is_one_line(remote: str, tmp_path: Path) -> None:
    env = {"PIP_INDEX_URL": "http://127.0.0.1:9/never", "KVPATCH_CACHE": str(tmp_path / "cache")}
    proc = run_cli("apply", "--vllm", "0.10.2", "--remote", remote, cwd=tmp_path, env=env)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.startswith("error:")]) == 1, proc.stderr


@pytest.mark.parametrize(
    "href",
    [
        "http://[::1/vllm-0.10.2.tar.gz",
        "http://127.0.0.1:abc/vllm-0.10.2.tar.gz",
        "http://127.0.0.1:99999/vllm-0.10.2.tar.gz",
        "//[::1/vllm-0.10.2.tar.gz",
    ],
)
def test_a_malformed_link_on_an_index_page_is_one_line(
    href: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tar_bytes(sdist_members())
    digest = hashlib.sha256(data).hexdigest()
    page = f'<a href="{href}#sha256={digest}">vllm-0.10.2.tar.gz</a>'.encode()
    for auth in ("", "user:pw@"):
        with IndexServer(lambda owner, h: send(h, 200, page)) as index:
            with pytest.raises(FetchError) as info:
                _fetch(tmp_path / auth[:4], monkeypatch, index.url.replace("http://", f"http://{auth}") + "/simple")
        assert info.value.exit_code == 3 and "\n" not in str(info.value) and "pw" not in str(info.value)


def test_a_malformed_link_in_a_local_index_json_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "index" / "vllm").mkdir(parents=True)
    (tmp_path / "index" / "vllm" / "index.json").write_text(
        json.dumps({"files": [{"filename": "vllm-0.10.2.tar.gz", "url": "http://[::1/x.tar.gz", "hashes": {}}]})
    )
    _one_line_fetch_error(tmp_path, monkeypatch, (tmp_path / "index").as_uri())


@pytest.mark.parametrize("url", BAD_URLS + ["not a url at all", "http://u:secret@h:abc/x"])
def test_redact_never_raises_and_hides_passwords(url: str) -> None:
    shown = _redact(url)
    assert isinstance(shown, str) and "secret" not in shown and ":pw@" not in shown
