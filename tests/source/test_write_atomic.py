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


def _interrupt_after_first_rename(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Ctrl-C (a real SIGINT to this process) right after the first of two renames."""
    import signal

    from kvpatch.fsutil import Staged

    done: list[Path] = []
    commit = Staged.commit

    def commit_then_interrupt(self: Staged) -> Path:
        target = commit(self)
        done.append(target)
        if len(done) == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return target

    monkeypatch.setattr(Staged, "commit", commit_then_interrupt)
    return done


def test_ctrl_c_between_two_renames_of_write_both_lands_after_both(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Before: Ctrl-C right after the first rename left the first new and the second old. After:
    the interrupt is held back until both are in place, then raised."""
    first, second = tmp_path / "kvpatch.toml", tmp_path / "t.json"
    first.write_text("old\n")
    second.write_text("old\n")
    done = _interrupt_after_first_rename(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        write_both(first, "new\n", second, "new\n")
    assert len(done) == 2 and first.read_text() == "new\n" and second.read_text() == "new\n"


@pytest.mark.slow  # applies (libclang)
def test_ctrl_c_between_the_header_and_the_state_leaves_them_in_step(tmp_path: Path, work: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Before: Ctrl-C right after the header's rename left a patched header and no state (diff,
    revert and sites then said 'no tree'). After: both are written, then the interrupt lands."""
    from kvpatch.commands import apply as A
    from kvpatch.source.state import State

    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    done = _interrupt_after_first_rename(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        A.run(A.ApplyOptions(tree=tree, cwd=work))
    assert len(done) == 2
    assert "kvpatch:begin" in (tree / HEADER).read_text()
    assert State.load(work) is not None and Path(State.load(work).tree) == tree.resolve()


@pytest.mark.slow  # applies (libclang)
def test_apply_replaces_a_symlinked_state_file_and_never_writes_through_it(tmp_path: Path, work: Path) -> None:
    """Before: a .kvpatch/state.json planted as a link made apply overwrite the file it pointed at."""
    precious = tmp_path / "precious.txt"
    precious.write_text("mine\n")
    (work / ".kvpatch").mkdir()
    (work / ".kvpatch" / "state.json").symlink_to(precious)
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    assert run_cli("apply", "--tree", str(tree), cwd=work).returncode == 0
    assert precious.read_text() == "mine\n"
    state = work / ".kvpatch" / "state.json"
    assert not state.is_symlink() and '"tree"' in state.read_text()


@pytest.mark.parametrize("target", ["file", "device"])
def test_a_replaced_link_gives_its_target_s_permissions_to_nothing(target: str, tmp_path: Path) -> None:
    """Before: kvpatch's own file written over a planted link (``stage(..., follow=False)``) took the
    link target's mode (a 0666 file, or /dev/null's 0666), so whoever planted the link chose who may
    write kvpatch's state. After: the link is replaced by a file with the umask's permissions."""
    from kvpatch.fsutil import stage

    aim = tmp_path / "theirs.json"
    if target == "file":
        aim.write_text("{}")
        aim.chmod(0o666)
    link = tmp_path / "state.json"
    link.symlink_to(aim if target == "file" else Path("/dev/null"))
    umask = os.umask(0o022)
    try:
        staged = stage(link, "{}\n", follow=False)
        staged.commit()
    finally:
        os.umask(umask)
    assert not link.is_symlink() and (link.stat().st_mode & 0o777) == 0o644
    if target == "file":
        assert (aim.stat().st_mode & 0o777) == 0o666 and aim.read_text() == "{}"
