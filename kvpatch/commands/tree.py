"""The tree a command works on, and what its header says.

``--vllm X`` fetches a release and checks it out under ``.kvpatch/vllm-X/``; ``--tree
PATH`` names a checkout; neither: the tree the last ``apply`` here used (recorded in
``.kvpatch/state.json``). The header's own marker is the truth about how it is patched;
``state.json`` disagreeing with it is reported in one line.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..config import PatchConfig, make_config
from ..errors import FetchError, PatchError, UsageError
from ..fsutil import read_regular
from ..patch import Header, Injected, read_header
from ..progress import Progress
from ..source.includes import check_tree_files
from ..source.releases import normalize_version
from ..source.state import check_utf8, corrupt_state
from ..source.workspace import STATE_DIR, State, Tree, checkout, resolve_tree


def check_target(vllm: str | None, tree: Path | None) -> str | None:
    """Refuse bad arguments before any I/O; the normalised release, if one was named."""
    if vllm and tree:
        raise UsageError("give either --vllm or --tree, not both")
    if vllm:
        from ..source.fetch import check_release  # (fetching's imports only where a release is named)

        version = normalize_version(vllm)
        check_release(version)  # outside the supported range: refused here, no download
        return version
    if tree is None:
        raise UsageError("which vLLM? pass --vllm X (e.g. v0.10.2) or --tree PATH (later applies here reuse it)")
    return None


def resolve(tree: Path | None, cwd: Path) -> Tree:
    """``--tree`` if given, else the tree the last ``apply`` in ``cwd`` used."""
    return resolve_tree(tree, cwd)


def resolve_source(tree: Path | None, cwd: Path) -> Tree:
    """:func:`resolve`, and a tree a build can read (vLLM's header there): what a command that
    builds checks before nvcc, torch or a GPU is looked for."""
    from ..jit import check_vllm_tree

    target = resolve(tree, cwd)
    check_vllm_tree(target.root)
    return target


def fetch_tree(version: str, cwd: Path, remote: str | None, progress: Progress) -> Tree:
    """The release's private checkout under ``cwd/.kvpatch/`` (call under the workspace lock)."""
    from ..source.fetch import fetch_release, release_tag

    check_utf8(cwd, "the working directory")  # where the checkout goes: before anything is fetched
    kwargs = {"remote": remote} if remote else {}
    release = fetch_release(version, console=progress.console, **kwargs)
    dest = cwd / STATE_DIR / f"vllm-{version}"
    checkout(release, dest, release_tag(version))
    return Tree(dest)


def state_or_none(cwd: Path) -> State | None:
    """The last apply's state; a corrupt state file counts as none (apply rewrites it)."""
    try:
        return State.load(cwd)
    except Exception:
        return None


def stock_status(target: Tree, stock: str, cwd: Path) -> str:
    """What the header without kvpatch's regions (``stock``) is, as far as can be told: "stock"
    (the committed or a recorded release header), "edited" (edits kvpatch did not make) or
    "unknown" (no git and no recorded header to compare with): only the first may be called stock."""
    from ..source.workspace import check_no_local_edits

    notes: list[str] = []
    try:
        check_no_local_edits(target, stock, unpatch=lambda t: read_header(t, str(target.header)).stock,
                             state=state_or_none(cwd), note=notes.append)  # fmt: skip
    except PatchError:
        return "edited"
    return "unknown" if notes else "stock"


def edited_regions(found: Injected, header: Path) -> PatchError:
    """The error for kvpatch's regions changed after kvpatch wrote them."""
    what = ", ".join(dict.fromkeys(found.changed or found.labels))
    if found.config is None:
        why = "their markers name no configuration this kvpatch writes" if len(found.markers) == 1 else \
              f"they carry {len(found.markers)} different configurations"  # fmt: skip
    else:
        why = "their text differs from what kvpatch renders for their marker (edited by hand, or written by another kvpatch version)"
    return PatchError(f"kvpatch's regions ({what}) in {header} were changed: {why}; "
                      "pass --force to replace them anyway")  # fmt: skip


def state_mismatch(target: Tree, found: Injected, cwd: Path) -> str | None:
    """One line when the header and ``.kvpatch/state.json`` disagree about this tree's
    configuration (a crash between the two writes of an older kvpatch, a hand edit,
    another tool). The header wins."""
    state = state_or_none(cwd)
    if state is None or Path(state.tree) != target.root or state.marker is None or not found.markers:
        return None  # (a stock header after 'kvpatch revert' is no disagreement)
    header_says = found.markers[0] if len(found.markers) == 1 else "several configurations"
    if header_says == state.marker:
        return None
    return (f"warning: {target.header} holds {header_says!r} but .kvpatch/state.json records "
            f"{state.marker!r}; the header is used (run 'kvpatch apply' to make them agree)")  # fmt: skip


def tree_config(target: Tree, cwd: Path, progress: Progress, header: Header | None = None) -> PatchConfig:
    """The configuration the tree is patched with: its marker's (the header is the truth);
    the last apply's here if the marker names none; else the default."""
    header = header or read_header(target.read_header(), str(target.header))
    line = state_mismatch(target, header.injected, cwd)
    if line:
        progress.say(line)
    if header.injected.config is not None:
        return header.injected.config
    state = state_or_none(cwd)
    if state is not None and Path(state.tree) == target.root:
        try:
            return make_config(**state.config)
        except (UsageError, TypeError) as e:  # a value no option gave: the file was edited, not the command line
            raise corrupt_state(State.path(cwd), f"its configuration: {str(e).splitlines()[0][:120]}") from None
    return make_config()


def variants_for(target: Tree, cwd: Path, progress: Progress, *, paper: bool = False, control: bool = False,
                 extra: dict[str, PatchConfig] | None = None) -> list:  # fmt: skip
    """stock, the tree's patched header, and optional comparison variants.

    ``stock`` is the tree's header with kvpatch's injection removed; ``patched`` is
    the header as the tree holds it; ``paper`` / ``control`` / ``extra`` are rendered
    from the stock text here, the tree itself is never changed.
    """
    from ..jit import Variant, patched_variants

    check_tree_files(target.root)
    header = read_header(target.read_header(), str(target.header))
    if not header.regions:
        raise UsageError(f"{target.header} is stock: run 'kvpatch apply' first")
    own = tree_config(target, cwd, progress, header)
    configs: dict[str, PatchConfig] = {}
    if paper:
        configs["paper"] = make_config(preset="paper")
    if control:
        configs["control"] = replace(own, control=True)
    configs.update(extra or {})
    first, *others = patched_variants(header.stock, str(target.header), configs)
    return [first, Variant.patched("patched", header.text, own), *others]


def tree_release(target: Tree, cwd: Path) -> str | None:
    """The vLLM release a tree holds: the ``Version:`` of the sdist's ``PKG-INFO`` (the tree's
    own word), else the last apply's record here when it names this tree (a git checkout has no
    PKG-INFO); None when neither says. A hand-edited record cannot make a bundle claim another
    release than its sdist's."""
    info = target.root / "PKG-INFO"
    try:
        if info.is_file():
            for line in read_regular(info, limit=1 << 20).decode("utf-8", "replace").splitlines():
                if line.startswith("Version:"):
                    return normalize_version(line.split(":", 1)[1].strip())
                if not line.strip():
                    break  # the headers end at the first blank line
    except (OSError, UsageError, FetchError):
        pass
    state = state_or_none(cwd)
    if state is not None and state.version and Path(state.tree) == target.root:
        return state.version
    return None
