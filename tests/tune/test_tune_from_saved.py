"""``kvpatch tune --from``: choosing again from saved tune JSONs writes kvpatch.toml with the
machine and what was excluded, needs no GPU, and refuses the options it would ignore."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from tune_helpers import saved_report, saved_run

from kvpatch.commands.tune import TuneOptions, run
from kvpatch.config import Machine, config_and_tuned
from kvpatch.errors import UsageError

H200 = {"gpu": "NVIDIA H200", "nvcc": "13.0.88", "note": "tuned"}


def test_tune_from_a_saved_json_writes_the_choice_with_its_machine(tmp_path: Path) -> None:
    data = {**saved_report(), "machine": H200}
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(json.dumps(data).encode()))
    out = tmp_path / "k.toml"
    report = run(TuneOptions(cwd=tmp_path, from_json=[tmp_path / "t.json.gz"], exclude=["inline_*@bf16/256/16/auto/v1"],
                             output=out))  # fmt: skip
    text = out.read_text()
    assert '"bf16/256/16/auto/v1" = { off = true }' in text and 'gpu = "NVIDIA H200"' in text
    assert "excluding inline_*@bf16/256/16/auto/v1" in text
    # what apply --config reads back: the configuration chosen, and where it was tuned
    cfg, tuned = config_and_tuned(out)
    assert cfg == report.config and tuned == report.machine and tuned.gpu == "NVIDIA H200"
    assert (
        cfg.resolve("bf16", 256, 16, "auto", "v1").off and cfg.resolve("bf16", 256, 16, "auto", "v2").issue == "inline"
    )
    assert not any(not c.off for k, _, c in cfg.kernel_variants() if k[:3] != ("bf16", 256, 16))


def test_tune_from_writes_the_json_too(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text(json.dumps(saved_report()))
    run(
        TuneOptions(
            cwd=tmp_path, from_json=[tmp_path / "t.json"], output=tmp_path / "k.toml", json_out=tmp_path / "again.json"
        )
    )
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["picked"] == saved_report()["picked"] and config_and_tuned(tmp_path / "k.toml")[1] is None


def test_tune_from_several_merges_them(tmp_path: Path) -> None:
    a = saved_run({"inline_cta_la1": {"bf16/128/16/auto/v1": [1.3, 1.2], "fp16/128/16/auto/v2": [1.5, 1.4]}})
    b = saved_run({"call_cta_la1": {"fp16/128/16/auto/v2": [1.2, 1.1]}})
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    run(TuneOptions(cwd=tmp_path, from_json=[tmp_path / "a.json", tmp_path / "b.json"], output=tmp_path / "k.toml"))
    text = (tmp_path / "k.toml").read_text()
    assert '"bf16/128/16/auto" = { lookahead = 1, scope = "cta", issue = "inline" }' in text
    assert '"fp16/128/16/auto" = { lookahead = 1, scope = "cta", issue = "call" }' in text  # b measured it last


@pytest.mark.parametrize(
    "options, message",
    [
        ({"from_json": ["a.json"], "grid": ["min-group=2"]}, "--from measures nothing"),
        ({"from_json": ["a.json"], "dtypes": ["fp16"]}, "--from measures nothing"),
        ({"from_json": ["a.json"], "only": ["fp16/128/16"]}, "--from measures nothing"),
        ({"from_json": ["a.json"], "quick": True}, "--quick: --from measures nothing"),
        ({"from_json": ["a.json"], "reps": 20}, "--reps: --from measures nothing"),
        ({"from_json": ["a.json"], "rounds": 3}, "--rounds: --from measures nothing"),
        ({"from_json": ["a.json"], "jobs": 4}, "--jobs: --from measures nothing"),
        ({"from_json": ["a.json"], "arch": "9.0a"}, "--arch: --from measures nothing"),
        ({"from_json": ["a.json"], "libs": ["stock=a.json:p"]}, "--lib: --from measures nothing"),
        ({"from_json": ["a.json"], "variant_info": Path("a.json")}, "--variant-info: --from measures nothing"),
        ({"from_json": ["a.json"], "tree": Path(".")}, "--tree: --from measures nothing"),
        ({"exclude": ["a@b"]}, "--exclude works with --from"),
        ({"dtypes": ["fp32"]}, "invalid --dtype 'fp32'"),
        ({"only": ["fp16/80"]}, "pick no tuned instantiation"),
        ({"only": ["fp16/128/16/auto/v2"]}, "invalid --only 'fp16/128/16/auto/v2'"),
        ({"only": ["fp17"]}, "invalid selector 'fp17'"),
        ({"grid": ["min-ctas=1,x"]}, "invalid min-ctas 'x'"),
        ({"libs": ["stock=s.so:p"], "grid": ["min-group=2"]}, "with --lib the candidates"),
        ({"policy": "fastest"}, "invalid --policy"),
        ({"from_json": ["a.json"], "exclude": ["inline_cta_la1"]}, "use CANDIDATE@SELECTOR"),
    ],
)
def test_tune_refuses_what_it_would_ignore(tmp_path: Path, options: dict, message: str) -> None:
    (tmp_path / "a.json").write_text(json.dumps(saved_report()))
    if "from_json" in options:
        options = {**options, "from_json": [tmp_path / p for p in options["from_json"]]}
    with pytest.raises(UsageError, match=message.replace("*", r"\*")) as e:
        run(TuneOptions(cwd=tmp_path, output=tmp_path / "k.toml", **options))
    assert "\n" not in str(e.value) and not (tmp_path / "k.toml").exists()


def test_tune_from_refuses_the_measuring_options_given_on_the_command_line(tmp_path: Path) -> None:
    """Before: --from used none of --arch, --variant-info, --tree, --lib, --quick, --reps, --rounds
    or --jobs and said nothing (exit 0, even for --arch 5.0 and files that do not exist). After:
    each given is named in one line, exit 2, as --grid, --dtype and --only were; their defaults
    are not 'given' (a plain --from still works), an explicit default value is."""
    (tmp_path / "t.json").write_text(json.dumps(saved_report()))
    (tmp_path / "fake.so").write_bytes(b"")
    tune = ["tune", "--from", "t.json", "-o", "k.toml"]
    proc = run_cli(*tune, "--arch", "5.0", "--variant-info", "/nonexistent", "--tree", "/nonexistent", "--lib",
                   "stock=fake.so:p", cwd=tmp_path)  # fmt: skip
    assert_one_line_error(proc, 2, "--tree, --arch, --lib, --variant-info: --from measures nothing")
    proc = run_cli(*tune, "--quick", "--reps", "20", "--rounds", "3", "--jobs", "2", "--arch", "9.0a", cwd=tmp_path)
    assert_one_line_error(proc, 2, "--arch, --quick, --reps, --rounds, --jobs: --from measures nothing")
    assert not (tmp_path / "k.toml").exists()
    # what --from uses: the outputs, --exclude, --policy, --fallback
    ok = run_cli(*tune, "--exclude", "inline_*@bf16/256/16/auto/v1", "--policy", "geomean", "--fallback", "base",
                 "--json", "again.json", cwd=tmp_path)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "k.toml").exists() and (tmp_path / "again.json").exists()


@pytest.mark.slow
def test_the_tune_command_needs_no_gpu_with_from_and_errors_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(json.dumps({**saved_report(), "machine": H200}).encode()))
    kv = [sys.executable, "-m", "kvpatch", "tune"]
    proc = subprocess.run([*kv, "--from", "t.json.gz", "-o", "k.toml"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "wrote k.toml: 2 kernels prefetch" in proc.stdout and "tuned on: NVIDIA H200, nvcc 13.0.88" in proc.stdout
    assert config_and_tuned(tmp_path / "k.toml")[1] == Machine.from_dict({**H200, "note": "tuned; chosen again from "
                                                                         "t.json.gz, policy strict"})  # fmt: skip
    for args, message in [(["--exclude", "a@b"], "--exclude works with --from"),
                          (["--from", "t.json.gz", "--only", "fp16/128/16"], "--from measures nothing")]:  # fmt: skip
        bad = subprocess.run([*kv, *args], cwd=tmp_path, capture_output=True, text=True)
        assert bad.returncode == 2 and message in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, (
            args,
            bad.stderr,
        )
