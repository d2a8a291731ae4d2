"""One job, one implementation: each of these jobs is done in one module, and a second copy
coming back anywhere else fails here.

Read from the source's AST: string constants in code (docstrings left out), definitions,
and imports. Each check names the module that owns the job.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kvpatch"


def _code_strings(tree: ast.AST) -> set[str]:
    """String constants of the module that are not docstrings."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                docs.add(id(body[0].value))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            out.add(node.value)
        elif isinstance(node, ast.JoinedStr):
            out.update(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return out


@pytest.fixture(scope="module")
def modules() -> dict[str, tuple[ast.AST, set[str]]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out[path.relative_to(ROOT).as_posix()] = (tree, _code_strings(tree))
    return out


def _users(modules, needle: str) -> list[str]:
    """Modules with a code string that is ``needle`` (an argument: ``--dump-sass``) or, for a
    needle with a space or a bracket (a pattern or a line), holds it."""
    exact = not any(c in needle for c in " (/")
    return sorted(name for name, (_, strings) in modules.items()
                  if any(s == needle if exact else needle in s for s in strings))  # fmt: skip


#: (what the code spells, the one module allowed to): a job each.
OWNERS = [
    ("nvidia-smi", ["kvpatch/gpu/env.py"]),  # the one environment reader (clocks, throttling)
    ("bfloat16", ["kvpatch/dtypes.py"]),  # the one dtype table
    ("__nv_bfloat16", ["kvpatch/dtypes.py"]),
    ("--dump-sass", ["kvpatch/jit/sass.py"]),  # the one SASS reader
    ("code for (sm_", ["kvpatch/jit/sass.py"]),
    ("// kvpatch:begin", ["kvpatch/patch/markers.py"]),  # the one marker reader
    ("--list-gpu-arch", ["kvpatch/jit/toolchain.py"]),  # the one nvcc finder
]


@pytest.mark.parametrize("needle, owners", OWNERS)
def test_one_module_spells_it(modules, needle: str, owners: list[str]) -> None:
    assert _users(modules, needle) == owners


def _calls(tree: ast.AST, attr: str) -> int:
    """Calls of ``X.attr(...)`` or ``attr(...)`` with ``enable_timing=True`` (events) or any."""
    n = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name == attr:
                n += 1
    return n


def test_one_timer(modules) -> None:
    """Only kvpatch.gpu.timing makes timing events; every other measurement uses its timer."""
    timing = [name for name, (tree, _) in modules.items() if any(
        isinstance(n, ast.keyword) and n.arg == "enable_timing" for n in ast.walk(tree))]  # fmt: skip
    assert timing == ["kvpatch/gpu/timing.py"]


def test_one_flush(modules) -> None:
    """One L2 flush class, and the decode step and micro-benchmarks take it from kvpatch.gpu.flush."""
    flushes = sorted(name for name, (tree, _) in modules.items() for n in ast.walk(tree)
                     if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and "flush" in n.name.lower())  # fmt: skip
    assert flushes == ["kvpatch/gpu/flush.py"]
    for user in (
        "kvpatch/decode/bench.py",
        "kvpatch/decode/micro.py",
        "kvpatch/decode/sweep.py",
        "kvpatch/gpu/bench.py",
    ):
        tree, _ = modules[user]
        froms = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert any(a == "L2Flush" and (m or "").endswith("flush") for m, a in froms), user


def test_one_jit_path(modules) -> None:
    """nvcc compiles only through kvpatch.jit.library (and vLLM's own build, jit.full): every
    library kvpatch builds, the weight-prefetch kernel's too, takes that one path."""
    popen = sorted(
        name for name, (tree, _) in modules.items() if _calls(tree, "Popen") and name.startswith("kvpatch/jit/")
    )
    assert popen == ["kvpatch/jit/full.py", "kvpatch/jit/library.py", "kvpatch/jit/sass.py"]
    prefetch = modules["kvpatch/prefetch/kernel.py"][0]
    assert not any(
        isinstance(n, ast.Import) and any(a.name == "subprocess" for a in n.names) for n in ast.walk(prefetch)
    )


def _restated_rules(text: str, rules) -> int:
    """How many of ``rules`` (selector, settings) ``text`` states: the quoted selector, then
    within 300 characters every string value of its settings (``off`` for an off rule). A
    selector used as a name alone (a kernel in a test's data) is not a restatement."""
    n = 0
    for sel, settings in rules:
        values = [str(v) for k, v in settings if isinstance(v, str)] or (["off"] if dict(settings).get("off") else [])
        for quote in ("'", '"'):
            at = text.find(f"{quote}{sel}{quote}")
            while at >= 0:
                if all(v in text[at : at + 300] for v in values):
                    n += 1
                    break
                at = text.find(f"{quote}{sel}{quote}", at + 1)
            else:
                continue
            break
    return n


def test_the_shipped_table_is_stated_once() -> None:
    """DEFAULT_OVERRIDES' rules (a selector with its settings) appear together only in
    kvpatch/config/defaults.py: no other module, test, doc or script restates the table (a few
    rules, or selectors as names, are fine)."""
    from kvpatch.config.defaults import DEFAULT_OVERRIDES

    rules = [(sel, settings) for sel, settings in DEFAULT_OVERRIDES if "/" in sel]
    places = [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "docs").rglob("*.md"),
              ROOT / "README.md", *(ROOT / "scripts").glob("*")]  # fmt: skip
    restating = sorted(str(p.relative_to(ROOT)) for p in places if p.is_file()
                       and _restated_rules(p.read_text(encoding="utf-8", errors="replace"), rules) > len(rules) // 2)  # fmt: skip
    assert restating == ["kvpatch/config/defaults.py"]


def test_the_table_check_sees_a_restatement() -> None:
    """The table written out again, as a test that re-typed it would, is caught; its selectors
    as bare names are not."""
    from kvpatch.config.defaults import DEFAULT_OVERRIDES

    rules = [(sel, settings) for sel, settings in DEFAULT_OVERRIDES if "/" in sel]
    copy = "\n".join(f"    ({sel!r}, {settings!r})," for sel, settings in rules)
    assert _restated_rules(copy, rules) == len(rules)
    names = ", ".join(repr(sel) for sel, _ in rules)
    assert _restated_rules(f"KERNELS = [{names}]", rules) <= len(rules) // 2


def test_the_checks_see_a_second_copy(tmp_path: Path) -> None:
    """The string reader finds code strings and skips docstrings."""
    tree = ast.parse('"""nvidia-smi in a docstring"""\nX = ["nvidia-smi", "--query-gpu"]\n')
    assert _code_strings(tree) == {"nvidia-smi", "--query-gpu"}
    tree = ast.parse('def f():\n    """nvidia-smi"""\n    return 1\n')
    assert _code_strings(tree) == set()
