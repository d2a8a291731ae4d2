"""``kvpatch diff``: kvpatch's change to the tree's header as a patch ``git apply`` takes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import UsageError
from ..patch import read_header
from ..progress import QUIET, Progress
from ..source.workspace import unified_diff
from .common import kept_paths
from .tree import resolve, state_mismatch, stock_status


@dataclass
class DiffOptions:
    tree: Optional[Path] = None
    cwd: Path = field(default_factory=Path.cwd)


@dataclass(frozen=True)
class DiffReport:
    header: Path
    text: str  # the unified diff ('' when the header is stock)
    warnings: tuple[str, ...] = ()  # why the diff may not be what apply made, one line each
    stock: str = "stock"  # the header without kvpatch's regions: "stock", "edited" or "unknown" (stock_status)


def check_output(output: Path, tree: Optional[Path], cwd: Path) -> None:
    """``diff -o FILE`` checked before the diff is made: writable, and none of the files kvpatch
    keeps (its state, the tree's header and lock; a tree that cannot be resolved is the diff's
    own error, said when it runs)."""
    from ..fsutil import check_output

    try:
        target = resolve(tree, cwd)
    except UsageError:
        target = None
    check_output("output", output, protected=kept_paths(cwd, target))


def run(o: DiffOptions, *, progress: Progress = QUIET) -> DiffReport:
    """The diff of the stock text (the header without kvpatch's regions) against the header;
    warnings when the regions were edited by hand (the patch carries the edits) or the text
    outside them was (they are the patch's context)."""
    target = resolve(o.tree, o.cwd)
    path = str(target.header)
    header = read_header(target.read_header(), path)
    found = header.injected
    warnings = [line for line in (state_mismatch(target, found, o.cwd),) if line]
    text = unified_diff(found.stock, header.text)
    stock = stock_status(target, found.stock, o.cwd)
    if text:
        if not found.intact:
            warnings.append(f"warning: kvpatch's regions in {target.header} were edited by hand; the patch carries "
                            "those edits ('kvpatch apply --force' rewrites the regions)")  # fmt: skip
        if stock == "edited":
            warnings.append(f"warning: {target.header} has edits kvpatch did not make; they are the patch's context, so "
                            "it applies only to a checkout with the same edits")  # fmt: skip
    return DiffReport(target.header, text, tuple(warnings), stock)
