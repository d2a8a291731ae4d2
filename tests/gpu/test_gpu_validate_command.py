"""``kvpatch validate`` (kvpatch.commands.validate): options -> the case matrix, the outcome's
verdict and line, and the CLI on prebuilt libraries with CPU stand-ins (exit 0, 6, 2)."""

from __future__ import annotations

import json

import pytest
from gpu_helpers import FakeKernels, needs_torch, run_cli

from kvpatch.commands import validate as Vc
from kvpatch.errors import UsageError
from kvpatch.gpu import launch as Ln
from kvpatch.gpu import upstream as U
from kvpatch.gpu import validate as V


def test_validate_cases_from_options():
    cases, name, _ = Vc.validate_cases(Vc.ValidateOptions())
    assert name == "default" and len(cases) == 1440
    cases, name, sampling = Vc.validate_cases(
        Vc.ValidateOptions(full=True, dtypes=["bf16"], alibi=[True], block_sizes=[32])
    )
    assert name == "full" and "filtered" in sampling
    assert (
        {c.dtype for c in cases} == {"bf16"} and {c.block_size for c in cases} == {32} and all(c.alibi for c in cases)
    )
    assert {c.head_size for c in cases} == set(V.VLLM_HEAD_SIZES)
    cases, name, _ = Vc.validate_cases(Vc.ValidateOptions(dtypes=["fp16"], head_sizes=[80], contexts=[5]))
    assert name == "custom" and {c.head_size for c in cases} == {80} and len(cases) == 2 * 2 * 2 * 2 * 2
    cases, name, _ = Vc.validate_cases(Vc.ValidateOptions(quick=True, heads=[(8, 2)], kernels=["v1"]))
    assert name == "quick" and {c.kernel for c in cases} == {"v1"} and len(cases) == 16
    with pytest.raises(UsageError):
        Vc.validate_cases(Vc.ValidateOptions(quick=True, full=True))
    with pytest.raises(UsageError):
        Vc.validate_cases(Vc.ValidateOptions(quick=True, head_sizes=[32]))  # filters everything out
    with pytest.raises(UsageError):
        Vc.validate_cases(Vc.ValidateOptions(dtypes=["fp64"]))


@pytest.mark.parametrize("opts, message", [
    (dict(matrix=False), "--no-matrix leaves nothing to do"),
    (dict(upstream=True, workers=0), "--workers must be >= 1"),
    (dict(workers=2), "--workers needs --upstream"),
    (dict(upstream_shard="1/2"), "--upstream-shard needs --upstream"),
    (dict(upstream=True, upstream_shard="3/2"), "invalid shard"),
    (dict(upstream_timeout=5.0), "--upstream-timeout needs --upstream"),
    (dict(upstream=True, upstream_timeout=0.0), "must be > 0 seconds"),
])  # fmt: skip
def test_validate_refuses_contradictory_options_before_anything_runs(tmp_path, opts, message):
    with pytest.raises(UsageError, match=message):
        Vc.run(Vc.ValidateOptions(cwd=tmp_path, libs=[f"stock={tmp_path}/none.so:s"], **opts))


def test_validate_says_a_cut_run_is_not_a_pass_and_a_failure_is_a_failure():
    def outcome(cut: bool, failed: int) -> Vc.ValidateOutcome:
        runs = [
            U.UpstreamRun("stock", "s", 0, passed=5),
            U.UpstreamRun("patched", "p", 2, passed=3, failed=failed, cut=cut),
        ]
        rep = U.UpstreamReport("0.6.4", "t::test_paged_attention", "stock", runs,
                               identical={"patched": {"compared": 3, "identical": 3}}, differing={"patched": []})  # fmt: skip
        return Vc.ValidateOutcome(upstream=rep)

    cut = outcome(cut=True, failed=0)
    assert not cut.ok and "stopped at the time limit before it finished (patched): not a pass" in cut.why()
    assert "failed" in outcome(cut=True, failed=1).why()  # a failure is named as one, cut or not
    assert outcome(cut=False, failed=0).ok


def _libs(tmp_path, *names: str) -> list[str]:
    """``--lib`` values for files that exist (what the libraries hold is the stand-ins' business)."""
    out = []
    for n in names:
        (tmp_path / f"{n}.so").write_bytes(b"")
        out.append(f"{n}={tmp_path / f'{n}.so'}:{n}")
    return out


@needs_torch
def test_validate_with_prebuilt_libs_exit_codes(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(Ln, "load_libs", lambda specs: {s.name: FakeKernels("offbyone" if s.name == "bad" else None)
                                                        for s in specs})  # fmt: skip
    monkeypatch.chdir(tmp_path)
    info = tmp_path / "variants.json"
    info.write_text(json.dumps({"good": "lookahead=1 size=auto", "stock": "stock"}))
    common = ["--dtypes", "fp32", "--kv", "auto", "--head-sizes", "32", "--block-sizes", "16", "--kernels", "v1",
              "--heads", "4/2", "--alibi", "off", "--contexts", "17", "--device", "cpu"]  # fmt: skip
    stock, good, bad = _libs(tmp_path, "stock", "good", "bad")
    out = tmp_path / "v.json"
    rc = run_cli("validate", "--lib", stock, "--lib", good, "--variant-info", str(info), "--json", str(out), *common)
    d = json.loads(out.read_text())
    assert (
        rc == 0 and d["ok"] and d["matrix"] == "custom" and d["identical"] == {"good": {"checked": 1, "identical": 1}}
    )
    assert d["env"]["libs"]["good"]["marker"] == "lookahead=1 size=auto"
    assert d["env"]["libs"]["good"]["so"] == str(tmp_path / "good.so")
    capsys.readouterr()
    rc = run_cli("validate", "--lib", f"{stock},{bad}", *common)
    assert rc == 6  # the documented 'GPU check failed'
    captured = capsys.readouterr()
    assert "bad: v1 q=fp32 kv=auto head=32 block=16 heads=4/2 alibi=off ctx=17" in captured.err
    assert "bad: 0/1 bit-identical" in captured.out
    assert run_cli("validate", "--lib", str(tmp_path / "stock.so"), *common) == 2  # no prefix
    assert run_cli("validate", "--lib", f"s={tmp_path}/missing.so:s", *common) == 2  # no library there
    assert run_cli("validate", "--lib", stock, "--quick", "--full", "--device", "cpu") == 2
    assert (
        run_cli("validate", "--lib", stock, "--json", str(tmp_path / "stock.so"), *common) == 2
    )  # never over an input
