"""How kvpatch writes a file: atomically (an interrupted write leaves the old file), through
symlinks to where the file really lives (the links stay links), in place on a device or pipe;
two files as one step (both or neither)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from cli.cli_helpers import run_cli
from conftest import HEADER, STOCK, fixture_text, golden_text, make_tree

from kvpatch.fsutil import write_atomic, write_both


def test_interrupted_write_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f.txt"
    target.write_text("old\n")

    def interrupt(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


def test_write_atomic_through_a_symlink_chain(tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_text("old")
    real.chmod(0o640)
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to(real)
    write_atomic(tmp_path / "a", "new")
    assert (tmp_path / "a").is_symlink() and (tmp_path / "b").is_symlink()
    assert real.read_text() == "new" and (real.stat().st_mode & 0o777) == 0o640
    (tmp_path / "dangling").symlink_to(tmp_path / "sub" / "made.txt")
    write_atomic(tmp_path / "dangling", "x")
    assert (tmp_path / "dangling").is_symlink() and (tmp_path / "sub" / "made.txt").read_text() == "x"


def test_write_atomic_to_a_device_writes_in_place(tmp_path: Path) -> None:
    """``diff -o /dev/stdout`` as root replaced the device link; a FIFO stands in for it here."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "link").symlink_to(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_atomic(tmp_path / "link", "through the pipe")
    reader.join(10)
    assert got == [b"through the pipe"]
    assert fifo.exists() and not fifo.is_file() and (tmp_path / "link").is_symlink()


def test_write_both_writes_neither_when_the_second_cannot_be_staged(tmp_path: Path) -> None:
    first = tmp_path / "kvpatch.toml"
    first.write_text("# mine\n")
    with pytest.raises(IsADirectoryError):
        write_both(first, "new\n", tmp_path, "{}")
    assert first.read_text() == "# mine\n"
    write_both(first, "new\n", tmp_path / "t.json", "{}")
    assert first.read_text() == "new\n" and (tmp_path / "t.json").read_text() == "{}"
    write_both(first, "newer\n", "/dev/null", "{}")  # a device: written in place, not replaced
    assert first.read_text() == "newer\n" and Path("/dev/null").is_char_device()


@pytest.mark.slow  # applies (libclang)
def test_symlinked_header_is_patched_at_its_target(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    real = tmp_path / "elsewhere" / "attention_kernels.cuh"
    real.parent.mkdir()
    (tree / HEADER).rename(real)
    (tree / HEADER).symlink_to(real)
    proc = run_cli("apply", "--tree", str(tree), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert (tree / HEADER).is_symlink() and os.readlink(tree / HEADER) == str(real)
    assert real.read_text() == golden_text("default")
    assert run_cli("revert", cwd=work).returncode == 0
    assert (tree / HEADER).is_symlink() and real.read_text() == fixture_text(STOCK)
