"""What the last ``apply`` in a directory did (``.kvpatch/state.json``), and the tree a
command works on when it names none."""

from __future__ import annotations

import codecs
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import fsutil
from ..errors import KvpatchError, UsageError
from ..fsutil import shown_path
from ..fsutil.outputs import STATE_DIR
from .tree import Tree

STATE_FILE = "state.json"
LOCK_FILE = "lock"


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
        """Replace the state file (whatever is there: a FIFO or a symlink is replaced, never
        written into or through)."""
        fsutil.write_own(State.path(cwd), self.text())

    @staticmethod
    def load(cwd: Path) -> State | None:
        path = State.path(cwd)
        try:
            data = fsutil.parse_json(fsutil.read_regular(path))
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise KvpatchError(f"{path} is a directory; delete it and run 'kvpatch apply' again") from None
        except (fsutil.NotRegularFileError, fsutil.FileTooLargeError) as e:
            raise KvpatchError(f"{path} {e.strerror}: not the file kvpatch writes; delete it and run "
                               "'kvpatch apply' again") from None  # fmt: skip
        except OSError as e:
            raise KvpatchError(f"cannot read {path}: {e.strerror or e}") from None
        except ValueError as e:  # not UTF-8, not JSON, nested too deeply
            raise corrupt_state(path, str(e).splitlines()[0][:80]) from None
        ok = (
            isinstance(data, dict)
            and isinstance(data.get("tree"), str) and data["tree"] and "\0" not in data["tree"]
            and isinstance(data.get("version"), (str, type(None)))
            and isinstance(data.get("config"), dict)
            and isinstance(data.get("marker"), (str, type(None)))
            and isinstance(data.get("stock_sha256"), (str, type(None)))
        )  # fmt: skip
        if not ok:
            raise corrupt_state(path, "not the object kvpatch writes")
        if data["version"] is not None and not _canonical(data["version"]):
            shown = repr(data["version"]) if len(data["version"]) <= 40 else repr(data["version"][:37]) + "..."
            raise corrupt_state(path, f"version {shown} is not a release number as kvpatch writes it")
        return State(tree=data["tree"], version=data["version"], config=data["config"],
                     marker=data.get("marker"), stock_sha256=data.get("stock_sha256"))  # fmt: skip


def corrupt_state(path: Path, why: str) -> KvpatchError:
    """The one-line error for a state file kvpatch cannot use (exit 1): what is wrong, and that
    deleting it and applying again mends it."""
    return KvpatchError(f"corrupt {path} ({why}); delete it and run 'kvpatch apply' again")


def _canonical(version: str) -> bool:
    """Whether ``version`` is a release number as :func:`kvpatch.source.fetch.normalize_version`
    returns it (``'0.10.2'``; not ``'v0.10.2'``, ``'0.10.02'``, ``'0.10.2\\n'``, ``''``)."""
    from .fetch import normalize_version

    try:
        return normalize_version(version) == version
    except UsageError:
        return False


def check_utf8(path: Path, what: str) -> Path:
    """``path`` unless it is not UTF-8 (a name with byte 0xff): libclang, which parses the tree's
    header, takes UTF-8 paths only, so such a tree is one line, exit 2, before any work. So is a
    path that is not ASCII where this process names files in another encoding than UTF-8
    (``LC_ALL=C`` without Python's UTF-8 mode), which could not spell it."""
    shown = ascii(str(path))
    shown = shown if len(shown) <= 120 else shown[:117] + "..."
    encoding = sys.getfilesystemencoding()
    if codecs.lookup(encoding).name != "utf-8" and not str(path).isascii():
        raise UsageError(f"{what} {shown} is not ASCII, and this process names files in {encoding} (a C or POSIX "
                         "locale without Python's UTF-8 mode): run kvpatch with PYTHONUTF8=1 or a UTF-8 locale "
                         "(LANG=C.UTF-8)")  # fmt: skip
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{what} {shown} is not a UTF-8 path: libclang, which parses the header, reads UTF-8 "
                         "paths only; use a directory with a UTF-8 name") from None  # fmt: skip
    return path


def resolve_tree(tree: Path | None, cwd: Path) -> Tree:
    """``--tree`` if given, else the tree the last ``apply`` in ``cwd`` used; refused (one line,
    exit 2) when it does not exist, is not a directory or its path is not UTF-8."""
    if tree is not None:
        check_utf8(tree if tree.is_absolute() else cwd / tree, "--tree")
        try:
            path = (cwd / tree).resolve() if not tree.is_absolute() else tree.resolve()
            path.stat()
        except FileNotFoundError:
            pass  # said below
        except (RuntimeError, OSError) as e:  # a symlink loop (RuntimeError on 3.11), a name too long
            why = getattr(e, "strerror", None) or str(e).split(" from ")[0] or type(e).__name__
            raise UsageError(f"--tree {shown_path(tree)}: cannot resolve it ({why})") from None
        if not path.exists():
            raise UsageError(f"--tree {shown_path(tree)}: no such directory")
        if not path.is_dir():
            raise UsageError(f"--tree {shown_path(tree)} is not a directory (give the vLLM checkout's root)")
        return Tree(path)
    state = State.load(cwd)
    if state is None:
        raise UsageError("no tree: run 'kvpatch apply --vllm X' here first, or pass --tree PATH")
    recorded = check_utf8(Path(state.tree), "the tree the last apply here used,")  # first: a path this
    if not recorded.is_dir():  # process cannot spell reads as missing
        again = f"kvpatch apply --vllm {state.version}" if state.version else "kvpatch apply --tree PATH"
        raise UsageError(f"the tree the last apply here used, {state.tree}, is gone (recorded in "
                         f"{State.path(cwd)}): pass --tree PATH, or run '{again}'")  # fmt: skip
    return Tree(recorded)
