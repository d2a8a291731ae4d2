"""The decode bench end to end on the CPU (kvpatch.decode.bench and .measure): tiny model shapes,
CPU tensors, CUDA graphs replaced by the eager step, a fake attention library, a fake prefetch
library and the controller's fake stream API (decode_helpers.cpu_bench). What runs is the real
code of kvpatch.decode (arms, windows, forks, the guard, the zero-byte and in-kernel arms, the A/A
twin, rounds, the report and its text): a Python error there would otherwise first show on the GPU."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from decode_helpers import cpu_bench, one_thread  # noqa: E402

from kvpatch.decode import bench as BENCH  # noqa: E402
from kvpatch.decode.arms import default_arms  # noqa: E402
from kvpatch.decode.options import MiB, WeightPrefetch  # noqa: E402
from kvpatch.decode.windows import TailPrefetch, Window  # noqa: E402
from kvpatch.errors import UsageError  # noqa: E402


@pytest.fixture
def cpu(monkeypatch):
    with one_thread():
        yield cpu_bench(monkeypatch)


@pytest.mark.slow  # a few hundred eager steps
def test_bench_decode_runs_every_control_on_the_cpu(cpu, tmp_path):
    libs, pf, tails = cpu
    wpf = WeightPrefetch()  # the default windows, the library's evict_last: the guard is on
    tail = TailPrefetch({8: 32 * MiB}, "evict_normal")
    report = BENCH.run_bench_decode(libs, models=["llama-3.1-8b"], dtypes=["bf16"], batches=[1, 8], contexts=[64],
                                    layers=3, rounds=2, cycles=1, weight_prefetch=wpf, tail=tail,
                                    json_path=tmp_path / "d.json")  # fmt: skip
    names = [a.name for a in default_arms(libs, wpf, tail=tail)]
    assert (
        report.variants
        == names
        == ["stock", "stock-aa", "patched", "stock+zero", "stock+wpf", "tail", "tail+zero", "patched+wpf"]
    )
    assert len(report.points) == 2 and report.summary()["all_identical"]
    p = report.points[0]
    assert (
        p["guard"]["on"]
        and p["guard"]["hinted_arms"] == ["patched+wpf", "stock+wpf"]
        and p["guard"]["demoted_bytes"] > 0
    )
    assert p["aa"] is not None and set(p["variants"]) == set(names)
    assert (
        p["variants"]["stock+wpf"]["speedup_vs_zero"] is not None and p["variants"]["patched+wpf"]["speedup_vs_library"]
    )
    # 3 layers: oproj->gateup and gateup->down in each, down->qkv in the first two
    assert p["variants"]["stock+wpf"]["forks"] == p["variants"]["stock+zero"]["forks"] == 8
    assert p["variants"]["stock+zero"]["prefetch_bytes"] == 0 < p["variants"]["stock+wpf"]["prefetch_bytes"]
    assert any(r[0] == "prefetch" and r[1] == 0 for r in pf.runs)  # the zero-byte arm: no rows
    assert any(r[0] == "demote" and r[1] > 0 for r in pf.runs)  # the guard
    assert all(rows for rows, hint, _ in tails["tail"].tables if hint) and len(tails["tail"].tables[0][0]) == 3
    for r in p["raw"]:  # every sample is kept, with the order it ran in
        assert set(r["samples_us"]) == set(r["order"]) and all(
            len(v) == len(r["order"]) * r["cycles"] for v in r["samples_us"].values()
        )
    assert p["carryover"]["hinted_arms"] == ["patched+wpf", "stock+wpf"] and "stock" in p["carryover"]
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["summary"]["aa"]["of"] == 2 and data["guard"] == "auto"
    from kvpatch.render import decode_text

    text = decode_text(data)
    assert "A/A twin" in text and "stock+zero x" in text and "in-kernel" in text and "bit-identical" in text


def test_without_evict_last_there_is_no_guard_and_guard_off_is_honoured(cpu):
    libs, pf, _ = cpu
    normal = WeightPrefetch(windows=(Window("gateup->down", 8 * MiB, "evict_normal"),))
    report = BENCH.run_bench_decode(libs, models=["llama-3.2-1b"], dtypes=["bf16"], batches=[4], contexts=[32], layers=2,
                                    rounds=2, cycles=1, weight_prefetch=normal, attention=False)  # fmt: skip
    assert not report.points[0]["guard"]["on"] and report.points[0]["carryover"] is None
    assert not any(r[0] == "demote" for r in pf.runs)
    last = WeightPrefetch(windows=(Window("gateup->down", 8 * MiB, "evict_last"),))
    report = BENCH.run_bench_decode(libs, models=["llama-3.2-1b"], dtypes=["bf16"], batches=[4], contexts=[32], layers=2,
                                    rounds=2, cycles=1, weight_prefetch=last, guard="off", attention=False)  # fmt: skip
    assert not report.points[0]["guard"]["on"] and report.points[0]["carryover"] is not None


def test_a_run_without_weight_prefetch_neither_builds_nor_loads_the_prefetch_library(cpu, monkeypatch):
    """No arm prefetches weights (``--cap off``): the prefetch library is not asked for (a machine
    without what its build needs still times the attention libraries); a weight-prefetch arm, or a
    library given, asks for it."""
    libs, pf, _ = cpu
    asked = []
    monkeypatch.setattr(BENCH, "prefetch_library_for", lambda lib, dev: asked.append(lib) or pf)
    off = WeightPrefetch.parse("cap=off")  # what --cap off gives
    assert off.off()
    report = _run({"stock": libs["stock"], "patched": libs["patched"]}, weight_prefetch=off)
    assert asked == [] and report.env["prefetch_library"] is None
    assert report.variants == ["stock", "stock-aa", "patched"] and report.summary()["all_identical"]
    _run({"stock": libs["stock"]}, weight_prefetch=off, prefetch_library="given.so")
    assert asked == ["given.so"]
    _run({"stock": libs["stock"]}, weight_prefetch=WeightPrefetch(), attention=False)
    assert asked == ["given.so", None]


def _run(libs, **kw):
    return BENCH.run_bench_decode(libs, models=["llama-3.2-1b"], dtypes=["bf16"], batches=[4], contexts=[32], layers=2,
                                  rounds=1, cycles=1, **kw)  # fmt: skip


def test_what_bench_decode_cannot_time_is_a_usage_error_before_any_step(cpu, monkeypatch):
    """Libraries without ``stock``, a library named like an arm kvpatch adds, in-kernel arms over
    libraries that are no weight-tail builds: each a UsageError (one line, exit 2), not a traceback."""
    libs, _, _ = cpu
    with pytest.raises(UsageError, match="the libraries must include 'stock'"):
        _run({"patched": libs["patched"]})
    with pytest.raises(UsageError, match=r"arm name\(s\) given twice: stock-aa"):
        _run({"stock": libs["stock"], "stock-aa": libs["patched"]})
    with monkeypatch.context() as m:
        m.setattr(BENCH, "weight_tails", lambda libs: {})  # a 'tail' library that is no weight-tail build
        with pytest.raises(UsageError, match="in-kernel arms need weight-tail builds: tail is not one"):
            _run({"stock": libs["stock"], "tail": libs["tail"]}, tail=TailPrefetch({8: 32 * MiB}, "evict_normal"))
    with pytest.raises(UsageError, match="bench-decode dtypes are fp16 and bf16, not fp32"):
        BENCH.run_bench_decode(libs, models=["llama-3.2-1b"], dtypes=["fp32"], batches=[4], contexts=[32], layers=2,
                               rounds=1, cycles=1)  # fmt: skip


def test_a_library_taking_scales_by_value_or_a_guard_without_demote_is_a_usage_error(cpu):
    from types import SimpleNamespace

    from kvpatch.decode.measure import Guard
    from kvpatch.decode.step import DecodeStep

    with pytest.raises(UsageError, match="takes k/v scales by value"):
        DecodeStep.lib_check(None, SimpleNamespace(scale_by_value=True))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="needs the prefetch library's demote mode"):
        Guard(SimpleNamespace(modes=("prefetch",)), [(4096, 4096)], torch.device("cpu"))
