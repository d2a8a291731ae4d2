"""A release's source distribution from a package index: find it and download it (:mod:`.unpack`
unpacks it).

The index client is pypi-simple over requests (PEP 503 HTML and PEP 691 JSON pages, yanked files,
the published sha256 checked while streaming); credentials in the index URL go to the index's own
host only, as pip sends them. A ``file://`` index (the tests' local ones) may link ``file://``
files; an http(s) index only http(s) ones. A full disk is said as one (exit 1).
"""

from __future__ import annotations

import hashlib
import os
import re
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from ..errors import FetchError
from ..fsutil.problems import machine_problem
from ..fsutil.reading import FileTooLargeError, NotRegularFileError, open_regular, parse_json

_HTTP_TIMEOUT = 60.0
_CHUNK = 1 << 16
#: The largest sdist a file:// index may hold (vLLM's are about 11 MB).
_MAX_SDIST = 1 << 30


@dataclass(frozen=True)
class _Sdist:
    filename: str
    url: str
    sha256: str | None
    size: int | None = None


def _find_sdist(index: str, version: str, *, git_reason: str = "") -> _Sdist:
    """Look up ``vllm-<version>.tar.gz`` on the index's vllm project page.

    An http(s) index is read with pypi-simple (PEP 503 HTML, PEP 691 JSON); a ``file://`` index (a local
    directory, as pip accepts) is read from disk and parsed by the same library. Every failure is a FetchError.
    """
    scheme = _index_scheme(index)
    wanted = f"vllm-{version}.tar.gz"
    try:
        packages = _local_packages(index) if scheme == "file" else _remote_packages(index)
    except FetchError:
        raise
    except _NotFound:
        where = _redact(index)
        raise FetchError(f"vLLM release {version} not found on {where} (the index has no vllm project)") from None
    except _Unreachable as exc:
        raise _no_network(index, version, exc.reason, git_reason) from None
    for pkg in packages:
        if pkg.filename == wanted:
            return _sdist_from(pkg, index)
    raise FetchError(f"vLLM release {version} not found on {_redact(index)} (no {wanted})")


class _NotFound(Exception):
    pass


class _Unreachable(Exception):
    def __init__(self, reason: object) -> None:
        super().__init__(str(reason))
        self.reason = reason


def _parse_url(url: str) -> urllib.parse.SplitResult:
    """``urlsplit`` that also checks what it parses lazily (the port, the host): a ValueError
    here ("Invalid IPv6 URL", "Port out of range") instead of later, wherever it is read."""
    parts = urllib.parse.urlsplit(url)
    _ = parts.port, parts.hostname, parts.username, parts.password
    return parts


def _index_scheme(index: str) -> str:
    """The index URL's scheme, refusing what is not an http(s) or file URL."""
    try:
        parts = _parse_url(index)
    except ValueError as exc:
        raise FetchError(f"the package index {_redact(index)!r} (PIP_INDEX_URL or pip's index-url) is not a valid "
                         f"URL ({_short_reason(exc)})") from None  # fmt: skip
    if parts.scheme in ("http", "https") and parts.hostname:
        return parts.scheme
    if parts.scheme == "file":
        return "file"
    raise FetchError(f"the package index {_redact(index)!r} (PIP_INDEX_URL or pip's index-url) is not an "
                     "http(s):// or file:// URL")  # fmt: skip


def _session():
    """A requests session as pip would set it up: its CA bundle (``PIP_CERT``), no auth of
    its own: credentials travel in the index URL and requests sends them to that URL's
    host only, and drops them on a redirect to another host or from https to http."""
    import requests

    from .. import __version__

    session = requests.Session()
    session.headers["User-Agent"] = f"kvpatch/{__version__}"
    cafile = os.environ.get("PIP_CERT")
    if cafile and Path(cafile).is_file():
        session.verify = cafile
    return session


