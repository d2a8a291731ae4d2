"""What each command does, composed from the pure pipeline and the I/O edges.

``cli`` renders these results; tests call them directly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console

from .config import PatchConfig
from .patch.plan import Result, patch, unpatch
from .errors import UsageError
from .source.fetch import fetch_release, normalize_version, release_tag
from .patch.sites import Sites, find_sites
from .source.workspace import State, Tree, check_no_local_edits, checkout, resolve_tree, unified_diff, write_atomic
from .source.workspace import STATE_DIR


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


# --------------------------------------------------------------------------- build / validate / bench


def tree_config(target: Tree, cwd: Path) -> PatchConfig:
    """The configuration the tree was patched with: the last apply's, if it was this tree."""
    from .config import make_config

    state = State.load(cwd)
    if state is not None and Path(state.tree) == target.root:
        return make_config(**state.config)
    return make_config()


def variants_for(target: Tree, cwd: Path, *, paper: bool = False, control: bool = False,
                 extra: dict[str, PatchConfig] | None = None) -> list:  # fmt: skip
    """stock, the tree's patched header, and optional comparison variants.

    ``stock`` is the tree's header with kvpatch's injection removed; ``patched`` is
    the header as the tree holds it; ``paper`` / ``control`` / ``extra`` are rendered
    from the stock text here, the tree itself is never changed.
    """
    from dataclasses import replace

    from .build import Variant, patched_variants
    from .config import make_config

    path = str(target.header)
    current = target.read_header()
    stock, markers = unpatch(current, path)
    if not markers:
        raise UsageError(f"{target.header} is stock: run 'kvpatch apply' first")
    own = tree_config(target, cwd)
    configs: dict[str, PatchConfig] = {}
    if paper:
        configs["paper"] = make_config(preset="paper")
    if control:
        configs["control"] = replace(own, control=True)
    configs.update(extra or {})
    first, *others = patched_variants(stock, path, configs)
    return [first, Variant.patched("patched", current, own), *others]


def build(*, tree: Path | None, cwd: Path, archs: str, variants: list | None = None, jobs: int | None = None,
          console: Console, **kernel_options):  # fmt: skip
    """Compile stock and patched (or the given variants) and check their SASS."""
    from . import build as B

    target = resolve_tree(tree, cwd)
    chosen = variants if variants is not None else variants_for(target, cwd)
    spec = B.make_spec(target.root, chosen, archs, **kernel_options)
    return B.build(spec, jobs=jobs, console=console)


def load_libraries(result) -> dict:
    """name -> :class:`kvpatch.gpu.launch.Kernels` for every variant of a build."""
    from .gpu.launch import Kernels

    return {v.name: Kernels(v.library, v.prefix) for v in result.variants}


def require_cuda() -> None:
    """A GPU and a CUDA build of torch, or a one-line error."""
    from .errors import BuildError

    try:
        import torch
    except ImportError:
        raise BuildError("validate and bench need torch with CUDA (pip install torch)") from None
    if not torch.cuda.is_available():
        raise BuildError(f"no CUDA GPU visible to torch {torch.__version__}: validate and bench run on a GPU")
