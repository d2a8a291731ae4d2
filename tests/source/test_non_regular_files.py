"""Class: a file that is not a regular file (FIFO, socket, device) hangs kvpatch.

Inputs kvpatch reads (the header, state.json) are refused unless regular, before they
are opened for reading, in one line; an output that is a FIFO nobody reads fails after
a bounded wait instead of blocking forever."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, kvpatch_process
from conftest import HEADER, fixture_text, in_thread, make_tree

from kvpatch import fsutil
from kvpatch.errors import KvpatchError, PatchError
from kvpatch.source.workspace import STATE_DIR, State, Tree


def _make_special(path: Path, kind: str, keep: list) -> None:
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        here = os.getcwd()
        os.chdir(path.parent)  # bound by its short name: a socket's path is limited to ~108 bytes
        try:
            sock.bind(path.name)
        finally:
            os.chdir(here)
        keep.append(sock)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()


@pytest.fixture
def keep():
    held: list = []
    yield held
    for item in held:
        item.close()


@pytest.mark.slow  # a new process per command (a hang fails it instead of the run)
@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
def test_a_header_that_is_not_a_regular_file_is_refused(kind: str, tmp_path: Path, keep: list) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text())
    _make_special(tree / HEADER, kind, keep)
    work = tmp_path / "work"
    work.mkdir()
    for command in (["apply", "--tree", str(tree)], ["sites", "--tree", str(tree)], ["diff", "--tree", str(tree)]):
        assert_one_line_error(
            kvpatch_process(*command, cwd=work, timeout=30), 4, str(tree / HEADER), "not a regular file"
        )


@pytest.mark.slow  # a new process per command (a hang fails it instead of the run)
@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
def test_a_state_file_that_is_not_a_regular_file_is_the_corrupt_state_error(kind: str, tmp_path: Path,
                                                                           keep: list) -> None:  # fmt: skip
    work = tmp_path / "work"
    (work / STATE_DIR).mkdir(parents=True)
    path = work / STATE_DIR / "state.json"
    _make_special(path, kind, keep)
    for command in ("diff", "revert", "sites"):
        assert_one_line_error(
            kvpatch_process(command, cwd=work, timeout=30), 1, str(path), "delete it and run 'kvpatch apply' again"
        )
    with pytest.raises(KvpatchError, match="not a regular file"):
        State.load(work)


@pytest.mark.slow  # a new process per command (a hang fails it instead of the run)
def test_apply_over_a_fifo_state_replaces_it(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text())
    work = tmp_path / "work"
    (work / STATE_DIR).mkdir(parents=True)
    os.mkfifo(work / STATE_DIR / "state.json")
    proc = kvpatch_process("apply", "--tree", str(tree), cwd=work, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert State.load(work).tree == str(tree)


def test_read_header_refuses_before_opening(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text())
    (tree / HEADER).unlink()
    os.mkfifo(tree / HEADER)
    with pytest.raises(PatchError, match="is a FIFO, not a regular file"):
        Tree(tree).read_header()


def test_an_enormous_header_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text())
    monkeypatch.setattr(fsutil.reading, "READ_LIMIT", 1000)
    with pytest.raises(PatchError, match="bytes"):
        Tree(tree).read_header()


def test_read_regular(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"data")
    assert fsutil.read_regular(tmp_path / "f") == b"data"
    os.mkfifo(tmp_path / "p")
    with pytest.raises(fsutil.NotRegularFileError) as info:
        fsutil.read_regular(tmp_path / "p")
    assert info.value.kind == "a FIFO" and isinstance(info.value, OSError)
    with pytest.raises(IsADirectoryError):
        fsutil.read_regular(tmp_path)
    with pytest.raises(FileNotFoundError):
        fsutil.read_regular(tmp_path / "missing")
    with pytest.raises(fsutil.FileTooLargeError):
        fsutil.read_regular(tmp_path / "f", limit=3)


def test_an_output_fifo_without_a_reader_fails_instead_of_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fsutil.files, "FIFO_WAIT", 0.5, raising=False)
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    start = time.monotonic()
    finished, error = in_thread(lambda: fsutil.write_atomic(fifo, "the patch\n"), 10)
    assert finished, "write_atomic blocked on a FIFO nobody reads"
    assert isinstance(error, OSError) and "no process reads" in str(error), error
    assert time.monotonic() - start < 5
    assert fifo.exists() and not fifo.is_file()  # still the FIFO: written in place, never replaced


def test_an_output_fifo_with_a_late_reader_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fsutil.files, "FIFO_WAIT", 10, raising=False)
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def reader() -> None:
        time.sleep(0.3)
        with open(fifo, "rb") as f:
            got.append(f.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    finished, error = in_thread(lambda: fsutil.write_atomic(fifo, "x" * 200_000), 20)
    thread.join(10)
    assert finished and error is None, error
    assert got == [b"x" * 200_000]


def test_an_input_that_is_no_regular_file_is_said_in_kvpatchs_words(tmp_path: Path) -> None:
    """'config file f is a FIFO, not a regular file', not '[Errno 22] ...: 'f'' (errno's number and the path twice)."""
    from kvpatch.errors import UsageError
    from kvpatch.fsutil import read_input

    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(UsageError) as e:
        read_input(fifo, "config file")
    assert str(e.value) == f"config file {fifo} is a FIFO, not a regular file"
