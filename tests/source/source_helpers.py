"""Helpers shared by the tests under tests/source/ (not a test module)."""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import subprocess
import tarfile
import threading
from pathlib import Path
from typing import Iterable

from conftest import HEADER
from rich.console import Console

HEADER_TEXT = "// fake attention kernels for {version}\n"


def quiet() -> Console:
    return Console(file=io.StringIO(), width=400)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without any GIT_* variable, and no global or system git config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )
    env.update(extra)
    return env


def clean_git(cwd: Path, *args: str) -> str:
    """git in ``cwd`` as a test sees it: no leaked GIT_* variable, no user configuration."""
    return subprocess.run(["git", *args], cwd=cwd, env=clean_env(), check=True, capture_output=True, text=True).stdout


def user_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    """A user's repository with one commit."""
    path.mkdir(parents=True)
    for name, text in (files or {"README": "the user's own project\n"}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    clean_git(path, "init", "-q", "-b", "main")
    clean_git(path, "add", "-A")
    clean_git(path, "commit", "-q", "-m", "user commit")
    return path


def repo_state(path: Path) -> tuple[str, str, str, str]:
    """What must not change in a user's repository: HEAD, tags, the index, the status."""
    return (
        clean_git(path, "rev-parse", "HEAD"),
        clean_git(path, "tag", "-l"),
        clean_git(path, "ls-files", "-s"),
        clean_git(path, "status", "--porcelain", "--ignored"),
    )


def member(name: str, data: bytes = b"", **attrs) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_700_000_000
    for key, value in attrs.items():
        setattr(info, key, value)
    return info, data


def sdist_members(version: str = "0.10.2", extra: dict[str, str] | None = None) -> list[tuple[tarfile.TarInfo, bytes]]:
    top = f"vllm-{version}"
    files = {"PKG-INFO": f"Name: vllm\nVersion: {version}\n", HEADER: HEADER_TEXT.format(version=version)}
    files.update(extra or {})
    return [member(f"{top}/{name}", text.encode()) for name, text in files.items()]


def tar_bytes(members: Iterable[tuple[tarfile.TarInfo, bytes]], *, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def index_with(root: Path, data: bytes, version: str = "0.10.2", *, fmt: str = "html") -> Path:
    """A file:// index at ``root`` whose vllm-<version>.tar.gz is ``data`` (its sha256 published)."""
    project = root / "vllm"
    project.mkdir(parents=True)
    name = f"vllm-{version}.tar.gz"
    (project / name).write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    if fmt == "html":
        (project / "index.html").write_text(f'<a href="{name}#sha256={digest}">{name}</a>\n')
    else:
        import json

        (project / "index.json").write_text(
            json.dumps(
                {
                    "meta": {"api-version": "1.0"},
                    "name": "vllm",
                    "files": [{"filename": name, "url": name, "hashes": {"sha256": digest}}],
                }
            )
        )
    return root


def sdist_index(root: Path, version: str = "0.10.2", extra: dict[str, str] | None = None) -> Path:
    return index_with(root, tar_bytes(sdist_members(version, extra)), version)


def remote_repo(tmp_path: Path, version: str = "0.10.2", *, header: bool = True) -> Path:
    """A bare repository whose tag v<version> holds the header (or not)."""
    work = tmp_path / f"remote-work-{version}"
    files = {HEADER: HEADER_TEXT.format(version=version)} if header else {"README": "no header here\n"}
    user_repo(work, files)
    clean_git(work, "tag", f"v{version}")
    bare = tmp_path / f"remote-{version}.git"
    clean_git(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    return bare


class IndexServer:
    """A ThreadingHTTPServer on 127.0.0.1 whose GET answers come from ``routes(server, handler)``;
    it records each request's path and headers. ``started`` is for a slow answer to say it
    has begun, ``release`` lets slow answers finish (set on exit)."""

    def __init__(self, routes) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                owner.requests.append((self.path, dict(self.headers)))
                routes(owner, self)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "IndexServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def send(handler, code: int, body: bytes, content_type: str = "text/html", headers: dict | None = None) -> None:
    """One whole HTTP answer."""
    handler.send_response(code)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for k, v in (headers or {}).items():
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(body)
