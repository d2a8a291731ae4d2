"""``kvpatch revert``: kvpatch's regions removed; the header is stock again, byte for byte."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..patch import read_header
from ..progress import QUIET, Progress
from ..source.workspace import check_header_writable, locked, write_header_and_state
from .tree import edited_regions, resolve, stock_status


@dataclass
class RevertOptions:
    tree: Optional[Path] = None
    cwd: Path = field(default_factory=Path.cwd)
    force: bool = False  # revert even if kvpatch's regions were edited (the edits are lost)
    force_write: bool = False  # replace a header that is read-only (its mode is kept)


@dataclass(frozen=True)
class RevertReport:
    header: Path
    changed: bool
    stock: str = "stock"  # the header now: "stock", "edited" or "unknown" (stock_status)


def run(o: RevertOptions, *, progress: Progress = QUIET) -> RevertReport:
    """Strip kvpatch's injection; refuses (without ``force``) when the regions were edited:
    stripping them would drop the edit."""
    target = resolve(o.tree, o.cwd)
    with locked(o.cwd, target):
        current, seen = target.read_header_snapshot()
        header = read_header(current, str(target.header))
        if not o.force and not header.injected.intact:
            raise edited_regions(header.injected, target.header)
        if header.stock != current:
            check_header_writable(target, force_write=o.force_write)
        write_header_and_state(target, current, header.stock, None, o.cwd, seen=seen, force_write=o.force_write)
    return RevertReport(target.header, header.stock != current, stock_status(target, header.stock, o.cwd))
