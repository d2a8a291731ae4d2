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
import difflib
import errno
import hashlib
import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..errors import BuildError, KvpatchError, PatchError, UsageError
from .. import fsutil
from ..fsutil import Staged, stage, write_atomic
from . import git as gitcmd
from .releases import HEADER, revision_of

__all__ = [
    "STATE_DIR", "HeaderSnapshot", "State", "Tree", "check_header_writable", "check_no_local_edits", "checkout",
    "locked", "protected_paths", "remove_stale_temps", "resolve_tree", "tree_lock", "tree_lock_path", "unified_diff",
    "workspace_lock", "write_atomic", "write_header_and_state",
]  # fmt: skip

STATE_DIR = ".kvpatch"
STATE_FILE = "state.json"
LOCK_FILE = "lock"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _lf(text: str) -> str:
    return text.replace("\r\n", "\n")


# --------------------------------------------------------------------------- the tree


@dataclass(frozen=True)
class HeaderSnapshot:
    """Which file a header read came from, and when it was last written."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @staticmethod
    def of(st: os.stat_result) -> HeaderSnapshot:
        return HeaderSnapshot(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class Tree:
    """A vLLM source tree kvpatch patches."""

    root: Path

    @property
    def header(self) -> Path:
        return self.root / HEADER

    def read_header(self) -> str:
        """The header's text (CRLF kept); one-line errors for every way reading can fail."""
        return self.read_header_snapshot()[0]

    def read_header_snapshot(self) -> tuple[str, HeaderSnapshot]:
        """The header's text and a snapshot of the file it was read from, for
        :func:`write_header_and_state` (``seen=``) to tell whether it changed since."""
        data, st = self._read()
        return self._decode(data), HeaderSnapshot.of(st)

    def read_header_bytes(self) -> bytes:
        """The header's bytes; refused (PatchError) unless it is a regular file: a FIFO,
        socket or device is never opened for reading (it could block forever)."""
        return self._read()[0]

    def _decode(self, data: bytes) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            raise PatchError(
                f"{self.header} is not UTF-8 (byte 0x{data[e.start]:02x} at line {line}): "
                "kvpatch patches vLLM's UTF-8 header only"
            ) from None

    def _read(self) -> tuple[bytes, os.stat_result]:
        try:
            return fsutil.read_regular_with_stat(self.header)
        except FileNotFoundError:
            raise PatchError(f"{self.root} has no {HEADER}: not a supported vLLM tree") from None
        except IsADirectoryError:
            raise PatchError(f"{self.header} is a directory, not vLLM's header") from None
        except fsutil.NotRegularFileError as e:
            raise PatchError(f"{self.header} is {e.kind}, not a regular file: kvpatch reads and replaces "
                             "vLLM's header file only") from None  # fmt: skip
        except fsutil.FileTooLargeError as e:
            raise PatchError(f"{self.header} is {e.size} bytes: not vLLM's header (kvpatch reads at most "
                             f"{e.limit})") from None  # fmt: skip
        except OSError as e:
            raise PatchError(f"cannot read {self.header}: {e.strerror or e}") from None

    def committed_header(self) -> tuple[str | None, str]:
        """(the header as committed at HEAD, '') or (None, why it cannot be read)."""
        if not (self.root / ".git").exists():
            return None, f"{self.root} is not a git checkout"
        git = shutil.which("git")
        if git is None:
            return None, "git is not on PATH"
        try:  # the user's configuration (safe.directory, autocrlf), never a leaked GIT_DIR
            out = gitcmd.run(gitcmd.user(git, self.root, "show", f"HEAD:{HEADER}"), env=gitcmd.user_env())
        except OSError as e:
            return None, f"git cannot run ({e.strerror or e})"
        except gitcmd.GitFailed as e:
            lines = [line.strip() for line in e.stderr.splitlines() if line.strip()]
            why = next((line for line in lines if "dubious ownership" in line), lines[-1] if lines else "")
            return None, f"'git show HEAD:{HEADER}' failed ({why.removeprefix('fatal: ')[:120]})"
        try:
            return out.decode("utf-8"), ""
        except UnicodeDecodeError:
            return None, "the committed header is not UTF-8"


