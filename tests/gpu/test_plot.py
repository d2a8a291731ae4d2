"""kvpatch.gpu.plot: a bench report as speedup series and a PNG."""

from __future__ import annotations

import json

import pytest
from gpu_helpers import synthetic_report

pytest.importorskip("matplotlib")


def test_plot_bench_writes_png(tmp_path):
    from kvpatch.gpu import plot as P

    rep = synthetic_report()
    series = P.speedup_series(rep)
    assert set(series) == {("fp16", "warm"), ("fp16", "cold"), ("bf16", "warm"), ("bf16", "cold")}
    assert series[("fp16", "warm")]["series"]["fast"]["speedup"] == [2.0, 2.0]
    assert series[("fp16", "warm")]["series"]["slow"]["speedup"] == [0.8, 0.8]
    out = P.plot_bench(json.loads(rep.to_json()), tmp_path / "r.png")
    data = open(out, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
