"""``kvpatch sites``: where the key and value sites are, and what kvpatch injected at each
(fetches and checks out like ``apply``; changes nothing in the tree)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from ..patch import Sites, read_header
from ..progress import QUIET, Progress
from ..source.workspace import workspace_lock
from .tree import check_target, fetch_tree, resolve


@dataclass
class SitesOptions:
    vllm: Optional[str] = None
    tree: Optional[Path] = None
    cwd: Path = field(default_factory=Path.cwd)


@dataclass(frozen=True)
class SitesReport:
    sites: Sites  # located in the stock text
    header: Path
    injected: dict[str, str]  # site kind -> the marker text of what is injected there now
    intact: bool  # the injection is what kvpatch renders for its marker
    changed: tuple[str, ...] = ()  # where not intact: the regions that differ from it

    def to_json(self) -> dict:
        """Every name and offset of both sites, and the injection."""
        return {"header": str(self.header), **asdict(self.sites),
                "injected": {kind: self.injected.get(kind) for kind in ("key", "value")},
                "injection_intact": self.intact, "injection_changed": list(self.changed)}  # fmt: skip


def run(o: SitesOptions, *, progress: Progress = QUIET) -> SitesReport:
    """The sites of a release or tree (of its stock header, if kvpatch patched it)."""
    if o.vllm is None and o.tree is None:
        target = resolve(None, o.cwd)
    else:
        version = check_target(o.vllm, o.tree)
        if version is not None:
            with workspace_lock(o.cwd):
                target = fetch_tree(version, o.cwd, None, progress)
        else:
            target = resolve(o.tree, o.cwd)
    header = read_header(target.read_header(), str(target.header))
    found = header.injected
    injected: dict[str, str] = {}
    for label in found.labels:
        kind = label.split("-")[0]
        if kind in ("key", "value"):
            injected[kind] = found.markers[0] if len(found.markers) == 1 else " | ".join(found.markers)
    return SitesReport(header.sites, target.header, injected, found.intact, found.changed)
