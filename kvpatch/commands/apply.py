"""``kvpatch apply``: fetch (or take) a tree, patch its header, write it with the state.

The data flow: options -> a configuration (:func:`kvpatch.config.config_and_tuned`) ->
the tree (fetched and checked out, or ``--tree``, or the last apply's) -> the header read
and parsed once (:func:`kvpatch.patch.read_header`) -> refused if kvpatch's regions or the
text outside them were edited -> patched and re-checked (:func:`kvpatch.patch.patch_header`)
-> header and ``.kvpatch/state.json`` written as one step, under the workspace lock.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from ..config import Machine, PatchConfig, differences
from ..patch import Result, Sites, patch_header, read_header
from ..patch.plan import takes_grouped_form
from ..progress import QUIET, Progress
from ..source.workspace import (
    STATE_DIR,
    State,
    Tree,
    check_header_writable,
    check_no_local_edits,
    check_utf8,
    locked,
    resolve_tree,
    sha256,
    write_header_and_state,
)
from .configuration import ConfigOptions, configure
from .tree import check_target, edited_regions, fetch_tree, state_or_none


@dataclass
class ApplyOptions(ConfigOptions):
    vllm: Optional[str] = None
    tree: Optional[Path] = None
    cwd: Path = field(default_factory=Path.cwd)
    remote: Optional[str] = None
    force: bool = False
    force_write: bool = False  # replace a header that is read-only (its mode is kept)
    #: this machine's record (None: read it when the configuration says where it was tuned)
    here: Optional[Machine] = None


@dataclass(frozen=True)
class ApplyReport:
    tree: Tree
    version: str | None
    config: PatchConfig
    result: Result
    before: str  # the header as apply found it
    #: where the configuration's rules were tuned (None: unknown), and how this machine differs
    tuned_on: Machine | None = None
    machine_differences: tuple[str, ...] = ()
    #: options and rules given that change no kernel, one line each
    unreached: tuple[str, ...] = ()
    #: what the user's base settings replaced in the shipped table, and where that puts
    #: bit-identity at risk, one line each (said before the header is written)
    overridden: tuple[str, ...] = ()

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
            "unreached": list(self.unreached),
            "overridden": list(self.overridden),
            "grouped_form": takes_grouped_form(self.sites, self.config),
        }


def _grouping(cfg: PatchConfig) -> list[tuple[tuple, int, int]]:
    """Which kernels group, and how: a configuration that asks for other grouping than the
    shipped table's is told when the header cannot take the grouped form."""
    return [(kernel, c.group, c.group_min_ctas) for kernel, _, c in cfg.kernel_variants()]


def run(o: ApplyOptions, *, progress: Progress = QUIET) -> ApplyReport:
    """Patch the tree's header; idempotent; refuses edits kvpatch did not make (unless ``force``)."""
    resolved, lines, overridden = configure(o)
    cfg, tuned = resolved.config, resolved.tuned
    for line in (*lines, *overridden):  # before anything is written
        progress.say(
            line
            if line.startswith("warning:")
            else f"warning: {line}"
            if " changes no kernel" in line
            else f"note: {line}"
        )
    cwd = o.cwd
    state = State.load(cwd) if o.vllm is None and o.tree is None else None  # corrupt: its one-line error
    if state is not None and not Path(state.tree).is_dir() and state.version is not None \
            and Path(state.tree) == cwd / STATE_DIR / f"vllm-{state.version}":  # fmt: skip
        from ..source.fetch import check_release

        check_release(state.version)  # kvpatch's own checkout of a release, removed: check it out again
        version, target = state.version, None
    elif state is not None:  # again: the tree the last apply here used
        version, target = state.version, resolve_tree(None, cwd)
    else:
        version = check_target(o.vllm, o.tree)
        target = resolve_tree(o.tree, cwd) if o.tree is not None else None
    if target is None:  # where the checkout will go: refused before the lock creates .kvpatch/ there
        check_utf8(cwd, "the working directory")
    with locked(cwd, target):
        if target is None:  # a release: its checkout is this workspace's own
            target = fetch_tree(version, cwd, o.remote, progress)
        current, seen = target.read_header_snapshot()
        header = read_header(current, str(target.header))
        if header.injected.config != cfg or not header.injected.intact:  # it will change: refused before the work
            check_header_writable(target, force_write=o.force_write)
        if not o.force and not header.injected.intact:
            raise edited_regions(header.injected, target.header)
        if not o.force:  # before the patch: an edit that breaks it is an edit, not kvpatch's failure
            path = str(target.header)
            check_no_local_edits(target, header.stock, unpatch=lambda text: read_header(text, path).stock,
                                 state=state_or_none(cwd), note=progress.say)  # fmt: skip
        result = patch_header(header, cfg)
        if cfg.uses_group and result.sites.group_missing and _grouping(cfg) != _grouping(PatchConfig()):
            progress.say(f"note: the header lacks what the grouped form calls ({', '.join(result.sites.group_missing)}): "
                         "it is left out, and every kernel reads its KV blocks once per query head")  # fmt: skip
        new_state = State(tree=str(target.root), version=version, config=cfg.to_toml_dict(), marker=cfg.marker(),
                          stock_sha256=sha256(result.stock))  # fmt: skip
        write_header_and_state(target, current, result.patched, new_state, cwd, seen=seen, force_write=o.force_write)
    diffs: tuple[str, ...] = ()
    if tuned is not None:
        from .common import local_machine

        diffs = tuple(differences(tuned, o.here if o.here is not None else local_machine()))
    return ApplyReport(target, version, cfg, result, current, tuned, diffs, tuple(lines), tuple(overridden))
