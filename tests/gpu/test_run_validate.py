"""kvpatch.gpu.validate's pipeline on the CPU, driven by stand-in "kernels" that compute the
reference: every failure kind is caught and named, unbuilt configurations are skipped, and
stock is held to the float64 reference."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytest.importorskip("torch")

from gpu_helpers import FakeKernels, GroupedKernels, tiny_matrix  # noqa: E402

from kvpatch.gpu import validate as V  # noqa: E402
from kvpatch.render.measure import validate_summary  # noqa: E402


@pytest.mark.slow
def test_run_validate_all_pass_on_cpu():
    libs = {"patched": FakeKernels(), "stock": FakeKernels()}
    rep = V.run_validate(libs, tiny_matrix(), seed=5, device="cpu")
    assert rep.variants == ["stock", "patched"] and rep.baseline == "stock"
    assert rep.ok and rep.failures == [] and rep.n_passed == 16
    assert all(r.ref_error is not None and r.ref_error < r.tolerance for r in rep.results)
    assert rep.max_ref_error()["fp32/auto"] < 1e-6 and rep.max_ref_error()["fp32/fp8"] < 1e-6
    d = json.loads(rep.to_json())
    assert d["ok"] and d["counts"] == {"cases": 16, "passed": 16, "failed": 0, "skipped": 0}
    assert d["identical"] == {"patched": {"checked": 16, "identical": 16}}
    assert d["results"][0]["name"].startswith("v1 q=fp16 kv=auto")
    assert libs["stock"].calls == 32  # twice per case
    assert "16 passed, 0 failed, 0 skipped; patched: 16/16 bit-identical;" in validate_summary(rep)
    assert d["grouped"] == {}  # neither library has a grouped form


def test_validate_says_which_configurations_the_grouped_form_served():
    libs = {"stock": FakeKernels(), "g4": GroupedKernels(), "plain": FakeKernels()}
    cases = [replace(c, num_heads=qh, num_kv_heads=kvh, alibi=al)
             for c in tiny_matrix()[:2] for qh, kvh in ((8, 2), (4, 4)) for al in (False, True)]  # fmt: skip
    rep = V.run_validate(libs, cases, seed=3, device="cpu")
    assert rep.ok
    served = [(r.case.num_heads, r.case.alibi) for r in rep.results if r.variants["g4"].grouped]
    expect = [(c.num_heads, c.alibi) for c in cases if c.num_heads == 8 and not c.alibi]
    assert served == expect and expect  # GQA 4 without ALiBi only
    assert rep.grouped_counts() == {"g4": {"checked": 8, "grouped": len(expect)}}
    assert all(r.variants["plain"].grouped is None for r in rep.results)
    assert f"g4: 8/8 bit-identical ({len(expect)} by the grouped form)" in validate_summary(rep)
    assert json.loads(rep.to_json())["grouped"] == {"g4": {"checked": 8, "grouped": len(expect)}}


@pytest.mark.parametrize("fault,why", [
    ("unwritten", "not written"),
    ("offbyone", "differs from stock: 1 elements"),
    ("crash", "raised RuntimeError"),
])  # fmt: skip
def test_run_validate_names_failures(fault, why):
    libs = {"stock": FakeKernels(), "good": FakeKernels(), "bad": FakeKernels(fault)}
    rep = V.run_validate(libs, tiny_matrix()[:3], seed=1, device="cpu")
    assert not rep.ok and rep.n_failed == 3
    assert len(rep.failures) == 3
    for line in rep.failures:
        assert line.startswith(("bad: v1 q=fp16 kv=", "bad: v2 q=fp16 kv=")) and why in line and "seed" in line
    assert all(r.variants["good"].status == "pass" for r in rep.results)
    assert rep.mismatch_groups() == {"bad: fp16 kv=auto alibi=on head=32 block=16": 3}


def test_run_validate_v2_scratch_compared():
    libs = {"stock": FakeKernels(), "bad": FakeKernels("scratch")}
    cases = [c for c in tiny_matrix() if c.kernel == "v2"][:1]
    rep = V.run_validate(libs, cases, seed=1, device="cpu")
    assert rep.n_failed == 1 and "exp_sums differ" in rep.failures[0]


def test_run_validate_stock_checked_against_reference():
    libs = {"stock": FakeKernels("unwritten"), "v": FakeKernels("unwritten")}
    rep = V.run_validate(libs, tiny_matrix()[:1], seed=1, device="cpu")
    assert rep.n_failed == 1
    assert any(f.startswith("stock: ") and "not written" in f for f in rep.failures)


@pytest.mark.slow
def test_run_validate_skips_unbuilt_configs():
    fp16 = tuple(c for c in FakeKernels().configs if c.startswith("fp16/"))
    libs = {"stock": FakeKernels(configs=fp16), "v": FakeKernels(configs=fp16)}
    rep = V.run_validate(libs, tiny_matrix(), seed=1, device="cpu")
    assert rep.ok and rep.n_passed == 8 and len(rep.skipped) == 8
    assert all("q=fp32" in s and "fp32/" in s and "not built in stock" in s for s in rep.skipped)
    assert libs["stock"].calls == 16  # skipped cases launch nothing
    none = V.run_validate(libs, [c for c in tiny_matrix() if c.dtype == "fp32"], seed=1, device="cpu")
    assert not none.ok and none.failures == []  # nothing validated is not ok
    assert not replace(rep, strict=True).ok  # --full: a skipped configuration fails
    # a library that cannot list its configurations: a RuntimeError from stock means "not built"
    mute = {"stock": FakeKernels(says_configs=False), "v": FakeKernels(says_configs=False)}
    rep = V.run_validate(mute, tiny_matrix(), seed=1, device="cpu")
    assert rep.ok and len(rep.skipped) == 8 and "raised RuntimeError" in rep.skipped[0]


@pytest.mark.slow
def test_run_validate_variant_missing_config_or_stock_crash_fails():
    full = FakeKernels().configs
    libs = {"stock": FakeKernels(), "v": FakeKernels(configs=tuple(c for c in full if not c.startswith("fp32/")))}
    rep = V.run_validate(libs, tiny_matrix(), seed=1, device="cpu")
    assert rep.n_failed == 8 and all("not built in this library" in f and f.startswith("v: ") for f in rep.failures)
    crash = {"stock": FakeKernels("crash"), "v": FakeKernels()}
    rep = V.run_validate(crash, tiny_matrix()[:2], seed=1, device="cpu")
    assert rep.n_failed == 2 and all(f.startswith("stock: ") and "illegal memory" in f for f in rep.failures)