def check_no_local_edits(tree: Tree, stock: str, *, unpatch: Callable[[str], str],
                         state: State | None = None, note: Callable[[str], None] = print) -> None:  # fmt: skip
    """Refuse when the header, minus kvpatch's own injection, has edits kvpatch did not make.

    The stock text is compared with, in order of preference:

    1. the header committed at HEAD (a committed *patched* header counts as its stock
       text, ``unpatch`` strips it; line endings are compared normalised, so
       ``core.autocrlf`` does not make a fresh checkout look edited);
    2. where git cannot answer (no ``.git``, git missing, "dubious ownership"): the
       sha256 of the stock text the last apply in this workspace recorded for this
       tree, and the md5 of every recorded release header (``releases.REVISIONS``);
    3. where neither exists, the check is off, and ``note`` says so in one line.
    """
    committed, why = tree.committed_header()
    refuse = (f"{tree.header} has local edits kvpatch did not make; commit or stash them, "
              "or pass --force to patch on top of them")  # fmt: skip
    if committed is not None:
        if committed != stock and _lf(committed) != _lf(stock):
            base = unpatch(committed)  # HEAD may hold a patched header (committed after apply)
            if base != stock and _lf(base) != _lf(stock):
                raise PatchError(refuse)
        return
    recorded = state.stock_sha256 if state is not None and state.tree == str(tree.root) else None
    if recorded:
        if sha256(stock) != recorded:
            raise PatchError(f"{tree.header} changed since the last apply here ({why}, so compared with the "
                             "sha256 recorded in .kvpatch/state.json); pass --force to patch it anyway")  # fmt: skip
        return
    if revision_of(stock) is not None:
        return
    note(f"note: local-edit check off: {why}, and the header matches no recorded vLLM release "
         "header, so edits made outside kvpatch cannot be detected")  # fmt: skip


