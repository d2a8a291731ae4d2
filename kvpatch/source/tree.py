"""The tree kvpatch patches: its header, read safely, and whether it carries edits kvpatch
did not make; the header's diff as a patch git accepts."""

from __future__ import annotations

import difflib
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import fsutil
from ..errors import PatchError
from . import git as gitcmd
from .releases import HEADER, revision_of


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
                         state: Any = None, note: Callable[[str], None] = print) -> None:  # fmt: skip
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
