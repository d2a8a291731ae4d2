"""Class: fetched content must never execute, and a crafted sdist is one line, exit 3.

An sdist carrying a ``.git`` (hooks, a config naming an fsmonitor, a gitfile pointing
elsewhere) must be refused before git ever sees it; archives crafted to break the
unpacker (odd mtimes, corrupt or truncated streams, NUL or absurd names, links out,
special files, names git refuses) end in a FetchError of one line, nothing cached."""

from __future__ import annotations

import io
import lzma
import tarfile
from pathlib import Path

import pytest
from conftest import HEADER
from source_helpers import index_with, member, quiet, sdist_members, tar_bytes

from kvpatch.errors import FetchError
from kvpatch.source import unpack
from kvpatch.source.fetch import fetch_release

TOP = "vllm-0.10.2"


@pytest.fixture
def ran(tmp_path: Path) -> Path:
    """Where a hook or fsmonitor from the archive would leave its mark."""
    return tmp_path / "it-ran"


def _fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes) -> Path:
    monkeypatch.setenv("PIP_INDEX_URL", index_with(tmp_path / "index", data).as_uri())
    return fetch_release("0.10.2", remote=str(tmp_path / "no-remote.git"), cache=tmp_path / "cache", console=quiet())


def _refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes, *needles: str) -> str:
    with pytest.raises(FetchError) as info:
        _fetch(tmp_path, monkeypatch, data)
    text = str(info.value)
    assert info.value.exit_code == 3 and "\n" not in text and len(text) < 400, text
    for needle in needles:
        assert needle in text, text
    releases = tmp_path / "cache" / "releases"
    assert [p.name for p in releases.iterdir() if p.name != ".lock"] == [], "something was cached"
    return text


def _hook(ran: Path) -> bytes:
    return f"#!/bin/sh\ntouch '{ran}'\n".encode()


GIT_PAYLOADS = {
    "post-commit-hook": lambda ran: [member(f"{TOP}/.git/hooks/post-commit", _hook(ran), mode=0o755)],
    "post-checkout-hook": lambda ran: [member(f"{TOP}/.git/hooks/post-checkout", _hook(ran), mode=0o755)],
    "fsmonitor-config": lambda ran: [
        member(f"{TOP}/.git/config", f"[core]\n\tfsmonitor = touch '{ran}'\n\thooksPath = hooks\n".encode())
    ],
    "gitfile": lambda ran: [member(f"{TOP}/.git", b"gitdir: /tmp/elsewhere\n")],
    "git-directory-only": lambda ran: [member(f"{TOP}/.git", type=tarfile.DIRTYPE, mode=0o755)],
    "git-symlink": lambda ran: [
        member(f"{TOP}/gitstuff/hooks/post-commit", _hook(ran), mode=0o755),
        member(f"{TOP}/.git", type=tarfile.SYMTYPE, linkname="gitstuff"),
    ],
    "upper-case": lambda ran: [member(f"{TOP}/.GIT/hooks/post-commit", _hook(ran), mode=0o755)],
    "nested-repository": lambda ran: [
        member(f"{TOP}/third_party/lib/.git/config", f"[core]\n\tfsmonitor = touch '{ran}'\n".encode())
    ],
    "link-into-git": lambda ran: [
        member(f"{TOP}/hook", _hook(ran), mode=0o755),
        member(f"{TOP}/.git/hooks/post-commit", type=tarfile.LNKTYPE, linkname=f"{TOP}/hook"),
    ],
}


