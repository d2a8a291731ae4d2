"""The commands' reports have their types: what a command returns and what the rendering takes
is named (a dataclass of the room that makes it), never ``Any``, so a reader of a command or of
its rendering finds the report's fields."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "kvpatch"
#: The parameters of a rendering that hold a command's report.
REPORT_PARAMS = {"report", "decision", "result", "outcome"}


def _untyped(folder: str, wanted) -> list[str]:
    found = []
    for path in sorted((PACKAGE / folder).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                found += [f"{path.name}:{node.name}{what}" for what in wanted(node)]
    return found


def _is_any(annotation: ast.expr | None) -> bool:
    return annotation is None or ast.unparse(annotation) == "Any"


def test_every_command_returns_a_typed_report() -> None:
    def wanted(fn: ast.FunctionDef) -> list[str]:
        command = fn.name in ("run", "enable", "status", "check") or fn.name.startswith("run_")
        return [" -> Any"] if command and _is_any(fn.returns) else []

    assert _untyped("commands", wanted) == []


def test_every_rendering_names_the_report_it_takes() -> None:
    def wanted(fn: ast.FunctionDef) -> list[str]:
        return [f"({a.arg}: Any)" for a in fn.args.args if a.arg in REPORT_PARAMS and _is_any(a.annotation)]

    assert _untyped("render", wanted) == []
