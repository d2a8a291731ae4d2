"""The files kvpatch touches: the target tree, its header, and the record of the last apply.

This is the I/O edge around :mod:`kvpatch.patch.plan`. ``apply`` reads the header, asks
:func:`kvpatch.patch.plan.patch` for new text, refuses when the header carries edits
kvpatch did not make, and writes atomically. The last apply in a directory is
remembered in ``.kvpatch/state.json`` so that ``diff``, ``build`` and ``revert``
need no arguments.

Everything that changes a workspace (the checkout under ``.kvpatch/``, the header,
``state.json``) happens under one lock per workspace, ``.kvpatch/lock``, and every
write of a tree's header under the tree's lock (in its git directory, else beside the
header); :func:`locked` takes both, in that order. The header and the state are
written as one step (:func:`write_header_and_state`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from .. import fsutil
from ..errors import BuildError, KvpatchError, PatchError
from ..fsutil import Staged, deferred_signals, stage, write_atomic
from . import git as gitcmd
from .releases import HEADER
from .state import LOCK_FILE, STATE_DIR, STATE_FILE, State, check_utf8, resolve_tree  # noqa: F401  (kept importable from here)
from .tree import HeaderSnapshot, Tree, check_no_local_edits, sha256, unified_diff  # noqa: F401

__all__ = [
    "STATE_DIR", "HeaderSnapshot", "State", "Tree", "check_header_writable", "check_no_local_edits", "checkout",
    "locked", "protected_paths", "remove_stale_temps", "resolve_tree", "sha256", "tree_lock", "tree_lock_path",
    "unified_diff", "workspace_lock", "write_atomic", "write_header_and_state",
]  # fmt: skip


# --------------------------------------------------------------------------- writing a workspace


def protected_paths(cwd: Path, tree: Tree | None = None) -> dict[str, Path]:
    """What no output of a command run in ``cwd`` may overwrite, by what it is: kvpatch's
    state directory (``.kvpatch/``: the state, the lock, the checkouts; all of it), and of the
    tree (``tree``, else the tree the last apply here recorded, if any) its header, its sources
    (``csrc/``: the files the header includes, which kvpatch reads) and its git directory; and
    kvpatch's release and build caches. For :func:`kvpatch.fsutil.check_outputs`'s ``protected``."""
    from .cache import cache_folders

    paths = {f"kvpatch's state directory {STATE_DIR}/": cwd / STATE_DIR, **cache_folders()}
    if tree is None:
        try:
            state = State.load(cwd)
        except KvpatchError:  # a corrupt state names no tree; the command says so itself
            state = None
        tree = Tree(check_utf8(Path(state.tree), "the tree the last apply here used,")) if state is not None else None
    if tree is not None:
        paths["the tree's header"] = tree.header
        paths["the tree's lock"] = tree_lock_path(tree)
        paths["the tree's sources (csrc/)"] = tree.root / "csrc"
        paths["the tree's git directory"] = tree.root / ".git"
    return paths


#: The tree's lock: in its git directory (never in ``git status``), else beside the header.
TREE_LOCK_IN_GIT = "kvpatch-lock"
TREE_LOCK_BESIDE_HEADER = ".kvpatch.lock"


@contextlib.contextmanager
def workspace_lock(cwd: Path, *, timeout: float | None = None,
                   on_wait: Callable[[], None] | None = None) -> Iterator[None]:  # fmt: skip
    """Hold ``cwd/.kvpatch/lock``: one apply/revert at a time changes this workspace.

    The file stays after the command (waiters must share its inode) and says so in its
    text; only a running kvpatch holds it (:func:`kvpatch.fsutil.hold_lock`)."""
    folder = cwd / STATE_DIR
    try:
        folder.mkdir(exist_ok=True)
    except FileExistsError:
        raise KvpatchError(f"{folder} is not a directory; move it away") from None
    with fsutil.hold_lock(folder / LOCK_FILE, timeout=timeout, on_wait=on_wait,
                          what=f"this workspace ({folder})"):  # fmt: skip
        yield


def _git_dir(root: Path) -> Path | None:
    """The git directory of the checkout at ``root`` where the tree's lock may go, read from the
    files (never from ``GIT_DIR``): ``root/.git`` when it is a directory inside the tree, or the
    directory a ``.git`` file names when that is git's own record of this very worktree (its
    ``gitdir`` file points back at ``root/.git``, as ``git worktree add`` writes it). Anything
    else (a ``.git`` link, a submodule, a crafted ``gitdir: /elsewhere``) is None: the lock
    goes beside the header, and kvpatch creates nothing in a directory the tree merely names."""
    dotgit = root / ".git"
    try:
        if dotgit.is_symlink():
            return None
        if dotgit.is_dir():
            inside = os.path.realpath(dotgit).startswith(os.path.join(os.path.realpath(root), ""))
            return dotgit if inside else None
        first = fsutil.read_regular(dotgit, limit=4096).decode("utf-8").splitlines()[0]
        if not first.startswith("gitdir:"):
            return None
        target = Path(first[len("gitdir:") :].strip())
        target = target if target.is_absolute() else root / target
        back = fsutil.read_regular(target / "gitdir", limit=4096).decode("utf-8").strip()
        linked = os.path.realpath(back) == os.path.realpath(dotgit)
    except (OSError, ValueError, IndexError):  # (UnicodeDecodeError is a ValueError)
        return None
    return target if linked and target.is_dir() else None


def _tree_lock_candidates(tree: Tree) -> list[Path]:
    gitdir = _git_dir(tree.root)
    beside = fsutil.resolve_target(tree.header).parent / TREE_LOCK_BESIDE_HEADER
    return ([gitdir / TREE_LOCK_IN_GIT] if gitdir is not None else []) + [beside]


def tree_lock_path(tree: Tree) -> Path:
    """Where the tree's lock lives: ``<git dir>/kvpatch-lock`` for a git checkout (no
    ``git status`` shows it), else ``.kvpatch.lock`` beside the (resolved) header."""
    return _tree_lock_candidates(tree)[0]


@contextlib.contextmanager
def tree_lock(tree: Tree, *, timeout: float | None = None,
              on_wait: Callable[[], None] | None = None) -> Iterator[None]:  # fmt: skip
    """Hold the tree's lock (:func:`tree_lock_path`): one kvpatch at a time writes a
    tree's header, whichever working directory it runs in. Re-entrant in a thread.

    Where the git directory cannot take a file (read-only, another user's), the lock
    beside the header is used; where neither can, the tree cannot be written either
    and nothing is locked (the write fails on its own, in one line)."""
    unlockable = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR)
    with contextlib.ExitStack() as stack:
        for path in _tree_lock_candidates(tree):
            try:
                stack.enter_context(fsutil.hold_lock(path, timeout=timeout, on_wait=on_wait,
                                                     what=f"the tree {tree.root}"))  # fmt: skip
                break
            except TimeoutError:
                raise
            except OSError as e:
                if e.errno not in unlockable:
                    raise
        yield


@contextlib.contextmanager
def locked(cwd: Path, tree: Tree | None = None, *, timeout: float | None = None,
           on_wait: Callable[[], None] | None = None) -> Iterator[None]:  # fmt: skip
    """Hold the workspace's lock, then the tree's (``tree``; None: the workspace's only).

    Always in that order, and a tree lock is never held while waiting for a workspace
    lock: two commands cannot deadlock. Hold it from reading the header to writing it,
    so that two working directories patching one ``--tree`` run one after the other."""
    with workspace_lock(cwd, timeout=timeout, on_wait=on_wait):
        if tree is None:
            yield
            return
        with tree_lock(tree, timeout=timeout, on_wait=on_wait):
            yield


def check_header_writable(tree: Tree, *, force_write: bool = False) -> None:
    """Refuse (PatchError) to replace a header its owner made read-only (no owner write
    bit: root passes every access check, so the mode is read too) or this user may not
    write (``os.access``): the atomic rename would replace it regardless of its
    permissions. ``force_write`` (a ``--force-write`` option) replaces it anyway; the new
    header keeps the old one's mode. A missing header is left to the reader to report."""
    if force_write:
        return
    try:
        mode = os.stat(tree.header).st_mode
    except OSError:
        return
    octal = f"{stat.S_IMODE(mode):04o}"
    if not mode & stat.S_IWUSR:
        raise PatchError(f"{tree.header} is read-only (mode {octal}): kvpatch leaves it as it is; make it "
                         "writable (chmod u+w), or give --force-write to replace it keeping its mode")  # fmt: skip
    if not os.access(tree.header, os.W_OK):
        if _read_only_mount(tree.header):  # not the file's mode: nothing can write there
            raise PatchError(f"{tree.header} is on a read-only file system: kvpatch leaves it as it is (copy the "
                             "tree somewhere writable, or mount it read-write)")  # fmt: skip
        raise PatchError(f"{tree.header} is not writable by this user (mode {octal}): kvpatch leaves it as it is "
                         "(--force-write replaces it where its folder is writable)")  # fmt: skip


def _read_only_mount(path: Path) -> bool:
    """Whether ``path`` lies on a file system mounted read-only."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def write_header_and_state(tree: Tree, old: str, new: str | None, state: State | None, cwd: Path, *,
                           seen: HeaderSnapshot | None = None, force_write: bool = False) -> None:  # fmt: skip
    """Write the header (``new``; None = unchanged) and the state as one step, state last.

    The state is written to a temporary file first (a full disk fails there, before
    the header changes); then the header's replacement is staged beside it; then the
    header is checked against ``old``, the text the caller read (and ``seen``, the
    snapshot of that read, when given: the same file, not rewritten since): a header
    saved by someone else meanwhile is a PatchError and keeps their text; then the
    header is renamed into place, then the state file. If that last step fails, the
    header is put back as it was.

    All of it under the tree's lock (:func:`tree_lock`). First, the temporary files
    killed writes left beside the header and in ``.kvpatch/`` are removed
    (:func:`remove_stale_temps`); a header that is read-only, or not this user's to
    write, is refused before anything is written (:func:`check_header_writable`),
    unless ``force_write``.
    """
    with tree_lock(tree):  # re-entrant: held already under locked(cwd, tree)
        _write_header_and_state(tree, old, new, state, cwd, seen=seen, force_write=force_write)


def _write_header_and_state(tree: Tree, old: str, new: str | None, state: State | None, cwd: Path, *,
                            seen: HeaderSnapshot | None, force_write: bool) -> None:  # fmt: skip
    changing = new is not None and new != old
    remove_stale_temps(tree, cwd)
    if changing:
        check_header_writable(tree, force_write=force_write)
    try:
        staged: Staged | None = stage(State.path(cwd), state.text(), follow=False) if state is not None else None
    except OSError as e:  # a full disk, said with the file (the header is not touched yet)
        problem = fsutil.machine_problem(e, State.path(cwd), doing="writing the state (the header is unchanged)")
        if problem is None:
            raise
        raise problem from None
    header: Staged | None = None
    try:
        if changing:
            header = _stage_header(tree, new)
            _check_unchanged(tree, old, seen)
        with deferred_signals():  # an interrupt between the two renames would leave them out of step
            if header is not None:
                try:
                    header.commit()
                except OSError as e:
                    raise _write_failed(tree, e) from None
            if staged is not None:
                try:
                    staged.commit()
                except BaseException:
                    if changing:
                        with contextlib.suppress(Exception):
                            write_atomic(tree.header, old)
                    raise
    finally:
        for pending in (header, staged):
            if pending is not None:
                pending.discard()


def remove_stale_temps(tree: Tree, cwd: Path) -> list[Path]:
    """Remove the temporary files killed writes left beside the (resolved) header and in
    ``cwd/.kvpatch/`` (:func:`kvpatch.fsutil.remove_stale_temps`: kvpatch's exact
    names, older than a few seconds). Called by every write, under the tree's lock."""
    header = fsutil.resolve_target(tree.header)
    return fsutil.remove_stale_temps(header.parent, [header.name]) + fsutil.remove_stale_temps(cwd / STATE_DIR)


def _stage_header(tree: Tree, text: str) -> Staged:
    try:
        return fsutil.stage(tree.header, text)
    except OSError as e:
        raise _write_failed(tree, e) from None


def _write_failed(tree: Tree, e: OSError) -> KvpatchError:
    """Why the header could not be written: a full disk or a path too long as what it is
    (:func:`kvpatch.fsutil.machine_problem`), anything else a PatchError (exit 4)."""
    problem = fsutil.machine_problem(e, tree.header, doing="writing the header (it is unchanged)")
    if problem is not None:
        return problem
    return PatchError(f"cannot write {tree.header}: {e.strerror or e} (the header is unchanged)")


def _check_unchanged(tree: Tree, old: str, seen: HeaderSnapshot | None) -> None:
    """Refuse (PatchError) when the header is no longer what the caller read."""
    data, st = tree._read()
    if data != old.encode("utf-8") or (seen is not None and HeaderSnapshot.of(st) != seen):
        raise PatchError(f"{tree.header} changed while kvpatch was patching it (saved by an editor or another "
                         "program?); it is left as it is now, with those changes: run the command again")  # fmt: skip


# --------------------------------------------------------------------------- checkout


def _same_device(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` (existing paths) are on one file system: git can hardlink."""
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return False


@contextlib.contextmanager
def _reading(repo: Path, folder: Path) -> Iterator[dict[str, str]]:
    """The environment of a git command that reads ``repo``, kvpatch's cached release. A cache
    another user owns (a shared one) is refused by git ("dubious ownership") unless a protected
    configuration names it safe, and git before 2.45 takes no ``-c safe.directory`` from the
    command line: then the command gets a global configuration of kvpatch's own (a file in
    ``folder``, removed after it), which names this repository, and nothing else, as safe."""
    try:
        foreign = os.stat(repo / ".git").st_uid != os.geteuid()
    except OSError:
        foreign = False
    names = {str(repo / ".git"), str(repo), os.path.realpath(repo / ".git"), os.path.realpath(repo)}
    if not foreign or any(c in name for name in names for c in '\n"\\'):  # (not quotable: git says why)
        yield gitcmd.own_env()
        return
    fd, config = tempfile.mkstemp(prefix=".kvpatch-git-config.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write("[safe]\n" + "".join(f'\tdirectory = "{name}"\n' for name in sorted(names)))
        yield gitcmd.own_env(extra={"GIT_CONFIG_GLOBAL": config})
    finally:
        os.unlink(config)


def checkout(release_tree: Path, dest: Path, tag: str) -> None:
    """A private clone of the cached pristine release at ``dest``.

    Objects are hardlinked when the cache is on the working directory's file system and
    copied otherwise, or when linking fails there (``fs.protected_hardlinks``, a cache
    another user owns). Call under :func:`workspace_lock`. A ``dest`` left empty or
    broken (no ``.git``, no header) is replaced; a ``.partial`` clone of a killed run is
    removed first.
    """
    release_tree, dest = Path(release_tree).absolute(), Path(dest).absolute()
    if (dest / ".git").exists() and (dest / HEADER).exists():
        return
    if dest.is_dir() and not any(dest.iterdir()):
        dest.rmdir()  # an empty directory (an interrupted run, a user's mkdir): repaired
    elif dest.exists():
        raise KvpatchError(f"{dest} is not a complete checkout (no .git or no {HEADER}); delete it and run again")
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    git = shutil.which("git")
    if git is None:
        raise BuildError(f"git not found on PATH: checking out {tag} into {dest} needs it (install git)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    modes = ["--local", "--no-hardlinks"] if _same_device(release_tree / ".git" / "objects", dest.parent) \
        else ["--no-hardlinks"]  # fmt: skip
    try:
        for mode in modes:
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                with _reading(release_tree, dest.parent) as env:
                    gitcmd.run(gitcmd.own(git, "clone", "--quiet", "--template=", mode, "--branch", tag, "--",
                                          release_tree, tmp), env=env)  # fmt: skip
                break
            except gitcmd.GitFailed as e:
                if mode != modes[-1]:
                    continue  # hardlinking failed (or something else did: a copy says which)
                problem = fsutil.problem_in_text(e.stderr, dest, doing=f"checking out {tag}")
                if problem is not None:  # a full disk, a path too long: not a damaged cache
                    raise problem from None
                if "dubious ownership" in e.stderr:
                    raise KvpatchError(f"git refuses to read the cached release {release_tree}: it belongs to another "
                                       f"user ({e.reason()}); set KVPATCH_CACHE to a cache of your own") from None  # fmt: skip
                raise KvpatchError(
                    f"could not check out {tag} from the cached release {release_tree} ({e.reason()}); "
                    f"if the cache is damaged, delete {release_tree} and run again"
                ) from None
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