def _remote_packages(index: str) -> list:
    import pydantic
    import requests
    from pypi_simple import NoSuchProjectError, PyPISimple, UnsupportedContentTypeError, UnsupportedRepoVersionError

    client = PyPISimple(endpoint=index.rstrip("/") + "/", session=_session())
    try:
        page = client.get_project_page("vllm", timeout=_HTTP_TIMEOUT)
    except NoSuchProjectError:
        raise _NotFound() from None
    except requests.HTTPError as exc:
        code = exc.response.status_code if exc.response is not None else "?"
        raise FetchError(f"package index {_redact(index)} answered HTTP {code} for its vllm page") from None
    except (requests.ConnectionError, requests.Timeout) as exc:
        raise _Unreachable(_short_reason(exc)) from None
    except (UnsupportedContentTypeError, UnsupportedRepoVersionError, pydantic.ValidationError, ValueError,
            KeyError, TypeError, RecursionError) as exc:  # fmt: skip  # RecursionError: JSON nested too deep
        raise FetchError(f"package index {_redact(index)} sent a vllm page kvpatch cannot read "
                         f"({type(exc).__name__}: {_short_reason(exc)})") from None  # fmt: skip
    except requests.RequestException as exc:
        raise FetchError(f"package index {_redact(index)}: {_short_reason(exc)}") from None
    return list(page.packages)


def _local_packages(index: str) -> list:
    """A ``file://`` index directory's vllm page (``index.json`` or ``index.html``)."""
    import pydantic
    from pypi_simple import ProjectPage

    folder = Path(urllib.request.url2pathname(urllib.parse.urlsplit(index).path)) / "vllm"
    if not folder.parent.is_dir():
        raise _Unreachable(f"no index directory {folder.parent}")
    base = folder.as_uri() + "/"
    try:
        if (folder / "index.json").is_file():
            data = parse_json((folder / "index.json").read_bytes())
            if not isinstance(data, dict):
                raise ValueError("the JSON page is not an object")
            data.setdefault("name", "vllm")
            data.setdefault("meta", {"api-version": "1.0"})
            page = ProjectPage.from_json_data(data, base)
        elif (folder / "index.html").is_file():
            page = ProjectPage.from_html("vllm", (folder / "index.html").read_bytes(), base)
        else:
            raise _NotFound()
    except (pydantic.ValidationError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise FetchError(f"package index {_redact(index)} has a vllm page kvpatch cannot read "
                         f"({type(exc).__name__}: {_short_reason(exc)})") from None  # fmt: skip
    return list(page.packages)


def _short_reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def _sdist_from(pkg, index: str) -> _Sdist:
    """The package's download, checked: an http(s) link (a file:// link only on a file://
    index), carrying the index's credentials exactly when it is on the index's host."""
    try:
        _parse_url(pkg.url)
    except ValueError as exc:
        raise FetchError(f"refusing the link {_redact(pkg.url)!r} on {_redact(index)}: not a valid URL "
                         f"({_short_reason(exc)})") from None  # fmt: skip
    url = _with_index_credentials(pkg.url, index)
    scheme = urllib.parse.urlsplit(url).scheme
    allowed = ("http", "https") if _index_scheme(index) != "file" else ("file",)
    if scheme not in allowed:
        raise FetchError(f"refusing the link {_redact(url)!r} on {_redact(index)}: "
                         f"only {' or '.join(allowed)} links are followed from this index")  # fmt: skip
    sha256 = (pkg.digests or {}).get("sha256")
    return _Sdist(filename=pkg.filename, url=url, sha256=sha256, size=getattr(pkg, "size", None))


def _with_index_credentials(url: str, index: str) -> str:
    """pip's rule: the index's credentials go to the index's own host (scheme, host and
    port), and only there; a link elsewhere keeps whatever it carries itself."""
    link, own = urllib.parse.urlsplit(url), urllib.parse.urlsplit(index)
    if own.username is None or link.username is not None:
        return url
    if (link.scheme, link.hostname, link.port) != (own.scheme, own.hostname, own.port):
        return url
    creds = own.netloc.rpartition("@")[0]
    return urllib.parse.urlunsplit(link._replace(netloc=f"{creds}@{link.netloc}"))


def _no_network(index: str, version: str, reason: object, git_reason: str) -> FetchError:
    git_part = f"git clone failed ({git_reason}), " if git_reason else ""
    return FetchError(
        f"no network: {git_part}cannot reach {_redact(index)} ({reason}), and nothing cached for v{version}"
    )


def _redact(url: str) -> str:
    """``url`` without a password, fit to print; never raises (a URL Python cannot parse
    has whatever stands between ``user:`` and ``@`` starred out)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return re.sub(r"(//[^/@:]*:)[^/@]*@", r"\1***@", url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{userinfo.split(':', 1)[0]}:***@{hostport}"))


# --------------------------------------------------------------------------- download and unpack


class _Bar:
    """pypi-simple's ProgressTracker, drawn with rich."""

    def __init__(self, progress: Progress, task) -> None:
        self.progress, self.task = progress, task

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def update(self, increment: int) -> None:
        self.progress.advance(self.task, increment)


def _download(sdist: _Sdist, dest: Path, console: Console) -> None:
    """Download ``sdist`` to ``dest`` with a transient progress bar; verify its sha256 while streaming."""
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=console, transient=True,
    )  # fmt: skip
    with progress:
        task = progress.add_task(f"downloading {escape(sdist.filename)}", total=sdist.size)

        def tracker(length: int | None) -> _Bar:
            if length is not None:
                progress.update(task, total=length)
            return _Bar(progress, task)

        if urllib.parse.urlsplit(sdist.url).scheme == "file":
            _copy_local(sdist, dest, tracker)
        else:
            _fetch_remote(sdist, dest, tracker)
    if sdist.sha256 is None:
        console.print(f"note: the index publishes no sha256 for {escape(sdist.filename)}; not verified")