@pytest.mark.parametrize("payload", sorted(GIT_PAYLOADS))
def test_a_git_directory_in_the_sdist_is_refused_and_never_runs(payload: str, ran: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    data = tar_bytes(sdist_members() + GIT_PAYLOADS[payload](ran))
    _refused(tmp_path, monkeypatch, data, "refusing to unpack", ".git")
    assert not ran.exists()


def _with_mtime(value: str) -> bytes:
    info, data = member(f"{TOP}/setup.py", b"print('x')\n")
    info.pax_headers = {"mtime": value}
    return tar_bytes(sdist_members() + [(info, data)])


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400"])
def test_a_non_finite_mtime_is_refused(value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _refused(tmp_path, monkeypatch, _with_mtime(value), "mtime")


@pytest.mark.parametrize(("value", "date"), [("1e300", 4_102_444_799), ("-1e300", 0), ("-5", 0)])
def test_a_huge_or_negative_mtime_is_clamped(
    value: str, date: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from source_helpers import clean_git

    info, data = member(f"{TOP}/setup.py", b"print('x')\n")
    info.pax_headers = {"mtime": value}
    members = [(i, d) for i, d in sdist_members()]
    for i, _ in members:
        i.mtime = 0 if date == 0 else 1_700_000_000
    tree = _fetch(tmp_path, monkeypatch, tar_bytes(members + [(info, data)]))
    assert (tree / HEADER).is_file()
    assert int(clean_git(tree, "log", "-1", "--format=%ct").strip()) == (date if date else 0)
    assert 0 <= (tree / "setup.py").stat().st_mtime <= 4_102_444_799


def _corrupt(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0x5A for b in data[middle : middle + 64]) + data[middle + 64 :]


def _big_sdist() -> bytes:
    import random

    rng = random.Random(7)
    blob = bytes(rng.getrandbits(8) for _ in range(200_000))  # incompressible: the corruption lands in the data
    return tar_bytes(sdist_members() + [member(f"{TOP}/blob.bin", blob)])


def _xz(corrupt: bool) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for info, data in sdist_members() + [member(f"{TOP}/blob.bin", bytes(range(256)) * 800)]:
            tar.addfile(info, io.BytesIO(data))
    data = lzma.compress(raw.getvalue())
    return _corrupt(data) if corrupt else data


def _text_sdist() -> bytes:
    import random

    rng = random.Random(7)
    words = ["kernel", "block", "cache", "warp", "float", "half", "tile", "stride"]
    text = " ".join(rng.choice(words) for _ in range(60_000)).encode()
    return tar_bytes(sdist_members() + [member(f"{TOP}/notes.txt", text)])


STREAMS = {
    "corrupt-deflate": lambda: _corrupt(_text_sdist()),
    "corrupt-stored-block": lambda: _corrupt(_big_sdist()),
    "truncated": lambda: _big_sdist()[: len(_big_sdist()) // 2],
    "truncated-header": lambda: _big_sdist()[:30],
    "empty": lambda: b"",
    "not-compressed": lambda: b"just some text, not an archive\n" * 100,
    "xz-named-tar-gz": lambda: _xz(False),
    "corrupt-xz": lambda: _xz(True),
}


@pytest.mark.parametrize("stream", sorted(STREAMS))
def test_a_broken_stream_is_one_line(stream: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _refused(tmp_path, monkeypatch, STREAMS[stream](), "vllm-0.10.2.tar.gz")


def _pax_name(name: str, **attrs) -> list:
    info, data = member(f"{TOP}/placeholder", b"x", **attrs)
    info.pax_headers = {"path": name}
    return [(info, data)]


def _pax_link(link: str) -> list:
    info, data = member(f"{TOP}/link", type=tarfile.SYMTYPE, linkname="x")
    info.pax_headers = {"linkpath": link}
    return [(info, data)]


MEMBERS = {
    "nul-in-name": lambda: _pax_name(f"{TOP}/a\x00b"),
    "nul-in-link": lambda: _pax_link("a\x00b"),
    "long-name": lambda: _pax_name(f"{TOP}/" + "a" * 5000),
    "long-path": lambda: _pax_name(f"{TOP}/" + "/".join(["d" * 200] * 40) + "/f"),
    "hard-link-out": lambda: [member(f"{TOP}/passwd", type=tarfile.LNKTYPE, linkname="/etc/passwd")],
    "hard-link-up": lambda: [member(f"{TOP}/up", type=tarfile.LNKTYPE, linkname=f"{TOP}/../outside")],
    "symlink-out": lambda: [member(f"{TOP}/out", type=tarfile.SYMTYPE, linkname="../../../etc")],
    "char-device": lambda: [member(f"{TOP}/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3)],
    "block-device": lambda: [member(f"{TOP}/sda", type=tarfile.BLKTYPE, devmajor=8, devminor=0)],
    "fifo": lambda: [member(f"{TOP}/fifo", type=tarfile.FIFOTYPE)],
    "outside-top": lambda: [member("other-top/x", b"x")],
    "absolute": lambda: _pax_name("/tmp/kvpatch-absolute-member"),
    "control-chars": lambda: _pax_name(f"{TOP}/a\nb"),
    "ntfs-git-alias": lambda: [member(f"{TOP}/sub/GIT~1/config", b"[core]\n")],
    "git-with-dot": lambda: [member(f"{TOP}/.git./config", b"[core]\n")],
}


@pytest.mark.parametrize("kind", sorted(MEMBERS))
def test_a_crafted_member_is_one_line(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _refused(tmp_path, monkeypatch, tar_bytes(sdist_members() + MEMBERS[kind]()))
    assert not Path("/tmp/kvpatch-absolute-member").exists()


def test_too_many_members_or_bytes_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decompression bomb stops at a bound, not at a full disk."""
    monkeypatch.setattr(unpack, "_MAX_MEMBERS", 10)
    many = tar_bytes(sdist_members() + [member(f"{TOP}/f{n}", b"x") for n in range(20)])
    _refused(tmp_path / "a", monkeypatch, many, "members")
    monkeypatch.setattr(unpack, "_MAX_MEMBERS", 10_000)
    monkeypatch.setattr(unpack, "_MAX_BYTES", 1000)
    big = tar_bytes(sdist_members() + [member(f"{TOP}/big", b"\0" * 5000)])
    _refused(tmp_path / "b", monkeypatch, big, "bytes")


def test_the_cli_says_one_line_with_exit_3(ran: Path, tmp_path: Path) -> None:
    from cli.cli_helpers import run_cli

    work = tmp_path / "work"
    work.mkdir()
    data = tar_bytes(sdist_members() + GIT_PAYLOADS["post-commit-hook"](ran))
    env = {"PIP_INDEX_URL": index_with(tmp_path / "index", data).as_uri(), "KVPATCH_CACHE": str(tmp_path / "cache")}
    proc = run_cli("apply", "--vllm", "0.10.2", "--remote", str(tmp_path / "none.git"), cwd=work, env=env)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and ".git" in errors[0], proc.stderr
    assert not ran.exists() and not (work / ".kvpatch" / "vllm-0.10.2").exists()
