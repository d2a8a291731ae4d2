"""kvpatch.gpu.bench_report: raw per-round samples -> timings, speedups and their intervals;
the summary per variant, dtype, mode and scope; which slower points run stock's own code."""

from __future__ import annotations

import io
import json

import pytest
from gpu_helpers import synthetic_report
from rich.console import Console

from kvpatch.config import make_config
from kvpatch.gpu import bench_report as Br
from kvpatch.gpu import points as P
from kvpatch.render import bench_summary_table, print_bench


def test_finish_results_stats():
    rep = synthetic_report()
    r = next(x for x in rep.results if x.point.batch == 64 and x.kernel == "v1" and x.mode == "warm")
    assert r.dispatched
    st = r.variants["stock"]
    assert st.round_medians_us == [100.0, 100.0] and st.median_us == 100.0
    assert st.p10_us == pytest.approx(95.0) and st.p90_us == pytest.approx(105.0)
    assert r.variants["fast"].speedup == 2.0 and r.variants["slow"].speedup == 0.8
    assert r.variants["fast"].speedup_rounds == [2.0, 2.0]
    assert (r.variants["fast"].verdict, r.variants["slow"].verdict) == ("faster", "slower")
    kvb = r.point.kv_bytes
    assert r.variants["fast"].kv_bytes_per_s == pytest.approx(kvb / 50e-6)
    assert r.variants["fast"].copy_fraction == pytest.approx(kvb / 50e-6 / 4e12)


def test_summary_over_dispatched_points():
    rep = synthetic_report()
    rows = {(s["variant"], s["dtype"], s["mode"], s["scope"]): s for s in rep.summary}
    fast = rows[("fast", "fp16", "warm", "dispatched")]
    assert fast["n"] == 2 and fast["min"] == 2.0 and fast["geomean"] == pytest.approx(2.0)
    assert rows[("slow", "bf16", "cold", "dispatched")]["n"] == 1
    assert rows[("slow", "fp16", "warm", "v1")]["n"] == 2
    assert ("stock", "fp16", "warm", "dispatched") not in rows
    mixed = Br.summarize_results(rep.results, ["stock", "fast"])
    assert {r["variant"] for r in mixed} == {"fast"}


def test_summary_counts_points_within_noise():
    names = ["stock", "v"]
    raw = {}
    for i, (b, ctx) in enumerate([(1, 1024), (4, 1024), (16, 1024)]):
        p = P.BenchPoint("fp16", b, ctx)
        per_round = [[10.0], [10.0], [10.0]]
        v = [[[8.0], [8.5], [8.2]], [[10.2], [9.8], [10.0]], [[11.0], [11.5], [10.8]]][i]
        raw[(p, p.dispatched, "warm")] = {"stock": per_round, "v": v}
    rep = Br.BenchReport("stock", names, Br.finish_results(raw, names, 4e12), {}, {})
    row = next(r for r in rep.summary if r["scope"] == "dispatched")
    assert (row["faster"], row["noise"], row["slower"], row["n"]) == (1, 1, 1, 3)
    assert row["worst_hi"] == pytest.approx(10 / 10.8)
    d = json.loads(rep.to_json())
    t = d["results"][2]["variants"]["v"]
    assert t["verdict"] == "slower" and t["speedup_hi"] < 1.0


def test_summary_says_which_slower_points_run_stock_code():
    """A slower verdict on a kernel the variant compiles as stock (a rule turns it off, or an fp8
    cache under quantized=skip) compares stock's code with itself: the summary counts those apart."""
    names = ["stock", "v", "unknown"]
    raw = {}
    for dtype, kv in (("fp16", "auto"), ("bf16", "auto"), ("bf16", "fp8")):
        p = P.BenchPoint(dtype, 4, 1024, kv_cache_dtype=kv)
        slow = [[10.5], [10.6], [10.4]]
        raw[(p, p.dispatched, "warm")] = {"stock": [[10.0]] * 3, "v": slow, "unknown": slow}
    marker = make_config(inherit_rules=False, fp16="off").marker()
    info = {"stock": {"marker": "stock"}, "v": {"marker": marker}, "unknown": {"compile_flags": []}}
    rep = Br.BenchReport("stock", names, Br.finish_results(raw, names, 4e12), {}, {}, variant_info=info)
    rows = {(r["variant"], r["dtype"]): r for r in rep.summary if r["scope"] == "dispatched"}
    assert rows[("v", "fp16")]["slower"] == 1 and rows[("v", "fp16")]["slower_stock_code"] == 1  # fp16 off
    assert rows[("v", "bf16")]["slower"] == 2 and rows[("v", "bf16")]["slower_stock_code"] == 1  # fp8: skipped
    assert rows[("unknown", "bf16")]["slower"] == 2 and rows[("unknown", "bf16")]["slower_stock_code"] is None
    out = io.StringIO()
    Console(file=out, width=300).print(bench_summary_table(rep))
    assert "2 (1 stock code)" in out.getvalue() and "1 (1 stock code)" in out.getvalue()


