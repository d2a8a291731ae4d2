"""Offline tests for kvpatch.source.fetch: local git remotes, file:// and 127.0.0.1 package indexes."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Iterator

import git
import pytest
from rich.console import Console

from kvpatch.errors import FetchError, UsageError
from kvpatch.source import fetch
from kvpatch.source.fetch import HEADER, cache_root, fetch_release, normalize_version, release_tag

HEADER_TEXT = "// fake attention kernels for {version}\n"


# --------------------------------------------------------------------------- helpers


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=400, force_terminal=False), buf


def _git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def make_remote(tmp_path: Path, version: str = "0.10.2") -> Path:
    """A bare repo whose tag v<version> holds the header; main has a later commit."""
    work = tmp_path / "remote-work"
    (work / "csrc/attention").mkdir(parents=True)
    (work / HEADER).write_text(HEADER_TEXT.format(version=version))
    _git(work, "init", "-q", "-b", "main")
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "release")
    _git(work, "tag", f"v{version}")
    (work / "later.txt").write_text("after the release\n")
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "later")
    bare = tmp_path / "remote.git"
    _git(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    return bare


def make_sdist(
    path: Path, version: str = "0.10.2", *, header: bool = True, extra: dict[str, str] | None = None
) -> bytes:
    """Write a small vllm-<version>.tar.gz with top dir vllm-<version>/ and return its bytes."""
    top = f"vllm-{version}"
    files = {"PKG-INFO": f"Name: vllm\nVersion: {version}\n", "setup.py": "print('hi')\n", ".gitignore": "*.py\n"}
    if header:
        files[HEADER] = HEADER_TEXT.format(version=version)
    files.update(extra or {})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def make_index(root: Path, version: str = "0.10.2", *, fmt: str = "html", bad_hash: bool = False, **kw) -> Path:
    """A PEP 503/691 simple index at ``root`` with vllm-<version>.tar.gz (and a wheel decoy)."""
    project = root / "vllm"
    project.mkdir(parents=True)
    name = f"vllm-{version}.tar.gz"
    digest = hashlib.sha256(make_sdist(project / name, version, **kw)).hexdigest()
    if bad_hash:
        digest = "0" * 64
    decoy = f"vllm-{version}-cp38-abi3-manylinux1_x86_64.whl"
    if fmt in ("html", "both"):
        (project / "index.html").write_text(
            "<!DOCTYPE html><html><body>\n"
            f'<a href="{decoy}#sha256={"1" * 64}">{decoy}</a><br/>\n'
            f'<a href="{name}#sha256={digest}" data-requires-python="&gt;=3.9">{name}</a><br/>\n'
            "</body></html>\n"
        )
    if fmt in ("json", "both"):
        (project / "index.json").write_text(
            json.dumps(
                {
                    "meta": {"api-version": "1.0"},
                    "name": "vllm",
                    "files": [
                        {"filename": decoy, "url": decoy, "hashes": {"sha256": "1" * 64}},
                        {"filename": name, "url": name, "hashes": {"sha256": digest}},
                    ],
                }
            )
        )
    return root


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Isolated cache; a remote that fails at once; returns the cache dir."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("KVPATCH_CACHE", str(cache))
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    return cache


def _no_remote(tmp_path: Path) -> str:
    return str(tmp_path / "no-such-remote.git")


def _releases_entries(cache: Path) -> list[str]:
    releases = cache / "releases"
    return sorted(p.name for p in releases.iterdir()) if releases.exists() else []


def _assert_nothing_cached(cache: Path, tag: str = "v0.10.2") -> None:
    leftovers = [n for n in _releases_entries(cache) if n != ".lock"]
    assert leftovers == [], leftovers


# --------------------------------------------------------------------------- versions


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.10.2", "0.10.2"),
        ("v0.10.2", "0.10.2"),
        (" 0.10.1.1 ", "0.10.1.1"),
        ("V0.6.4", "0.6.4"),
        ("0.10.02", "0.10.2"),
        ("0.6.6.post1", "0.6.6.post1"),
        ("0.6.6post1", "0.6.6.post1"),
        ("0.20", "0.20"),
    ],
)
def test_normalize_version(text: str, expected: str) -> None:
    assert normalize_version(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "latest",
        "0",
        "v",
        "0.10.2rc1",
        "0.10.2-dev",
        "0..2",
        "0.10.2/../x",
        "1.2.3 4",
        "0." + "1" * 5000,
        "0.10." + "2" * 300,
        "v" * 300,
    ],
)
def test_normalize_version_rejects(text: str) -> None:
    with pytest.raises(UsageError) as info:
        normalize_version(text)
    assert "\n" not in str(info.value) and len(str(info.value)) < 120
    assert info.value.exit_code == 2


def test_release_tag() -> None:
    assert release_tag("0.10.2") == "v0.10.2"
    assert release_tag("v0.10.1.1") == "v0.10.1.1"


def test_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVPATCH_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    assert not (tmp_path / "c").exists()
    monkeypatch.delenv("KVPATCH_CACHE")
    assert cache_root().name == "kvpatch"


# --------------------------------------------------------------------------- git path


def test_git_clone(env: Path, tmp_path: Path) -> None:
    remote = make_remote(tmp_path)
    console, out = _console()
    tree = fetch_release("v0.10.2", remote=str(remote), console=console)
    assert tree == env / "releases" / "v0.10.2"
    assert (tree / HEADER).read_text() == HEADER_TEXT.format(version="0.10.2")
    assert not (tree / "later.txt").exists()
    repo = git.Repo(tree)
    assert repo.tags["v0.10.2"].commit == repo.head.commit
    assert not repo.is_dirty(untracked_files=True)
    assert (env / "releases" / "v0.10.2.complete").is_file()
    assert "falling back" not in out.getvalue()
    # Cached: a second call works with the remote gone.
    assert fetch_release("0.10.2", remote=_no_remote(tmp_path), console=console) == tree


@pytest.mark.slow  # waits out the timeout
def test_git_clone_timeout(env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A remote that never answers is given up on after git_timeout, then the sdist is used."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    port = silent.getsockname()[1]
    monkeypatch.setenv("PIP_INDEX_URL", make_index(tmp_path / "index").as_uri())
    console, out = _console()
    try:
        start = time.monotonic()
        tree = fetch_release("0.10.2", remote=f"http://127.0.0.1:{port}/vllm.git", console=console, git_timeout=1)
        assert time.monotonic() - start < 20
    finally:
        silent.close()
    assert "failed (timed out after 1 s); falling back" in out.getvalue()
    assert (tree / HEADER).is_file()


# --------------------------------------------------------------------------- sdist path


@pytest.mark.parametrize("fmt", ["html", "json"])
def test_sdist_fallback_file_index(env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    index = make_index(tmp_path / "index", fmt=fmt)
    monkeypatch.setenv("PIP_INDEX_URL", index.as_uri())
    console, out = _console()
    tree = fetch_release("0.10.2", remote=_no_remote(tmp_path), console=console)

    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"git clone of v0.10.2 from {tmp_path}/no-such-remote.git failed (repository ")
    assert f"falling back to the source distribution on {index.as_uri()}" in lines[0]

    assert tree == env / "releases" / "v0.10.2"
    assert (tree / HEADER).read_text() == HEADER_TEXT.format(version="0.10.2")
    assert (tree / "PKG-INFO").is_file()
    repo = git.Repo(tree)
    head = repo.head.commit
    assert repo.tags["v0.10.2"].commit == head
    assert head.message.strip() == "vLLM 0.10.2 (source distribution)"
    assert (head.author.name, head.author.email) == ("kvpatch", "kvpatch@localhost")
    assert (head.committer.name, head.committer.email) == ("kvpatch", "kvpatch@localhost")
    assert not head.parents
    # Every file is committed, even those the sdist's own .gitignore would ignore.
    assert "setup.py" in {item.path for item in head.tree.traverse()}
    assert not repo.is_dirty(untracked_files=True)
    assert _releases_entries(env) == [".lock", "v0.10.2", "v0.10.2.complete"]

    # Second fetch: no index, no remote, still served from the cache, silently.
    shutil.rmtree(index)
    console2, out2 = _console()
    start = time.monotonic()
    assert fetch_release("v0.10.2", remote=_no_remote(tmp_path), console=console2) == tree
    assert time.monotonic() - start < 1
    assert out2.getvalue() == ""


def test_sdist_commit_is_reproducible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", make_index(tmp_path / "index").as_uri())
    shas = []
    for n in range(2):
        tree = fetch_release("0.10.2", remote=_no_remote(tmp_path), cache=tmp_path / f"c{n}", console=_console()[0])
        shas.append(git.Repo(tree).head.commit.hexsha)
    assert shas[0] == shas[1]


def test_sha256_mismatch(env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", make_index(tmp_path / "index", bad_hash=True).as_uri())
    with pytest.raises(FetchError, match="sha256 mismatch"):
        fetch_release("0.10.2", remote=_no_remote(tmp_path), console=_console()[0])
    _assert_nothing_cached(env)


@pytest.mark.parametrize("planted", ["file", "dangling link", "link to a folder"])
def test_a_file_or_link_where_a_cached_tree_goes_is_replaced(planted: str, env: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Before: a file (or a dangling link) at releases/v0.10.2 made every apply download the sdist
    again and fail renaming the tree into place ("Not a directory", naming a temporary folder
    already gone). After: the damaged entry is replaced by the release's tree; a folder a link
    named is left as it was."""
    monkeypatch.setenv("PIP_INDEX_URL", make_index(tmp_path / "index").as_uri())
    entry = env / "releases" / "v0.10.2"
    entry.parent.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    if planted == "file":
        entry.write_text("x")
    else:
        entry.symlink_to(tmp_path / "nowhere" if planted == "dangling link" else elsewhere)
    tree = fetch_release("0.10.2", remote=_no_remote(tmp_path), console=_console()[0])
    assert tree == entry and entry.is_dir() and not entry.is_symlink() and (tree / HEADER).is_file()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]


