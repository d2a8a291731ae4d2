"""kvpatch.gpu.report: what every report's JSON shares -- strict JSON, whatever the numbers."""

from __future__ import annotations

import json

from kvpatch.gpu import report as Rp


def test_json_safe():
    assert Rp.json_safe({"a": float("nan"), "b": (1, float("inf")), 3: [1.5]}) == {
        "a": "nan", "b": [1, "inf"], "3": [1.5]}  # fmt: skip


def test_dumps_writes_strict_json_of_nan_and_unknown_objects():
    text = Rp.dumps({"x": float("-inf"), "path": Rp})
    assert json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c))) == {
        "x": "-inf", "path": str(Rp)}  # fmt: skip
