"""The AST walks of the patch package are iterative: a header nesting ``else if`` a thousand deep
(the dispatch a thousand rules render) is walked to its end, with no RecursionError printed from
inside libclang's callback and none of the tree silently skipped."""

from __future__ import annotations

import sys

import pytest
from conftest import fixture_text

from kvpatch.patch import read_header
from kvpatch.patch.cursors import walk
from kvpatch.patch.libclang import ci
from kvpatch.patch.parse import parse_header

DEPTH = 1500


def deep(depth: int = DEPTH) -> str:
    """A function template whose ``if constexpr`` chain nests ``depth`` deep in the AST."""
    chain = "\n  else ".join(f"if constexpr (N == {i}) {{ return {i}; }}" for i in range(depth))
    return f"\ntemplate <int N> __device__ int kvpatch_deep() {{\n  {chain}\n  return -1;\n}}\n"


def test_a_thousand_rules_deep_ast_is_walked_to_its_end(header_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    printed: list = []
    monkeypatch.setattr(sys, "unraisablehook", printed.append)
    text = fixture_text().replace("#include <cstdint>\n", "#include <cstdint>\n" + deep(), 1)  # before the kernel
    header = read_header(text, header_path)
    assert header.sites.key.loop_var == "block_idx"
    parsed = parse_header(text, header_path)
    returns = sum(1 for n in walk(parsed.tu.cursor) if n.kind == ci.CursorKind.RETURN_STMT)
    assert returns >= DEPTH + 1  # every branch of the chain visited
    assert printed == [], printed[0].exc_value if printed else None
