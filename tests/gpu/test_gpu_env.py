"""kvpatch.gpu.env: nvidia-smi's clock event reasons decoded, and its per-round samples
summarised into windows flagged when they ran power-capped or throttled."""

from __future__ import annotations

from kvpatch.gpu import env as E


def test_decode_clock_event_reasons():
    assert E.decode_event_reasons("0x0000000000000000") == []
    assert E.decode_event_reasons("0x0000000000000004") == ["sw_power_cap"]
    assert E.decode_event_reasons("0x0000000000000041") == ["gpu_idle", "hw_thermal_slowdown"]
    assert E.decode_event_reasons(0x1000) == ["bit_0x1000"]
    assert E.decode_event_reasons("[N/A]") == [] and E.decode_event_reasons("") == []


def test_window_summary_flags_power_capped_rounds():
    lines = [
        "2026/11/30 12:00:00.000, 0, 1980, 3201, 650.10, 700.00, 60, 0x0000000000000000",
        "2026/11/30 12:00:00.100, 0, 1755, 3201, 699.80, 700.00, 62, 0x0000000000000004",
        "2026/11/30 12:00:00.200, 0, 1980, 3201, 500.00, 700.00, 61, 0x0000000000000000",
        "garbage line",
    ]
    samples = [s for s in map(E.parse_sample_line, lines) if s is not None]
    assert len(samples) == 3 and samples[1].reasons == ("sw_power_cap",) and samples[0].sm_mhz == 1980.0
    t0 = samples[0].t
    w = E.window_summary(samples, t0 - 0.01, t0 + 0.15)
    assert w["samples"] == 2 and w["sm_mhz"] == [1755.0, 1980.0] and w["power_w"] == [650.1, 699.8]
    assert w["power_capped"] and w["flagged"] and w["throttled"] == ["sw_power_cap"]
    calm = E.window_summary(samples, t0 + 0.15, t0 + 0.25)
    assert calm["samples"] == 1 and not calm["flagged"]
    assert E.window_summary(samples, t0 + 10, t0 + 11) == {"t0": t0 + 10, "t1": t0 + 11, "samples": 0}
