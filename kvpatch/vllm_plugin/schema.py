"""The two ops' schemas: read from a release's ``csrc/torch_bindings.cpp``, compared
with the live ops'.

vLLM defines its ops in C++ with ``ops.def("paged_attention_v1(" "    Tensor! out, ..."
") -> ()")``: one schema split over adjacent string literals. The bundle records each
op's text from the release it was built for; :func:`schema_mismatch` parses it with
``torch._C.parse_schema`` and compares it, argument by argument, with the schema of
the op the running process has. torch is imported inside the functions only.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import ArgumentError, text_argument

#: The ops the plugin replaces.
OPS = ("paged_attention_v1", "paged_attention_v2")

# One C++ string literal (plain or raw), or what may stand between adjacent ones.
_LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"|R"([^()\s\\]{0,16})\((.*?)\)\2"', re.DOTALL)
_GAP = re.compile(r"(?:\s+|//[^\n]*|/\*.*?\*/)*", re.DOTALL)
_DEF = re.compile(r"\.\s*def\s*\(")
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), text)


def _literals_at(text: str, pos: int) -> str | None:
    """The concatenation of the adjacent string literals starting at ``pos`` (after
    whitespace and comments), or None when no literal starts there."""
    parts: list[str] = []
    while True:
        pos = _GAP.match(text, pos).end()
        m = _LITERAL.match(text, pos)
        if m is None:
            return "".join(parts) if parts else None
        parts.append(_unescape(m.group(1)) if m.group(1) is not None else m.group(3))
        pos = m.end()


def normalize_schema(text: str) -> str:
    """Whitespace collapsed: ``'f(  Tensor a,\\n int b) -> ()'`` -> ``'f(Tensor a, int b) -> ()'``."""
    text = re.sub(r"\s+", " ", text.strip())
    return re.sub(r"\(\s+", "(", re.sub(r"\s+\)", ")", text))


def schemas_from_bindings(text: str, ops: tuple[str, ...] = OPS) -> dict[str, str]:
    """``{"paged_attention_v1": "...", "paged_attention_v2": "..."}``: each op's schema text
    as ``torch_bindings.cpp`` defines it (its ``.def(`` string literals joined, whitespace
    collapsed). :class:`~kvpatch.errors.ArgumentError` (a ``ValueError``) naming the op when one is
    missing or defined twice; a ``UsageError`` for text that is not a ``str``."""
    text = text_argument(text, "the bindings' text")
    found: dict[str, list[str]] = {op: [] for op in ops}
    for m in _DEF.finditer(text):
        schema = _literals_at(text, m.end())
        if schema is None:
            continue
        name = re.match(r"\s*([A-Za-z_][A-Za-z0-9_.]*)\s*\(", schema)
        if name and name.group(1) in found:
            found[name.group(1)].append(normalize_schema(schema))
    out: dict[str, str] = {}
    for op, texts in found.items():
        if not texts:
            raise ArgumentError(f'no ops.def("{op}(...)") in the bindings')
        if len(set(texts)) > 1:
            raise ArgumentError(f"{op} is defined {len(texts)} times in the bindings, differently")
        out[op] = texts[0]
    return out


# --------------------------------------------------------------------------- comparing


def _describe(arg: Any) -> str:
    alias = getattr(arg, "alias_info", None)
    write = "!" if alias is not None and getattr(alias, "is_write", False) else ""
    default = getattr(arg, "default_value", None)
    kw = "*" if getattr(arg, "kwarg_only", False) else ""
    return f"{kw}{arg.type}{write} {arg.name}" + (f"={default!r}" if default is not None else "")


def _bare(schema: Any) -> str:
    """The schema's text without its namespace (``_C::``) and overload name."""
    text = str(schema)
    head, paren, rest = text.partition("(")
    return head.split("::")[-1].split(".")[0] + paren + rest


def schema_mismatch(recorded: str, live: Any) -> str | None:
    """None when ``recorded`` (the text the bundle holds) parses to the live op's schema
    (a ``torch._C.FunctionSchema``), else what differs, in one phrase: the first
    argument renamed, retyped, added or dropped, or the returns."""
    recorded = text_argument(recorded, "the recorded schema")
    import torch

    try:
        want = torch._C.parse_schema(recorded)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "parse error"
        return f"the recorded schema does not parse: {first}"
    a, b = list(want.arguments), list(live.arguments)
    for i, (x, y) in enumerate(zip(a, b)):
        if _describe(x) != _describe(y):
            return f"argument {i} is '{_describe(y)}' in the installed op, '{_describe(x)}' in the bundle's"
    if len(b) > len(a):
        return f"the installed op has {len(b) - len(a)} more argument(s), from '{_describe(b[len(a)])}'"
    if len(a) > len(b):
        return f"the installed op lacks argument(s) from '{_describe(a[len(b)])}'"
    wr, lr = [str(r.type) for r in want.returns], [str(r.type) for r in live.returns]
    if wr != lr:
        return f"the installed op returns ({', '.join(lr)}), the bundle's ({', '.join(wr)})"
    if _bare(want) != _bare(live):  # anything the argument walk did not name
        return f"the installed op is '{_bare(live)}', the bundle's '{_bare(want)}'"
    return None


def scales_by_value(schema_text: str) -> bool:
    """Whether a schema takes ``float k_scale`` (vLLM 0.6.4) rather than ``Tensor k_scale``."""
    return re.search(r"\bfloat\s+k_scale\b", schema_text) is not None
