"""What each command does, composed from the pure pipeline and the I/O edges.

``cli`` renders these results; tests call them directly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console

from .config import PatchConfig
from .edits import Result, patch, unpatch
from .errors import UsageError
from .fetch import fetch_release, normalize_version, release_tag
from .sites import Sites, find_sites
from .workspace import State, Tree, check_no_local_edits, checkout, resolve_tree, unified_diff, write_atomic
from .workspace import STATE_DIR


@dataclass(frozen=True)
class ApplyReport:
    tree: Tree
    version: str | None
    config: PatchConfig
    result: Result
    before: str  # the header as apply found it

    @property
    def changed(self) -> bool:
        return self.result.patched != self.before

    @property
    def sites(self) -> Sites:
        return self.result.sites

    @property
    def previous(self) -> tuple[str, ...]:
        return self.result.previous

    def to_json(self) -> dict:
        return {
            "tree": str(self.tree.root),
            "header": str(self.tree.header),
            "version": self.version,
            "config": self.config.to_toml_dict(),
            "marker": self.config.marker(),
            "changed": self.changed,
            "previous": list(self.previous),
            "sites": asdict(self.sites),
            "edits": [{"offset": e.offset, "length": e.length, "what": e.what} for e in self.result.edits],
        }


def _fetch_tree(vllm: str, cwd: Path, remote: str | None, console: Console) -> tuple[Tree, str]:
    version = normalize_version(vllm)
    kwargs = {"remote": remote} if remote else {}
    release = fetch_release(version, console=console, **kwargs)
    dest = cwd / STATE_DIR / f"vllm-{version}"
    checkout(release, dest, release_tag(version))
    return Tree(dest), version


def _target(vllm: str | None, tree: Path | None, cwd: Path, remote: str | None,
            console: Console) -> tuple[Tree, str | None]:  # fmt: skip
    if vllm and tree:
        raise UsageError("give either --vllm or --tree, not both")
    if vllm:
        return _fetch_tree(vllm, cwd, remote, console)
    if tree is not None:
        return resolve_tree(tree, cwd), None
    raise UsageError("which vLLM? pass --vllm X (e.g. v0.10.2) or --tree PATH")


def apply(*, vllm: str | None, tree: Path | None, cfg: PatchConfig, cwd: Path,
          remote: str | None = None, force: bool = False, console: Console) -> ApplyReport:  # fmt: skip
    """Patch the tree's header with ``cfg``; idempotent; refuses foreign local edits."""
    target, version = _target(vllm, tree, cwd, remote, console)
    current = target.read_header()
    result = patch(current, str(target.header), cfg)
    if not force:
        check_no_local_edits(target, result.stock)
    if result.patched != current:
        write_atomic(target.header, result.patched)
    State(tree=str(target.root), version=version, config=cfg.to_toml_dict()).save(cwd)
    return ApplyReport(target, version, cfg, result, current)


def sites(*, vllm: str | None, tree: Path | None, cwd: Path, console: Console) -> tuple[Sites, Path]:
    """The sites of a release or tree (of its stock header, if kvpatch patched it)."""
    if vllm is None and tree is None:
        target = resolve_tree(None, cwd)
    else:
        target, _ = _target(vllm, tree, cwd, None, console)
    stock, _ = unpatch(target.read_header(), str(target.header))
    return find_sites(stock, str(target.header)), target.header


def diff(*, tree: Path | None, cwd: Path) -> str:
    """kvpatch's change to the tree's header as a unified diff ('' when stock)."""
    target = resolve_tree(tree, cwd)
    current = target.read_header()
    stock, _ = unpatch(current, str(target.header))
    return unified_diff(stock, current)


def revert(*, tree: Path | None, cwd: Path) -> tuple[Path, bool]:
    """Strip kvpatch's injection; returns (header, whether anything changed)."""
    target = resolve_tree(tree, cwd)
    current = target.read_header()
    stock, _ = unpatch(current, str(target.header))
    if stock != current:
        write_atomic(target.header, stock)
    return target.header, stock != current