def test_a_file_index_sdist_that_is_no_file_is_refused_not_read(env: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Before: a file:// index whose sdist was a FIFO hung the fetch with the release cache's
    lock held, and a link to /dev/zero was copied until the disk filled. After: one line, exit 3,
    nothing cached."""
    import os

    index = make_index(tmp_path / "index")
    monkeypatch.setenv("PIP_INDEX_URL", index.as_uri())
    sdist = index / "vllm" / "vllm-0.10.2.tar.gz"
    sdist.unlink()
    os.mkfifo(sdist)
    with pytest.raises(FetchError, match=r"cannot read file://.*vllm-0\.10\.2\.tar\.gz: a FIFO, not a file"):
        fetch_release("0.10.2", remote=_no_remote(tmp_path), console=_console()[0])
    sdist.unlink()
    sdist.symlink_to("/dev/zero")
    with pytest.raises(FetchError, match=r"a character device, not a file"):
        fetch_release("0.10.2", remote=_no_remote(tmp_path), console=_console()[0])
    _assert_nothing_cached(env)


def test_release_not_on_index(env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = make_index(tmp_path / "index")
    monkeypatch.setenv("PIP_INDEX_URL", index.as_uri())
    with pytest.raises(FetchError, match=r"vLLM release 0\.9\.9 not found on file://") as info:
        fetch_release("0.9.9", remote=_no_remote(tmp_path), console=_console()[0])
    assert info.value.exit_code == 3
    _assert_nothing_cached(env, "v0.9.9")


def test_project_not_on_index(env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty-index").mkdir()
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "empty-index").as_uri())
    with pytest.raises(FetchError, match="not found on"):
        fetch_release("0.10.2", remote=_no_remote(tmp_path), console=_console()[0])


def test_release_without_header(env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-range release found without the header is refused, and remembered: the next
    call is refused without any I/O (no second download)."""
    monkeypatch.setenv("PIP_INDEX_URL", make_index(tmp_path / "index", "0.9.9", header=False).as_uri())
    with pytest.raises(
        FetchError, match=r"0\.9\.9 has no csrc/attention/attention_kernels\.cuh.*0\.6\.4 through 0\.22\.1"
    ):
        fetch_release("0.9.9", remote=_no_remote(tmp_path), console=_console()[0])
    assert _releases_entries(env) == [".lock", "v0.9.9.noheader"]

    def boom(*a, **k):
        raise AssertionError("no I/O expected")

    monkeypatch.setattr(fetch, "_obtain", boom)
    with pytest.raises(FetchError, match=r"0\.9\.9 has no"):
        fetch_release("0.9.9", remote=_no_remote(tmp_path), console=_console()[0])


def test_git_release_without_header(env: Path, tmp_path: Path) -> None:
    work = tmp_path / "w"
    work.mkdir()
    (work / "README").write_text("x\n")
    _git(work, "init", "-q")
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "x")
    _git(work, "tag", "v0.9.9")
    with pytest.raises(FetchError, match="0.6.4 through 0.22.1"):
        fetch_release("0.9.9", remote=str(work), console=_console()[0])
    assert not (env / "releases" / "v0.9.9").exists()