def test_stock_code_follows_the_grouped_launch():
    """A kernel a rule turns off but groups compiles stock's code and a grouped form: which one
    ran at a point is what the bench measured; unmeasured, it cannot say. Without group, off is
    stock's code whatever was measured; a prefetching kernel never is."""
    off_grouped = make_config(inherit_rules=False, fp16="off", group=4).marker()
    off_plain = make_config(inherit_rules=False, fp16="off").marker()
    on_grouped = make_config(inherit_rules=False, group=4).marker()
    info = {"stock": {"marker": "stock"}, "og": {"marker": off_grouped}, "op": {"marker": off_plain},
            "pg": {"marker": on_grouped}}  # fmt: skip
    sc = Br.stock_code_of(info, "stock")
    at = ("fp16", 128, 16, "auto", "v2")
    assert [sc("og", *at, g) for g in (True, False, None)] == [False, True, None]
    assert [sc("op", *at, g) for g in (True, False, None)] == [False, True, True]
    assert [sc("pg", *at, g) for g in (True, False, None)] == [False, False, False]
    assert sc("missing", *at, False) is None


def _built(marker: str, kernels: dict[str, str], sha: str = "ab" * 32) -> dict:
    """Variant info of a library as kvpatch builds it: its marker, the sha256 measured of the file
    loaded, and its build's SASS digests (recorded for ``sha``)."""
    return {"marker": marker, "sha256": "ab" * 32, "code": {"library_sha256": sha, "kernels": kernels}}


def test_code_of_tells_two_libraries_apart_by_the_sass_their_launch_ran():
    """Same digest for the form a launch ran (vLLM's or the grouped one, measured): the same code.
    Stock's code is one answer for every library. Where it cannot say -- the form not checked on a
    kernel that groups, no digest, digests recorded for another file -- None."""
    plain = make_config(inherit_rules=False).marker()
    grouped = make_config(inherit_rules=False, group=4).marker()
    grouped_ahead = make_config(inherit_rules=False, group=4, group_k_loads="ahead").marker()
    off_grouped = make_config(inherit_rules=False, fp16="off", group=4).marker()
    sel = "fp16/128/16/auto/v2"
    info = {"stock": {"marker": "stock"}, "stock-aa": {"marker": "stock"},
            "a": _built(grouped, {sel: "f1", sel + " grouped": "g1"}),
            "b": _built(grouped, {sel: "f1", sel + " grouped": "g1"}),
            "k": _built(grouped_ahead, {sel: "f1", sel + " grouped": "g1"}),
            "c": _built(plain, {sel: "f2"}),
            "o": _built(off_grouped, {sel + " grouped": "g1"}),
            "stale": _built(grouped, {sel: "f1", sel + " grouped": "g1"}, sha="cd" * 32),
            "bare": {"marker": grouped}}  # fmt: skip
    code = Br.code_of(info, "stock")
    at = ("fp16", 128, 16, "auto", "v2")
    assert code("a", *at, False) == code("b", *at, False) != code("c", *at, False)
    assert code("a", *at, True) == code("b", *at, True) != code("a", *at, False)
    # the same SASS, but another launcher rule picks among its grouped kernels
    assert code("k", *at, True) != code("a", *at, True) and code("k", *at, False) == code("a", *at, False)
    assert code("o", *at, False) == code("stock-aa", *at, None) == Br.STOCK_CODE
    assert [code(n, *at, g) for n, g in (("a", None), ("stale", False), ("bare", False), ("c", True))] == [None] * 4
    assert code("c", *at, None) == code("c", *at, False)  # no grouped form: vLLM's ran
    assert code("a", "fp16", 64, 16, "auto", "v2", False) is None  # no digest for that kernel


def test_bench_report_json_and_tables(tmp_path):
    rep = synthetic_report()
    path = tmp_path / "r.json"
    path.write_text(rep.to_json())
    d = json.loads(path.read_text())
    assert d["kind"] == "kvpatch-bench" and d["variants"] == ["stock", "fast", "slow"]
    assert len(d["results"]) == 12
    assert d["results"][0]["variants"]["stock"]["samples_us"][0] == pytest.approx([100.0, 110.0, 90.0])
    assert {s["scope"] for s in d["summary"]} == {"dispatched", "v1", "v2"}
    c = Console(record=True, width=250)
    print_bench(rep, c)
    text = c.export_text()
    assert "v1*" in text and "2.00" in text and "0.80" in text and "geomean" in text
    assert "[2.00..2.00]" in text and "slower" in text
