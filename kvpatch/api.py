"""What each command does, composed from the pure pipeline and the I/O edges.

``cli`` renders these results; tests call them directly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from .config import PatchConfig
from .errors import PatchError, UsageError
from .machine import Machine, differences, local
from .patch.plan import Injected, Result, inspect, patch
from .patch.sites import Sites, find_sites
from .source.fetch import check_release, fetch_release, normalize_version, release_tag
from .source.workspace import STATE_DIR, State, Tree, check_no_local_edits, checkout, resolve_tree, sha256
from .source.workspace import unified_diff, workspace_lock, write_header_and_state


@dataclass(frozen=True)
class ApplyReport:
    tree: Tree
    version: str | None
    config: PatchConfig
    result: Result
    before: str  # the header as apply found it
    #: where the configuration's rules were tuned (None: unknown), and how this machine differs
    tuned_on: Machine | None = None
    machine_differences: tuple[str, ...] = field(default=())

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
            "tuned_on": self.tuned_on.to_dict() if self.tuned_on is not None else None,
            "machine_differences": list(self.machine_differences),
        }


def _fetch_tree(version: str, cwd: Path, remote: str | None, console: Console) -> Tree:
    """The release's private checkout under ``cwd/.kvpatch/`` (call under the workspace lock)."""
    kwargs = {"remote": remote} if remote else {}
    release = fetch_release(version, console=console, **kwargs)
    dest = cwd / STATE_DIR / f"vllm-{version}"
    checkout(release, dest, release_tag(version))
    return Tree(dest)


def _check_target(vllm: str | None, tree: Path | None) -> str | None:
    """Refuse bad arguments before any I/O; the normalised release, if one was named."""
    if vllm and tree:
        raise UsageError("give either --vllm or --tree, not both")
    if vllm:
        version = normalize_version(vllm)
        check_release(version)  # outside the supported range: refused here, no download
        return version
    if tree is None:
        raise UsageError("which vLLM? pass --vllm X (e.g. v0.10.2) or --tree PATH (later applies here reuse it)")
    return None


def _edited_regions(found: Injected, header: Path) -> PatchError:
    what = ", ".join(dict.fromkeys(found.labels))
    if found.config is None:
        why = "their markers name no configuration this kvpatch writes" if len(found.markers) == 1 else \
              f"they carry {len(found.markers)} different configurations"  # fmt: skip
    else:
        why = "their text differs from what kvpatch renders for their marker (edited by hand, or written by another kvpatch version)"
    return PatchError(f"kvpatch's regions ({what}) in {header} were changed: {why}; "
                      "pass --force to replace them anyway")  # fmt: skip


def apply(*, vllm: str | None, tree: Path | None, cfg: PatchConfig, cwd: Path,
          remote: str | None = None, force: bool = False, console: Console,
          tuned: Machine | None = None, here: Machine | None = None) -> ApplyReport:  # fmt: skip
    """Patch the tree's header with ``cfg``; idempotent; refuses edits kvpatch did not make.

    Under the workspace lock: fetch and check out (``--vllm``), read the header,
    refuse edits inside kvpatch's regions and outside them (unless ``force``), then
    write the header and ``state.json`` as one step. With ``tuned`` (where the
    configuration was tuned), the report lists how this machine (``here``, default
    :func:`kvpatch.machine.local`) differs from it.
    """
    state = State.load(cwd) if vllm is None and tree is None else None  # corrupt: its one-line error
    if state is not None and not Path(state.tree).is_dir() and state.version is not None \
            and Path(state.tree) == cwd / STATE_DIR / f"vllm-{state.version}":  # fmt: skip
        check_release(state.version)  # kvpatch's own checkout of a release, removed: check it out again
        version, target = state.version, None
    elif state is not None:  # again: the tree the last apply here used
        version, target = state.version, resolve_tree(None, cwd)
    else:
        version = _check_target(vllm, tree)
        target: Tree | None = resolve_tree(tree, cwd) if tree is not None else None
    with workspace_lock(cwd):
        if target is None:
            target = _fetch_tree(version, cwd, remote, console)
        current = target.read_header()
        path = str(target.header)
        found = inspect(current, path)
        if not force and not found.intact:
            raise _edited_regions(found, target.header)
        result = patch(current, path, cfg)
        if not force:
            check_no_local_edits(target, result.stock, unpatch=lambda text: inspect(text, path).stock,
                                 state=_state_or_none(cwd), note=lambda line: console.print(escape(line), highlight=False, soft_wrap=True))  # fmt: skip
        state = State(tree=str(target.root), version=version, config=cfg.to_toml_dict(), marker=cfg.marker(),
                      stock_sha256=sha256(result.stock))  # fmt: skip
        write_header_and_state(target, current, result.patched, state, cwd)
    diffs: tuple[str, ...] = ()
    if tuned is not None:
        diffs = tuple(differences(tuned, here if here is not None else local()))
    return ApplyReport(target, version, cfg, result, current, tuned, diffs)


def _state_or_none(cwd: Path) -> State | None:
    """The last apply's state; a corrupt state file counts as none (apply rewrites it)."""
    try:
        return State.load(cwd)
    except Exception:
        return None


@dataclass(frozen=True)
class SitesReport:
    sites: Sites  # located in the stock text
    header: Path
    injected: dict[str, str]  # site kind -> the marker text of what is injected there now
    intact: bool  # the injection is what kvpatch renders for its marker

    def to_json(self) -> dict:
        """``kvpatch sites --json``: every name and offset of both sites, and the injection."""
        return {"header": str(self.header), **asdict(self.sites),
                "injected": {kind: self.injected.get(kind) for kind in ("key", "value")},
                "injection_intact": self.intact}  # fmt: skip


