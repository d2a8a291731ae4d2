"""Choosing again from saved measurements (``tune --from``, no GPU): exclusions, and several
runs merged kernel by kernel."""

from __future__ import annotations

import pytest
from rich.console import Console
from tune_helpers import saved_report, saved_run

from kvpatch.errors import UsageError
from kvpatch.render import tune_table
from kvpatch.tune import candidates, merge_tune_data, rechoose


def test_rechoose_rules_out_exclusions_and_chooses_again() -> None:
    data = saved_report()
    assert data["picked"] == {"bf16/256/16/auto/v1": "inline_cta_la1", "bf16/256/16/auto/v2": "inline_cta_la1"}
    again = rechoose(data)
    assert again.picked == data["picked"] and again.config.marker() == data["marker"]
    # what vLLM's test found on one kernel: the call form has a slower point there (0.95), so strict turns it off
    r = rechoose(data, exclude=["inline_*@bf16/256/16/auto/v1"])
    assert r.picked == {"bf16/256/16/auto/v1": "off", "bf16/256/16/auto/v2": "inline_cta_la1"}
    assert r.config.resolve("bf16", 256, 16, "auto", "v1").off and r.exclusions == {
        "inline_cta_la1": {"bf16/256/16/auto/v1"}
    }
    assert "inline_cta_la1" not in r.failures  # excluded, not a validation failure
    assert rechoose(data, policy="geomean", exclude=["inline_*@*/v1"]).picked["bf16/256/16/auto/v1"] == "call_cta_la1"
    # an excluded candidate keeps its measured bit-identity: the table says excluded, not "NO"
    ranked = {s["name"]: s for s in r.to_json()["ranking"]["bf16/256/16/auto/v1"]}
    assert ranked["inline_cta_la1"]["excluded"] and ranked["inline_cta_la1"]["bit_identical"]
    assert not ranked["inline_cta_la1"]["qualifies"] and not ranked["call_cta_la1"]["excluded"]
    console = Console(width=200, record=True)
    console.print(tune_table(r))
    rows = [line for line in console.export_text().splitlines() if "inline_cta_la1" in line]
    assert sum("yes, excluded" in line for line in rows) == 1 and not any("NO" in line for line in rows)
    # chosen again from the excluded report's own JSON: still excluded, still bit-identical, and a
    # further --exclude adds to the saved one
    saved = r.to_json()
    assert (
        saved["exclusions"] == {"inline_cta_la1": ["bf16/256/16/auto/v1"]}
        and saved["validation_failures"] == data["validation_failures"]
    )
    again = rechoose(saved)
    assert again.picked == r.picked and again.exclusions == r.exclusions
    ranked = {s["name"]: s for s in again.to_json()["ranking"]["bf16/256/16/auto/v1"]}
    assert ranked["inline_cta_la1"]["excluded"] and ranked["inline_cta_la1"]["bit_identical"]
    more = rechoose(saved, exclude=["inline_*@bf16/256/16/auto/v2"])
    assert more.exclusions == {"inline_cta_la1": {"bf16/256/16/auto/v1", "bf16/256/16/auto/v2"}}
    assert more.picked["bf16/256/16/auto/v2"] != "inline_cta_la1"


@pytest.mark.parametrize("exclude, message", [(["inline_cta_la1"], "use CANDIDATE@SELECTOR"),
                                              (["nothing@bf16/*"], "matches no candidate"),
                                              (["inline_cta_la1@bf16/256"], "a kernel is named in full")])  # fmt: skip
def test_rechoose_refuses_bad_exclusions(exclude, message) -> None:
    with pytest.raises(UsageError, match=message):
        rechoose(saved_report(), exclude=exclude)
    with pytest.raises(UsageError, match="not a kvpatch tune JSON"):
        rechoose({"picked": {}})
    broken = saved_report()
    broken["bench"]["results"] = [{"dispatched": True, "point": {}}]
    with pytest.raises(UsageError, match="bench results are not"):
        rechoose(broken)


def test_merge_takes_each_kernel_from_the_last_run_that_measured_it() -> None:
    old = saved_run({"inline_cta_la1": {"bf16/128/16/auto/v1": [1.3, 1.2], "fp16/128/16/auto/v2": [1.5, 1.4]},
                "call_cta_la1": {"bf16/128/16/auto/v1": [1.1, 1.1], "fp16/128/16/auto/v2": [1.2, 1.2]}},
               failures={"call_cta_la1": ["fp16/128/16/auto/v2"]})  # fmt: skip
    # the new run measured fp16 again: there inline is slower at one point now, and call is clean
    new = saved_run({"inline_cta_la1": {"fp16/128/16/auto/v2": [1.5, 0.9]},
                "call_cta_la1": {"fp16/128/16/auto/v2": [1.2, 1.1]}}, seconds=2.0)  # fmt: skip
    merged = merge_tune_data([old, new])
    r = rechoose(merged)
    assert r.picked == {"bf16/128/16/auto/v1": "inline_cta_la1", "fp16/128/16/auto/v2": "call_cta_la1"}
    # the old run's validation failure was about the old run's fp16 measurements: dropped with them
    assert merged["validation_failures"] == {}
    assert [m["kernels"] for m in merged["bench"]["merged_from"]] == [["bf16/128/16/auto/v1"], ["fp16/128/16/auto/v2"]]
    # the order decides: the old run last, fp16 comes from it
    assert rechoose(merge_tune_data([new, old])).picked["fp16/128/16/auto/v2"] == "inline_cta_la1"
    # a saved exclusion travels with its kernel's measurements, and is dropped with them
    old["exclusions"] = {"inline_cta_la1": ["bf16/128/16/auto/v1", "fp16/128/16/auto/v2"]}
    merged = merge_tune_data([old, new])
    assert merged["exclusions"] == {"inline_cta_la1": ["bf16/128/16/auto/v1"]}
    assert rechoose(merged).picked["bf16/128/16/auto/v1"] == "call_cta_la1"
    del old["exclusions"]
    clash = saved_run({"inline_cta_la1": {"fp16/64/16/auto/v1": [1.1, 1.1]}})
    clash["bench"]["variant_info"]["inline_cta_la1"]["marker"] = candidates()["call_cta_la2"].marker()
    with pytest.raises(UsageError, match="different configurations"):
        merge_tune_data([old, clash])
    with pytest.raises(UsageError, match="not a kvpatch tune JSON"):
        merge_tune_data([old, {"bench": {}}])


def test_merge_keeps_one_machine_and_joins_the_notes() -> None:
    h200 = {"gpu": "NVIDIA H200", "driver": "580.159.04", "nvcc": "13.0.88", "arch": "sm_90a", "flags": "-O2"}
    fp16 = {
        **saved_run({"inline_cta_la1": {"fp16/128/16/auto/v2": [1.5, 1.4]}}),
        "machine": {**h200, "note": "tuning set (fp16)"},
    }
    bf16 = {
        **saved_run({"inline_cta_la1": {"bf16/128/16/auto/v1": [1.3, 1.2]}}),
        "machine": {**h200, "note": "tuning set (bf16)"},
    }
    merged = merge_tune_data([fp16, bf16])
    assert merged["machine"] == {**h200, "note": "tuning set (fp16) + tuning set (bf16)"}
    h100 = {**bf16, "machine": {**h200, "gpu": "NVIDIA H100 80GB HBM3"}}
    with pytest.raises(UsageError, match="different machines"):
        merge_tune_data([fp16, h100])
    assert merge_tune_data([fp16, {**bf16, "machine": None}])["machine"]["note"] == "tuning set (fp16)"