def _lines(text: str) -> list[str]:
    """Lines as git and patch see them: ended by ``\n`` only (``str.splitlines`` also
    splits at form feeds, U+2028 and other breaks, which made patches git rejects)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def unified_diff(stock: str, patched: str, path: str = HEADER) -> str:
    """A patch of ``stock`` -> ``patched`` that ``git apply`` and ``patch -p1`` accept."""
    if stock == patched:
        return ""
    lines = list(
        difflib.unified_diff(
            _lines(stock),
            _lines(patched),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
    )
    out = [f"diff --git a/{path} b/{path}\n"]
    for line in lines:
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)


# --------------------------------------------------------------------------- state


@dataclass(frozen=True)
class State:
    """What the last ``apply`` in a directory did."""

    tree: str
    version: str | None
    config: dict
    marker: str | None = None  # the configuration's marker text, as written into the header
    stock_sha256: str | None = None  # sha256 of the header's stock text at apply time

    @staticmethod
    def path(cwd: Path) -> Path:
        return cwd / STATE_DIR / STATE_FILE

    def text(self) -> str:
        return json.dumps(self.__dict__, indent=2) + "\n"

    def save(self, cwd: Path) -> None:
        """Replace the state file (whatever is there: a FIFO is replaced, never written into)."""
        staged = stage(State.path(cwd), self.text())
        try:
            staged.commit()
        finally:
            staged.discard()

    @staticmethod
    def load(cwd: Path) -> State | None:
        path = State.path(cwd)
        try:
            data = json.loads(fsutil.read_regular(path).decode("utf-8"))
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise KvpatchError(f"{path} is a directory; delete it and run 'kvpatch apply' again") from None
        except (fsutil.NotRegularFileError, fsutil.FileTooLargeError) as e:
            raise KvpatchError(f"{path} {e.strerror}: not the file kvpatch writes; delete it and run "
                               "'kvpatch apply' again") from None  # fmt: skip
        except OSError as e:
            raise KvpatchError(f"cannot read {path}: {e.strerror or e}") from None
        except ValueError as e:  # not UTF-8 / not JSON
            raise KvpatchError(f"corrupt {path} ({str(e).splitlines()[0][:80]}); delete it and run "
                               "'kvpatch apply' again") from None  # fmt: skip
        except RecursionError:
            raise KvpatchError(f"corrupt {path} (JSON nested too deep); delete it and run "
                               "'kvpatch apply' again") from None  # fmt: skip
        ok = (
            isinstance(data, dict)
            and isinstance(data.get("tree"), str) and data["tree"] and "\0" not in data["tree"]
            and isinstance(data.get("version"), (str, type(None)))
            and isinstance(data.get("config"), dict)
            and isinstance(data.get("marker"), (str, type(None)))
            and isinstance(data.get("stock_sha256"), (str, type(None)))
        )  # fmt: skip
        if not ok:
            raise KvpatchError(f"corrupt {path} (not the object kvpatch writes); delete it and run "
                               "'kvpatch apply' again")  # fmt: skip
        if data["version"] is not None and not _canonical(data["version"]):
            shown = repr(data["version"]) if len(data["version"]) <= 40 else repr(data["version"][:37]) + "..."
            raise KvpatchError(f"corrupt {path} (version {shown} is not a release number as kvpatch writes it); "
                               "delete it and run 'kvpatch apply' again")  # fmt: skip
        return State(tree=data["tree"], version=data["version"], config=data["config"],
                     marker=data.get("marker"), stock_sha256=data.get("stock_sha256"))  # fmt: skip


def _canonical(version: str) -> bool:
    """Whether ``version`` is a release number as :func:`kvpatch.source.fetch.normalize_version`
    returns it (``'0.10.2'``; not ``'v0.10.2'``, ``'0.10.02'``, ``'0.10.2\\n'``, ``''``)."""
    from .fetch import normalize_version

    try:
        return normalize_version(version) == version
    except UsageError:
        return False


def resolve_tree(tree: Path | None, cwd: Path) -> Tree:
    """``--tree`` if given, else the tree the last ``apply`` in ``cwd`` used."""
    if tree is not None:
        try:
            path = (cwd / tree).resolve() if not tree.is_absolute() else tree.resolve()
            path.stat()
        except FileNotFoundError:
            pass  # said below
        except (RuntimeError, OSError) as e:  # a symlink loop (RuntimeError on 3.11), a name too long
            why = getattr(e, "strerror", None) or str(e).split(" from ")[0] or type(e).__name__
            shown = str(tree) if len(str(tree)) <= 80 else str(tree)[:77] + "..."
            raise UsageError(f"--tree {shown}: cannot resolve it ({why})") from None
        if not path.exists():
            raise UsageError(f"--tree {tree}: no such directory")
        if not path.is_dir():
            raise UsageError(f"--tree {tree} is not a directory (give the vLLM checkout's root)")
        return Tree(path)
    state = State.load(cwd)
    if state is None:
        raise UsageError("no tree: run 'kvpatch apply --vllm X' here first, or pass --tree PATH")
    if not Path(state.tree).is_dir():
        again = f"kvpatch apply --vllm {state.version}" if state.version else "kvpatch apply --tree PATH"
        raise UsageError(f"the tree the last apply here used, {state.tree}, is gone (recorded in "
                         f"{State.path(cwd)}): pass --tree PATH, or run '{again}'")  # fmt: skip
    return Tree(Path(state.tree))


# --------------------------------------------------------------------------- writing a workspace


def protected_paths(cwd: Path, tree: Tree | None = None) -> dict[str, Path]:
    """What no output of a command run in ``cwd`` may overwrite, by what it is: kvpatch's
    state directory (``.kvpatch/``: the state, the lock, the checkouts; all of it) and
    the tree's header (``tree``, else the tree the last apply here recorded, if any).
    For :func:`kvpatch.fsutil.check_outputs`'s ``protected``."""
    paths = {f"kvpatch's state directory {STATE_DIR}/": cwd / STATE_DIR}
    if tree is None:
        try:
            state = State.load(cwd)
        except KvpatchError:  # a corrupt state names no tree; the command says so itself
            state = None
        tree = Tree(Path(state.tree)) if state is not None else None
    if tree is not None:
        paths["the tree's header"] = tree.header
        paths["the tree's lock"] = tree_lock_path(tree)
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
    """The git directory of the checkout at ``root``: ``root/.git``, or where a ``.git``
    file (a worktree, a submodule) points. Read from the files, never from ``GIT_DIR``."""
    dotgit = root / ".git"
    if dotgit.is_dir():
        return dotgit
    try:
        first = fsutil.read_regular(dotgit, limit=4096).decode("utf-8").splitlines()[0]
    except (OSError, UnicodeDecodeError, IndexError):
        return None
    if not first.startswith("gitdir:"):
        return None
    target = Path(first[len("gitdir:"):].strip())
    target = target if target.is_absolute() else root / target
    return target if target.is_dir() else None


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
                         "writable (chmod u+w) to patch it")  # fmt: skip
    if not os.access(tree.header, os.W_OK):
        raise PatchError(f"{tree.header} is not writable by this user (mode {octal}): kvpatch leaves it as it is")


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
    staged: Staged | None = stage(State.path(cwd), state.text()) if state is not None else None
    header: Staged | None = None
    try:
        if changing:
            header = _stage_header(tree, new)
            _check_unchanged(tree, old, seen)
            try:
                header.commit()
            except OSError as e:
                raise PatchError(f"cannot write {tree.header}: {e.strerror or e} (the header is unchanged)") from None
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
        raise PatchError(f"cannot write {tree.header}: {e.strerror or e} (the header is unchanged)") from None


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
                gitcmd.run(gitcmd.own(git, "clone", "--quiet", "--template=", mode, "--branch", tag, "--",
                                      release_tree, tmp), env=gitcmd.own_env())  # fmt: skip
                break
            except gitcmd.GitFailed as e:
                if mode != modes[-1]:
                    continue  # hardlinking failed (or something else did: a copy says which)
                raise KvpatchError(
                    f"could not check out {tag} from the cached release {release_tree} ({e.reason()}); "
                    f"if the cache is damaged, delete {release_tree} and run again"
                ) from None
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