def _fetch_remote(sdist: _Sdist, dest: Path, tracker) -> None:
    import requests
    from pypi_simple import DigestMismatchError, DistributionPackage, PyPISimple

    pkg = DistributionPackage(filename=sdist.filename, url=sdist.url, project="vllm", version=None,
                              package_type="sdist", digests={"sha256": sdist.sha256} if sdist.sha256 else {},
                              requires_python=None, has_sig=None)  # fmt: skip
    try:
        PyPISimple(session=_session()).download_package(pkg, dest, verify=sdist.sha256 is not None,
                                                         progress=tracker, timeout=_HTTP_TIMEOUT)  # fmt: skip
    except DigestMismatchError as exc:
        raise FetchError(f"sha256 mismatch for {sdist.filename}: index says {sdist.sha256}, "
                         f"downloaded {exc.actual_digest}") from None  # fmt: skip
    except requests.RequestException as exc:
        raise FetchError(f"download of {_redact(sdist.url)} failed: {_short_reason(exc)}") from None
    except OSError as exc:
        raise machine_problem(exc, dest, doing="downloading the release") or \
            FetchError(f"download of {_redact(sdist.url)} failed: {exc.strerror or exc}") from None  # fmt: skip


def _copy_local(sdist: _Sdist, dest: Path, tracker) -> None:
    """A ``file://`` index's sdist copied: a regular file of at most :data:`_MAX_SDIST` bytes (a FIFO
    or a device there would block or never end, with the release cache's lock held)."""
    digest = hashlib.sha256()
    source = Path(urllib.request.url2pathname(urllib.parse.urlsplit(sdist.url).path))
    try:
        fd, st = open_regular(source, limit=_MAX_SDIST)
        with os.fdopen(fd, "rb") as src:
            copied = 0
            with dest.open("wb") as out, tracker(st.st_size) as bar:
                while chunk := src.read(_CHUNK):
                    copied += len(chunk)
                    if copied > _MAX_SDIST:  # a file still growing
                        raise FileTooLargeError(source, copied, _MAX_SDIST)
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    except NotRegularFileError as exc:
        raise FetchError(f"cannot read {sdist.url}: {exc.kind}, not a file") from None
    except FileTooLargeError as exc:
        raise FetchError(f"cannot read {sdist.url}: {exc.size} bytes, more than any release's sdist "
                         f"({_MAX_SDIST} at most)") from None  # fmt: skip
    except OSError as exc:
        raise FetchError(f"cannot read {sdist.url}: {exc.strerror or exc}") from None
    if sdist.sha256 is not None and digest.hexdigest() != sdist.sha256.lower():
        dest.unlink(missing_ok=True)
        got = digest.hexdigest()
        raise FetchError(f"sha256 mismatch for {sdist.filename}: index says {sdist.sha256}, downloaded {got}")
