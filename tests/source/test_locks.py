"""Class: locks. A failed apply leaves a lock file that looks held; two working
directories patching one --tree are not serialised.

The lock files stay (waiters must share one inode) but say what they are and are
never held by a dead process (flock dies with it). The tree is locked as well as the
working directory: inside the tree's git directory (never in git status), else beside
the header; ``workspace.locked`` takes both in one fixed order."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from cli.cli_helpers import run_cli
from conftest import HEADER, STOCK, fixture_text, make_tree
from source_helpers import clean_git

from kvpatch import fsutil
from kvpatch.source import workspace
from kvpatch.source.workspace import STATE_DIR, Tree, write_header_and_state


@contextmanager
def _held_in_thread(make) -> Iterator[threading.Event]:
    """Enter ``make()`` in another thread and hold it until the block ends."""
    entered, leave = threading.Event(), threading.Event()

    def body() -> None:
        with make():
            entered.set()
            leave.wait(30)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    assert entered.wait(10), "the other thread never got the lock"
    try:
        yield leave
    finally:
        leave.set()
        thread.join(10)


def test_a_failed_apply_leaves_a_lock_file_that_says_what_it_is_and_is_free(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    (tree / HEADER).write_text(fixture_text(STOCK) + "// a local edit\n")
    work = tmp_path / "work"
    work.mkdir()
    proc = run_cli("apply", "--tree", str(tree), cwd=work)
    assert proc.returncode == 4, proc.stderr
    lock = work / STATE_DIR / "lock"
    text = lock.read_text()
    assert "kvpatch" in text and "does not mean" in text and "delete" in text
    with fsutil.hold_lock(lock, timeout=0):  # nobody holds it
        pass


def test_two_working_directories_on_one_tree_are_serialised(tmp_path: Path) -> None:
    tree = Tree(make_tree(tmp_path / "vllm", fixture_text(STOCK)))
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    with _held_in_thread(lambda: workspace.locked(one, tree)):
        with pytest.raises(TimeoutError):
            with workspace.locked(two, tree, timeout=0.3):
                pass
        with workspace.locked(two, timeout=0.3):  # its own workspace alone: free
            pass
    with workspace.locked(two, tree, timeout=5):
        pass


def test_a_write_from_another_workspace_waits_for_the_tree(tmp_path: Path) -> None:
    tree = Tree(make_tree(tmp_path / "vllm", fixture_text(STOCK)))
    other = tmp_path / "other"
    other.mkdir()
    old = tree.read_header()
    done = threading.Event()

    def write() -> None:
        write_header_and_state(tree, old, old + "// from the other workspace\n", None, other)
        done.set()

    with _held_in_thread(lambda: workspace.tree_lock(tree)):
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        time.sleep(0.5)
        assert not done.is_set() and tree.read_header() == old, "the write did not wait for the tree's lock"
    writer.join(10)
    assert done.is_set() and tree.read_header().endswith("// from the other workspace\n")


def test_nested_locks_in_one_thread_do_not_deadlock(tmp_path: Path) -> None:
    tree = Tree(make_tree(tmp_path / "vllm", fixture_text(STOCK)))
    cwd = tmp_path / "work"
    cwd.mkdir()
    with workspace.locked(cwd, tree, timeout=2):
        with workspace.tree_lock(tree, timeout=2), workspace.workspace_lock(cwd, timeout=2):
            old = tree.read_header()
            write_header_and_state(tree, old, old + "// x\n", None, cwd)


def test_many_applies_from_two_workspaces_at_once(tmp_path: Path) -> None:
    """Fixed order (workspace, then tree): concurrent lockers never deadlock."""
    tree = Tree(make_tree(tmp_path / "vllm", fixture_text(STOCK)))
    errors: list[BaseException] = []
    count = [0]

    def worker(cwd: Path) -> None:
        cwd.mkdir()
        try:
            for _ in range(30):
                with workspace.locked(cwd, tree, timeout=20):
                    old = tree.read_header()
                    write_header_and_state(tree, old, old + "//\n", None, cwd)
                    count[0] += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(tmp_path / f"w{n}",), daemon=True) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and count[0] == 90
    assert tree.read_header() == fixture_text(STOCK) + "//\n" * 90  # no write lost


def test_the_tree_lock_lives_in_the_git_directory_and_not_in_git_status(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    work = tmp_path / "work"
    work.mkdir()
    assert run_cli("apply", "--tree", str(tree), cwd=work).returncode == 0
    assert workspace.tree_lock_path(Tree(tree)) == tree / ".git" / "kvpatch-lock"
    assert (tree / ".git" / "kvpatch-lock").is_file()
    status = clean_git(tree, "status", "--porcelain", "--ignored", "--untracked-files=all").splitlines()
    assert status == [f" M {HEADER}"]
    assert sorted(p.name for p in (tree / HEADER).parent.iterdir()) == ["attention_kernels.cuh"]


def test_a_worktree_is_locked_in_its_own_git_directory(tmp_path: Path) -> None:
    main = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    clean_git(main, "worktree", "add", "-q", str(tmp_path / "wt"))
    gitdir = Path(clean_git(tmp_path / "wt", "rev-parse", "--absolute-git-dir").strip())
    assert workspace.tree_lock_path(Tree(tmp_path / "wt")) == gitdir / "kvpatch-lock"


def test_a_tree_without_git_is_locked_beside_the_header(tmp_path: Path) -> None:
    tree = Tree(make_tree(tmp_path / "plain", fixture_text(STOCK), commit=False))
    assert workspace.tree_lock_path(tree) == tree.header.parent / ".kvpatch.lock"
    with workspace.tree_lock(tree, timeout=1):
        pass
    assert ".kvpatch.lock" in workspace.protected_paths(tmp_path, tree)["the tree's lock"].name


def test_a_lock_file_removed_while_waited_for_is_not_a_second_holder(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    waiter_has_it = threading.Event()
    with _held_in_thread(lambda: fsutil.hold_lock(lock)) as release_first:

        def waiter() -> None:
            with fsutil.hold_lock(lock, timeout=20):
                waiter_has_it.set()

        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        time.sleep(0.3)
        lock.unlink()  # someone deletes the lock file while it is held and waited for
        with fsutil.hold_lock(lock, timeout=1):  # a newcomer locks the new file
            release_first.set()  # the first holder lets go of the old file
            time.sleep(0.5)
            assert not waiter_has_it.is_set(), "the waiter took the deleted file's lock while the new one was held"
    thread.join(10)
    assert waiter_has_it.is_set()


@pytest.mark.parametrize("target", ["state.json", "lock"], ids=["to-a-file", "to-itself"])
def test_a_lock_that_is_a_symlink_is_said_as_one(tmp_path: Path, target: str) -> None:
    """Before: O_NOFOLLOW's "Too many levels of symbolic links", even for a link to a file. After:
    what the path is; the lock is never taken through the link, and its target is untouched."""
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    work = tmp_path / "work"
    work.mkdir()
    assert run_cli("apply", "--tree", str(tree), cwd=work).returncode == 0
    lock, state = work / STATE_DIR / "lock", (work / STATE_DIR / "state.json").read_bytes()
    lock.unlink()
    lock.symlink_to(target)
    with pytest.raises(OSError, match="is a symlink, not a regular file"):
        with fsutil.hold_lock(lock, timeout=0):
            pass
    proc = run_cli("revert", cwd=work)
    assert proc.returncode == 1 and proc.stderr.strip().endswith("lock: is a symlink, not a regular file"), proc.stderr
    assert (work / STATE_DIR / "state.json").read_bytes() == state and lock.is_symlink()
