"""The package's layout, read from the source: one room per concern, imports only downwards,
no circles, no module too large to read as one concern.

Every import counts, also one inside a function or under ``TYPE_CHECKING``: a lazy import
still makes the importing module depend on the imported one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kvpatch"

#: The rooms, from the ground floor up. A module may import from its own room and from any
#: room on a lower floor, never from its own floor's other rooms or from above.
FLOORS: dict[str, int] = {
    "__init__": 0, "errors": 0,
    "dtypes": 1, "arch": 1, "fsutil": 1, "templating": 1, "progress": 1,
    "abi": 2,
    "config": 3, "source": 3, "vllm_plugin": 3,
    "patch": 4,
    "jit": 5,
    "gpu": 6, "prefetch": 6,
    "tune": 7, "decode": 7, "serving": 7,
    "commands": 8,
    "render": 9,
    "cli": 10,
    "__main__": 11,
}  # fmt: skip
#: A module over this many lines is more than one concern.
MAX_LINES = 400


def modules() -> dict[str, Path]:
    """``'kvpatch.gpu.timing'`` -> its file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules ``name`` imports (``from . import x`` resolves to ``x`` when it is a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    out = set()
    for target in found:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name and target.startswith("kvpatch"):
            out.add(target)
    return out


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def test_every_room_has_a_floor() -> None:
    rooms = {room(m) for m in modules()}
    assert sorted(rooms - set(FLOORS)) == []


def test_imports_run_only_downwards(graph: dict[str, set[str]]) -> None:
    upward = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                    if room(a) != room(b) and FLOORS[room(b)] >= FLOORS[room(a)])  # fmt: skip
    assert upward == []


def test_no_circles(graph: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}
    circles: list[str] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(path[path.index(nxt) :] + [nxt]) if nxt in path else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert circles == []


def test_render_is_imported_by_the_cli_alone(graph: dict[str, set[str]]) -> None:
    users = sorted(
        a
        for a, targets in graph.items()
        if "kvpatch.render" in targets or any(t.startswith("kvpatch.render.") for t in targets)
    )
    assert [u for u in users if room(u) not in ("cli", "render")] == []


#: What the CLI may import besides itself: the commands, the rendering and the ground floors
#: (the package's root, errors, the small helpers). Everything else it reaches through commands/.
CLI_MAY_IMPORT = {"commands", "render"} | {r for r, floor in FLOORS.items() if floor <= 2}
#: Imports of cli modules kept for now; commands/ already offers each (``commands.choices.SETTINGS``
#: and ``Setting``, ``commands.diff.check_output``), so the module can import those instead.
CLI_PENDING: dict[str, set[str]] = {}


def cli_reaching_past_commands(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in graph.items() if room(a) == "cli" for b in targets
                  if room(b) not in CLI_MAY_IMPORT | {"cli"} and b not in CLI_PENDING.get(a, set()))  # fmt: skip


def test_the_cli_imports_commands_render_and_the_ground_floors_only(graph: dict[str, set[str]]) -> None:
    """cli -> commands -> the rest: the shell parses, calls a command and renders its report."""
    assert cli_reaching_past_commands(graph) == []


def test_the_cli_check_sees_a_cli_module_reaching_past_commands() -> None:
    graph = {"kvpatch.cli.decode": {"kvpatch.decode.models", "kvpatch.commands.decode", "kvpatch.errors"},
             "kvpatch.cli.base": {"kvpatch.gpu.defaults", "kvpatch.progress"},
             "kvpatch.cli.plugin": {"kvpatch.source.workspace", "kvpatch.jit", "kvpatch.patch", "kvpatch.render"}}  # fmt: skip
    assert cli_reaching_past_commands(graph) == [
        "kvpatch.cli.base -> kvpatch.gpu.defaults", "kvpatch.cli.decode -> kvpatch.decode.models",
        "kvpatch.cli.plugin -> kvpatch.jit", "kvpatch.cli.plugin -> kvpatch.patch",
        "kvpatch.cli.plugin -> kvpatch.source.workspace",
    ]  # fmt: skip


def test_above_jit_only_commands_reach_releases_and_trees(graph: dict[str, set[str]]) -> None:
    """Fetching a release, reading a tree or the workspace (``source``) is composed in commands/
    alone: the measuring and decode rooms take texts, variants and libraries, never a release."""
    reach = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                   if room(b) == "source" and FLOORS["jit"] < FLOORS[room(a)] < FLOORS["commands"])  # fmt: skip
    assert reach == []


def test_no_module_is_too_long() -> None:
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}  # fmt: skip
    assert long == {}


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The reader resolves relative imports: a module of ``config`` importing ``..jit`` is found."""
    fake = tmp_path / "kvpatch" / "config"
    fake.mkdir(parents=True)
    (fake / "model.py").write_text("from ..jit import plan\n")
    found = imports_of(
        "kvpatch.config.model", fake / "model.py", {"kvpatch.jit", "kvpatch.jit.plan", "kvpatch.config.model"}
    )
    assert found == {"kvpatch.jit", "kvpatch.jit.plan"}
