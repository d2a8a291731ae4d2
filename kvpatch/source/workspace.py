"""The files kvpatch touches: the target tree, its header, and the record of the last apply.

This is the I/O edge around :mod:`kvpatch.patch.plan`. ``apply`` reads the header, asks
:func:`kvpatch.patch.plan.patch` for new text, refuses when the header carries edits
kvpatch did not make, and writes atomically. The last apply in a directory is
remembered in ``.kvpatch/state.json`` so that ``diff``, ``build`` and ``revert``
need no arguments.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import KvpatchError, PatchError, UsageError
from ..fsutil import write_atomic
from .releases import HEADER

STATE_DIR = ".kvpatch"
STATE_FILE = "state.json"


# --------------------------------------------------------------------------- the tree


@dataclass(frozen=True)
class Tree:
    """A vLLM source tree kvpatch patches."""

    root: Path

    @property
    def header(self) -> Path:
        return self.root / HEADER

    def read_header(self) -> str:
        try:
            return self.header.read_bytes().decode("utf-8")  # keep CRLF as it is
        except FileNotFoundError:
            raise PatchError(f"{self.root} has no {HEADER}: not a supported vLLM tree") from None

    def committed_header(self) -> str | None:
        """The header as committed at HEAD, or None where the tree is not a git checkout."""
        if not (self.root / ".git").exists():
            return None
        proc = subprocess.run(
            ["git", "-C", str(self.root), "show", f"HEAD:{HEADER}"],
            capture_output=True,
        )
        return proc.stdout.decode("utf-8") if proc.returncode == 0 else None


def check_no_local_edits(tree: Tree, stock: str) -> None:
    """Refuse when the header, minus kvpatch's own injection, differs from HEAD's."""
    committed = tree.committed_header()
    if committed is not None and committed != stock:
        raise PatchError(
            f"{tree.header} has local edits kvpatch did not make; commit or stash them, "
            "or pass --force to patch on top of them"
        )


def unified_diff(stock: str, patched: str, path: str = HEADER) -> str:
    """A patch of ``stock`` -> ``patched`` that ``git apply`` and ``patch -p1`` accept."""
    if stock == patched:
        return ""
    lines = list(
        difflib.unified_diff(
            stock.splitlines(keepends=True),
            patched.splitlines(keepends=True),
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

    @staticmethod
    def path(cwd: Path) -> Path:
        return cwd / STATE_DIR / STATE_FILE

    def save(self, cwd: Path) -> None:
        write_atomic(State.path(cwd), json.dumps(self.__dict__, indent=2) + "\n")

    @staticmethod
    def load(cwd: Path) -> State | None:
        try:
            data = json.loads(State.path(cwd).read_text(encoding="utf-8"))
            return State(tree=data["tree"], version=data.get("version"), config=data["config"])
        except FileNotFoundError:
            return None
        except (KeyError, ValueError) as e:
            raise KvpatchError(f"corrupt {State.path(cwd)}: {e}") from None


def resolve_tree(tree: Path | None, cwd: Path) -> Tree:
    """``--tree`` if given, else the tree the last ``apply`` in ``cwd`` used."""
    if tree is not None:
        return Tree(tree.resolve())
    state = State.load(cwd)
    if state is None:
        raise UsageError("no tree: run 'kvpatch apply --vllm X' here first, or pass --tree PATH")
    return Tree(Path(state.tree))


def checkout(release_tree: Path, dest: Path, tag: str) -> None:
    """A private clone of the cached pristine release at ``dest`` (objects hardlinked)."""
    if dest.exists():
        return
    tmp = dest.with_name(dest.name + ".partial")
    if tmp.exists():
        subprocess.run(["rm", "-rf", str(tmp)], check=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["git", "clone", "--quiet", "--local", "--branch", tag, str(release_tree), str(tmp)],
        capture_output=True,
        text=True,
        env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"},
    )
    if proc.returncode != 0:
        subprocess.run(["rm", "-rf", str(tmp)])
        raise KvpatchError(f"could not check out {tag} into {dest}: {proc.stderr.strip()}")
    os.replace(tmp, dest)
