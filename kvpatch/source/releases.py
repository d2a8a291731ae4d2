"""Facts about vLLM releases, in one place: which carry the header, and its revisions."""

from __future__ import annotations

import re

from ..errors import UsageError

#: The header kvpatch patches, relative to a vLLM source tree's root.
HEADER = "csrc/attention/attention_kernels.cuh"
#: The oldest and newest releases that carry it (absent before 0.6.4, gone from 0.23.0).
FIRST = (0, 6, 4)
LAST = (0, 22, 1)
SUPPORTED = "kvpatch supports vLLM releases 0.6.4 through 0.22.1 (the releases that carry the header)"

#: The six distinct contents of the header: (representative release, releases measured
#: to share it, md5 prefix of the stock header).
REVISIONS: tuple[tuple[str, str, str], ...] = (
    ("0.6.4", "0.6.4", "545aebc6"),
    ("0.8.5", "0.7.3, 0.8.5", "0ece6395"),
    ("0.9.2", "0.9.2", "d987e8ac"),
    ("0.10.0", "0.10.0", "29fcd90b"),
    ("0.10.2", "0.10.1.1, 0.10.2, 0.11.0", "815bd481"),
    ("0.11.2", "0.11.2 ... 0.22.1", "4fe853f4"),
)


def release_tuple(version: str) -> tuple[int, ...]:
    """``'0.10.1.post1'`` -> ``(0, 10, 1)``: the numeric release, for range checks."""
    return tuple(int(part) for part in version.split(".post")[0].split("."))


def carries_header(version: str) -> bool:
    """Whether a release is in the range that ships the header."""
    return FIRST <= release_tuple(version)[:3] <= LAST


def header_digest(stock_header: str) -> str:
    """The md5 prefix :data:`REVISIONS` names a stock header by (of its text with LF line
    endings, as released, so a CRLF checkout gets its release's digest)."""
    import hashlib

    return hashlib.md5(stock_header.replace("\r\n", "\n").encode("utf-8")).hexdigest()[:8]


def revision_of(stock_header: str) -> str | None:
    """The representative release of a stock header's revision, or None if unknown."""
    digest = header_digest(stock_header)
    return next((rep for rep, _, md5 in REVISIONS if md5 == digest), None)


_VERSION_RE = re.compile(r"v?(?P<release>[0-9]+(?:\.[0-9]+)+)(?:[.-]?post(?P<post>[0-9]+))?", re.IGNORECASE)


def normalize_version(text: str) -> str:
    """Return the canonical form of a release number: ``' v0.10.2 '`` -> ``'0.10.2'``.

    Accepts digits and dots (at least ``major.minor``) with an optional ``.postN``
    and an optional leading ``v``; leading zeros are dropped as PEP 440 does.
    Anything else raises :class:`UsageError`.
    """
    if len(text.strip()) > 40:  # no release number is this long (and int() of 5000 digits fails)
        raise UsageError(f"not a vLLM release number: {text.strip()[:20]!r}... ({len(text.strip())} characters)")
    match = _VERSION_RE.fullmatch(text.strip())
    if match is None:
        raise UsageError(f"not a vLLM release number: {text.strip()!r} (expected e.g. 0.10.2 or v0.10.1.1)")
    release = ".".join(str(int(part)) for part in match["release"].split("."))
    return release + (f".post{int(match['post'])}" if match["post"] is not None else "")


def release_tag(version: str) -> str:
    """The git tag vLLM uses for a release: ``'0.10.2'`` -> ``'v0.10.2'``."""
    return f"v{normalize_version(version)}"
