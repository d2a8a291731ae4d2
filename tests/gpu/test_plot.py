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


def test_a_plot_is_written_in_the_format_its_name_ends_in_through_a_link_in_one_rename(tmp_path):
    """``.svg`` is SVG, ``.pdf`` PDF (not PNG bytes under another name), a link is followed and
    stays a link, and a name with no format of its own is refused (before, matplotlib wrote
    ``noext.png`` beside the ``noext`` that was checked, and ``.txt`` failed after the run)."""
    from kvpatch.errors import UsageError
    from kvpatch.gpu import plot as P

    rep = json.loads(synthetic_report().to_json())
    P.plot_bench(rep, tmp_path / "r.svg")
    assert (tmp_path / "r.svg").read_bytes()[:5] == b"<?xml"
    real = tmp_path / "real.pdf"
    real.write_bytes(b"old")
    (tmp_path / "link.pdf").symlink_to(real)
    P.plot_bench(rep, tmp_path / "link.pdf")
    assert (tmp_path / "link.pdf").is_symlink() and real.read_bytes()[:5] == b"%PDF-"
    for name in ("noext", "r.txt"):
        with pytest.raises(UsageError, match="give a file ending in .png, .pdf, .svg"):
            P.plot_bench(rep, tmp_path / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.pdf", "r.svg", "real.pdf"]
