"""The decode bench's report (kvpatch.decode.report) and its text (kvpatch.render.decode): what a
user reads (the machine, each arm's configuration, one line per point with median [min..max]
speedups, the summary's verdicts, skipped points, a mismatch shouted), the JSON round trip
that renders the same, the progress line, the plot."""

from __future__ import annotations

import json

import pytest

from kvpatch.decode.arms import default_arms
from kvpatch.decode.options import WeightPrefetch
from kvpatch.decode.report import DecodeReport
from kvpatch.render import decode_text

ARMS = default_arms(["stock", "patched"], WeightPrefetch(), aa=False, zero=False)
NAMES = [a.name for a in ARMS]
#: The machine as kvpatch.gpu.env.collect_env records it.
ENV = {"gpu": {"name": "NVIDIA H200", "capability": "9.0", "sm_count": 132, "L2_cache_size": 60 << 20}, "torch": "2.11.0",
       "torch_cuda": "13.0", "nvidia_smi": [{"driver_version": "580.159.03", "clocks.sm": "1980", "clocks.max.sm": "1980",
       "clocks.mem": "3201", "power.limit": "700"}], "prefetch_library": {"config": "chunk=4096,line=128,hint=evict_last,threads=32,demote"}}  # fmt: skip


def _point(batch, speed, identical=True):
    def var(us, ratio):
        return {"step_us": {"median": us, "min": us * 0.99, "max": us * 1.01}, "tokens_per_s": batch / us * 1e6,
                "speedup": {"median": ratio, "min": ratio - 0.01, "max": ratio + 0.01}, "attention_share": 0.4}  # fmt: skip

    return {"model": "llama-3.1-8b", "dtype": "bf16", "batch": batch, "context": 1024, "kernel": "v2", "layers": 8,
            "all_identical": identical, "power_capped_rounds": 0,
            "variants": {"stock": var(1000.0, 1.0), "patched": var(1000 / speed, speed),
                         "stock+wpf": var(950.0, 1000 / 950), "patched+wpf": var(900.0, 1000 / 900)}}  # fmt: skip


def _report(points, **kw):
    return DecodeReport(variants=NAMES, layers=8, rounds=5, mode="warm", caps_bytes=0, env=ENV, points=points,
                        arms=[a.to_dict() for a in ARMS], **kw)  # fmt: skip


def test_report_text_and_json():
    rep = _report(
        [_point(1, 1.2), _point(4, 0.95)],
        skipped=[{"model": "llama-3.1-8b", "dtype": "bf16", "batch": 64, "context": 16384, "reason": "too big"}],
    )
    text = decode_text(rep)
    assert text.startswith(
        "kvpatch bench-decode: NVIDIA H200 (cc 9.0, 132 SMs, L2 60 MiB), warm L2, 8 layers, 5 rounds\n"
    )
    assert (
        "driver 580.159.03" in text
        and "prefetch library: chunk=4096,line=128,hint=evict_last,threads=32,demote" in text
    )
    assert (
        "  stock+wpf: library stock, oproj->gateup=8:12;gateup->down=8:8;down->qkv=8:12" in text
    )  # what each arm prefetches
    assert "  patched: library patched, plain step" in text
    assert "1.200 [1.190..1.210]" in text and "0.950 [0.940..0.960]" in text
    assert ("patched: geomean 1.0677x, worst median 0.9500x, worst round-min 0.9400x; "
            "faster at 1, slower at 1, within noise at 0 of 2 points") in text  # fmt: skip
    assert (
        "skipped llama-3.1-8b bf16 B=64 ctx=16384: too big" in text and "bit-identical to stock at every point" in text
    )
    assert rep.summary()["best_variant_counts"] == {"patched+wpf": 1, "patched": 1}
    data = json.loads(json.dumps(rep.to_dict()))
    assert data["format"] == "kvpatch.bench-decode/1" and data["summary"]["all_identical"]
    assert DecodeReport.from_dict(data).points == rep.points
    assert decode_text(data) == text  # the saved JSON renders the same
    line = rep.point_line(rep.points[0])
    assert line.startswith("llama-3.1-8b bf16 B=1 ctx=1024 v2: stock 1000.0 us patched 1.200x")
    assert "attn 40%" in line and line.endswith("identical")


def test_a_mismatch_is_shouted():
    rep = _report([_point(1, 1.0), _point(4, 1.0, identical=False)])
    text = decode_text(rep)
    assert not rep.summary()["all_identical"] and "OUTPUTS DIFFER FROM STOCK" in text
    assert [row.split()[-1] for row in text.splitlines() if row.startswith("llama-3.1-8b")] == ["yes", "NO"]
    assert rep.point_line(rep.points[1]).endswith("NOT IDENTICAL")


def test_reports_written_before_the_environment_snapshot_still_render():
    rep = DecodeReport(
        variants=NAMES,
        layers=8,
        rounds=5,
        mode="cold",
        caps_bytes=0,
        env={"gpu": "NVIDIA H100", "l2_bytes": 50 << 20, "smi": {"driver_version": "550"}},
        points=[_point(1, 1.0)],
    )
    text = decode_text(rep.to_dict())
    assert (
        text.startswith("kvpatch bench-decode: NVIDIA H100 (cc ?, ? SMs, L2 50 MiB), cold L2") and "driver 550" in text
    )


def test_a_point_is_faster_or_slower_only_when_its_whole_interval_is():
    rep = _report([_point(1, 1.005), _point(4, 0.995), _point(16, 1.02)])
    s = rep.summary()["patched"]
    assert (s["faster"], s["slower"], s["noise"]) == (1, 0, 2)
    assert "patched: geomean" in decode_text(
        rep
    ) and "faster at 1, slower at 0, within noise at 2 of 3 points" in decode_text(rep)


@pytest.mark.slow  # matplotlib
def test_the_plot_has_a_panel_per_model_and_dtype(tmp_path):
    pytest.importorskip("matplotlib")

    def png_height(path):
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
        return int.from_bytes(data[20:24], "big")

    one = _report([_point(1, 1.2), _point(4, 0.95)])
    two = _report([_point(1, 1.2), _point(4, 0.95), {**_point(1, 1.1), "dtype": "fp16"}])
    assert one.plot(tmp_path / "one.png") == str(tmp_path / "one.png")
    two.plot(tmp_path / "two.png")
    assert png_height(tmp_path / "two.png") == 2 * png_height(tmp_path / "one.png")  # bf16 and fp16: a panel each