@pytest.mark.parametrize("version", ["0.6.3", "0.23.0", "0.25.0", "1.0"])
def test_outside_the_range_rejected_before_io(version: str, env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a, **k):
        raise AssertionError("no I/O expected")

    monkeypatch.setattr(fetch, "_clone", boom)
    monkeypatch.setattr(fetch, "_index_url", boom)
    monkeypatch.setattr(fetch, "hold_lock", boom)
    where = "before" if version == "0.6.3" else "after"  # not "has no header": nothing says the release exists
    with pytest.raises(
        FetchError, match=rf"vLLM {version} is {where} the releases that carry .*0\.6\.4 through 0\.22\.1"
    ):
        fetch_release(version, console=_console()[0])
    assert not env.exists()


def test_malformed_version_is_usage_error(env: Path) -> None:
    with pytest.raises(UsageError):
        fetch_release("latest", console=_console()[0])


def test_unreachable_index(env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    with pytest.raises(FetchError, match="no network") as info:
        fetch_release("0.10.2", remote=_no_remote(tmp_path), console=_console()[0])
    assert "nothing cached for v0.10.2" in str(info.value)
    assert "\n" not in str(info.value)
    _assert_nothing_cached(env)


def test_missing_file_index_is_no_network(env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "gone").as_uri())
    with pytest.raises(FetchError, match="no network"):
        fetch_release("0.10.2", remote=_no_remote(tmp_path), console=_console()[0])