def sites(*, vllm: str | None, tree: Path | None, cwd: Path, console: Console) -> SitesReport:
    """The sites of a release or tree (of its stock header, if kvpatch patched it), and
    what kvpatch injected at each now."""
    if vllm is None and tree is None:
        target = resolve_tree(None, cwd)
    else:
        version = _check_target(vllm, tree)
        if version is not None:
            with workspace_lock(cwd):
                target = _fetch_tree(version, cwd, None, console)
        else:
            target = resolve_tree(tree, cwd)
    found = inspect(target.read_header(), str(target.header))
    injected: dict[str, str] = {}
    for label in found.labels:
        kind = label.split("-")[0]
        if kind in ("key", "value"):
            injected[kind] = found.markers[0] if len(found.markers) == 1 else " | ".join(found.markers)
    return SitesReport(find_sites(found.stock, str(target.header)), target.header, injected, found.intact)


def diff(*, tree: Path | None, cwd: Path, console: Console | None = None) -> str:
    """kvpatch's change to the tree's header as a unified diff ('' when stock)."""
    target = resolve_tree(tree, cwd)
    current = target.read_header()
    path = str(target.header)
    found = inspect(current, path)
    report_state_mismatch(target, found, cwd, console)
    text = unified_diff(found.stock, current)
    if text and console is not None:
        for line in _diff_warnings(target, found, path, cwd):
            console.print(escape(line), highlight=False, soft_wrap=True)
    return text


def _diff_warnings(target: Tree, found: Injected, path: str, cwd: Path) -> list[str]:
    """Why a diff may not be what apply made, or may not apply to a pristine checkout:
    edited regions (the patch carries the edits) and edits outside them (they are the
    patch's context)."""
    out = []
    if not found.intact:
        out.append(f"warning: kvpatch's regions in {target.header} were edited by hand; the patch carries "
                   "those edits ('kvpatch apply --force' rewrites the regions)")  # fmt: skip
    try:
        check_no_local_edits(target, found.stock, unpatch=lambda text: inspect(text, path).stock,
                             state=_state_or_none(cwd), note=lambda line: None)  # fmt: skip
    except PatchError:
        out.append(f"warning: {target.header} has edits kvpatch did not make; they are the patch's context, so "
                   "it applies only to a checkout with the same edits")  # fmt: skip
    return out


def revert(*, tree: Path | None, cwd: Path, force: bool = False) -> tuple[Path, bool]:
    """Strip kvpatch's injection; returns (header, whether anything changed).

    Refuses (without ``force``) when the regions were edited: stripping them would
    drop the edit.
    """
    target = resolve_tree(tree, cwd)
    with workspace_lock(cwd):
        current = target.read_header()
        found = inspect(current, str(target.header))
        if not force and not found.intact:
            raise _edited_regions(found, target.header)
        write_header_and_state(target, current, found.stock, None, cwd)
    return target.header, found.stock != current


def report_state_mismatch(target: Tree, found: Injected, cwd: Path, console: Console | None) -> str | None:
    """One line when the header and ``.kvpatch/state.json`` disagree about this tree's
    configuration (a crash between the two writes of an older kvpatch, a hand edit,
    another tool); returned, and printed to ``console``. The header wins."""
    state = _state_or_none(cwd)
    if state is None or Path(state.tree) != target.root or state.marker is None or not found.markers:
        return None  # (a stock header after 'kvpatch revert' is no disagreement)
    header_says = found.markers[0] if len(found.markers) == 1 else "several configurations"
    if header_says == state.marker:
        return None
    line = (f"warning: {target.header} holds {header_says!r} but .kvpatch/state.json records "
            f"{state.marker!r}; the header is used (run 'kvpatch apply' to make them agree)")  # fmt: skip
    if console is not None:
        console.print(escape(line), highlight=False, soft_wrap=True)
    return line


# --------------------------------------------------------------------------- build / validate / bench


def tree_config(target: Tree, cwd: Path, console: Console | None = None) -> PatchConfig:
    """The configuration the tree is patched with: its marker's (the header is the truth);
    the last apply's here if the marker names none; else the default. A disagreement
    between the header and ``state.json`` is reported in one line."""
    from .config import make_config

    found = inspect(target.read_header(), str(target.header))
    report_state_mismatch(target, found, cwd, console if console is not None else Console(stderr=True))
    if found.config is not None:
        return found.config
    state = _state_or_none(cwd)
    if state is not None and Path(state.tree) == target.root:
        return make_config(**state.config)
    return make_config()


def variants_for(target: Tree, cwd: Path, *, paper: bool = False, control: bool = False,
                 extra: dict[str, PatchConfig] | None = None, console: Console | None = None) -> list:  # fmt: skip
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
    stock = inspect(current, path).stock
    if stock == current:
        raise UsageError(f"{target.header} is stock: run 'kvpatch apply' first")
    own = tree_config(target, cwd, console)
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
    chosen = variants if variants is not None else variants_for(target, cwd, console=console)
    spec = B.make_spec(target.root, chosen, archs, **kernel_options)
    return B.build(spec, jobs=jobs, console=console)


def load_libraries(result) -> dict:
    """name -> :class:`kvpatch.gpu.launch.Kernels` for every variant of a build."""
    from .gpu.launch import Kernels

    return {v.name: Kernels(v.library, v.prefix) for v in result.variants}