def test_unsafe_tar_rejected(env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = tmp_path / "index"
    (index / "vllm").mkdir(parents=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in ("vllm-0.10.2/" + HEADER, "vllm-0.10.2/../../evil.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    data = buf.getvalue()
    (index / "vllm" / "vllm-0.10.2.tar.gz").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    (index / "vllm" / "index.html").write_text(f'<a href="vllm-0.10.2.tar.gz#sha256={digest}">vllm-0.10.2.tar.gz</a>')
    monkeypatch.setenv("PIP_INDEX_URL", index.as_uri())
    with pytest.raises(FetchError, match="unsafe"):
        fetch_release("0.10.2", remote=_no_remote(tmp_path), console=_console()[0])
    assert not (tmp_path / "evil.txt").exists()
    _assert_nothing_cached(env)


def test_stale_leftovers_are_replaced(env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A killed fetch (temp dir, or tree without its marker) does not count as cached."""
    releases = env / "releases"
    (releases / ".tmp-v0.10.2-dead").mkdir(parents=True)
    (releases / "v0.10.2").mkdir()
    (releases / "v0.10.2" / "junk").write_text("half done")
    monkeypatch.setenv("PIP_INDEX_URL", make_index(tmp_path / "index").as_uri())
    tree = fetch_release("0.10.2", remote=_no_remote(tmp_path), console=_console()[0])
    assert not (tree / "junk").exists()
    assert (tree / HEADER).is_file()
    assert _releases_entries(env) == [".lock", "v0.10.2", "v0.10.2.complete"]


# --------------------------------------------------------------------------- index discovery


def test_index_url_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple/")
    assert fetch._index_url() == "https://mirror.example/simple"


def test_index_url_pip_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)

    class Done:
        returncode = 0
        stdout = (
            "global.index-url='https://global.example/simple'\ninstall.index-url='https://install.example/simple'\n"
        )

    monkeypatch.setattr(fetch.subprocess, "run", lambda *a, **k: Done())
    assert fetch._index_url() == "https://install.example/simple"
    Done.stdout = "global.index-url='https://global.example/simple'\nglobal.extra-index-url='file:///x'\n"
    assert fetch._index_url() == "https://global.example/simple"
    Done.stdout = "global.extra-index-url='file:///x'\n"
    assert fetch._index_url() == "https://pypi.org/simple"


def test_index_url_without_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)

    def missing(*a, **k):
        raise FileNotFoundError("python")

    monkeypatch.setattr(fetch.subprocess, "run", missing)
    assert fetch._index_url() == "https://pypi.org/simple"


# --------------------------------------------------------------------------- HTTP index


class _IndexHandler(http.server.SimpleHTTPRequestHandler):
    """Serves index.json to clients asking for PEP 691 JSON, index.html otherwise."""

    requests: list[str] = []

    def do_GET(self) -> None:  # noqa: N802
        type(self).requests.append(self.path)
        folder = Path(self.translate_path(self.path))
        wants_json = "application/vnd.pypi.simple.v1+json" in self.headers.get("Accept", "")
        if self.path.endswith("/") and wants_json and (folder / "index.json").is_file():
            body = (folder / "index.json").read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def http_index(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    root = make_index(tmp_path / "http-index", fmt=request.param)
    handler = functools.partial(_IndexHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("http_index", ["html", "both"], indirect=True)
def test_sdist_over_http(env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, http_index: str) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", http_index)
    console, out = _console()
    tree = fetch_release("0.10.2", remote=_no_remote(tmp_path), console=console)
    assert (tree / HEADER).read_text() == HEADER_TEXT.format(version="0.10.2")
    assert git.Repo(tree).tags["v0.10.2"].commit == git.Repo(tree).head.commit
    assert f"on {http_index.rstrip('/')}" in out.getvalue()


@pytest.mark.parametrize("http_index", ["html"], indirect=True)
def test_http_release_not_found(env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, http_index: str) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", http_index + "nested/simple")  # 404 for the vllm page
    with pytest.raises(FetchError, match="not found on http://127.0.0.1"):
        fetch_release("0.10.2", remote=_no_remote(tmp_path), console=_console()[0])


# --------------------------------------------------------------------------- cache hygiene


def test_no_lock_file_per_unknown_version(env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", make_index(tmp_path / "index").as_uri())
    for version in ("0.9.7", "0.9.8", "0.9.9"):
        with pytest.raises(FetchError, match="not found"):
            fetch_release(version, remote=_no_remote(tmp_path), console=_console()[0])
    assert _releases_entries(env) == [".lock"]


def test_stale_temp_dirs_of_any_release_are_cleaned(env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    releases = env / "releases"
    for name in (".tmp-v0.9.2-killed", ".tmp-v0.10.2-killed"):
        (releases / name / "tree").mkdir(parents=True)
    monkeypatch.setenv("PIP_INDEX_URL", make_index(tmp_path / "index").as_uri())
    fetch_release("0.10.2", remote=_no_remote(tmp_path), console=_console()[0])
    assert _releases_entries(env) == [".lock", "v0.10.2", "v0.10.2.complete"]


def test_a_cached_repo_whose_tag_moved_is_fetched_again(env: Path, tmp_path: Path) -> None:
    remote = make_remote(tmp_path)
    tree = fetch_release("0.10.2", remote=str(remote), console=_console()[0])
    first = git.Repo(tree).head.commit.hexsha
    _git(tree, "commit", "-q", "--allow-empty", "-m", "someone else's commit")
    _git(tree, "tag", "-f", "v0.10.2")
    console, out = _console()
    again = fetch_release("0.10.2", remote=str(remote), console=console)
    assert "tag v0.10.2 moved" in out.getvalue() and "fetching it again" in out.getvalue()
    assert git.Repo(again).tags["v0.10.2"].commit.hexsha == first


def test_absurd_member_mtime(env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """git refuses commit dates after 2099: the sdist's newest mtime is clamped."""
    index = tmp_path / "index"
    (index / "vllm").mkdir(parents=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("vllm-0.10.2/" + HEADER)
        info.size, info.mtime = 1, 2**40
        tar.addfile(info, io.BytesIO(b"x"))
    data = buf.getvalue()
    (index / "vllm" / "vllm-0.10.2.tar.gz").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    (index / "vllm" / "index.html").write_text(f'<a href="vllm-0.10.2.tar.gz#sha256={digest}">vllm-0.10.2.tar.gz</a>')
    monkeypatch.setenv("PIP_INDEX_URL", index.as_uri())
    tree = fetch_release("0.10.2", remote=_no_remote(tmp_path), console=_console()[0])
    assert git.Repo(tree).head.commit.committed_date == 4_102_444_799


def test_a_fetch_waits_while_another_process_holds_the_cache_and_then_fetches(
    env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two kvpatch processes (or test workers) fetching at once: the second waits, says so, and
    goes on; it is never an error."""
    monkeypatch.setenv("PIP_INDEX_URL", make_index(tmp_path / "index").as_uri())
    (env / "releases").mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom kvpatch.fsutil import hold_lock\n"
         f"with hold_lock({str(env / 'releases' / '.lock')!r}):\n    print('held', flush=True)\n    time.sleep(1.5)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        console, out = _console()
        start = time.monotonic()
        tree = fetch_release("0.10.2", remote=_no_remote(tmp_path), console=console)
        assert time.monotonic() - start > 0.5  # it waited for the other process
    finally:
        holder.wait(timeout=30)
    assert "waiting for another kvpatch process fetching a release into the cache (for v0.10.2)" in out.getvalue()
    assert (tree / HEADER).read_text() == HEADER_TEXT.format(version="0.10.2")
