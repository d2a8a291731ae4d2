"""``kvpatch tune --from``'s input and outputs: saved measurements that are damaged are refused
in one line (exit 2) and nothing is written; both outputs are checked before either is
written, and written both or neither; names from the file are printed literally."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli.cli_helpers import ROOT, assert_one_line_error, run_cli
from tune_helpers import saved_report

from kvpatch.errors import UsageError


def _damaged(how: str) -> dict:
    data = copy.deepcopy(saved_report())
    results = data["bench"]["results"]
    timing = results[0]["variants"]["inline_cta_la1"]
    if how == "zero speedup":
        timing["speedup"] = 0.0
    elif how == "nan speedup":
        timing["speedup"] = float("nan")
    elif how == "string speedup":
        timing["speedup"] = "1.5"
    elif how == "null speedup":
        timing["speedup"] = None
    elif how == "string rounds":
        timing["speedup_rounds"] = ["1.5", "1.4"]
    elif how == "wildcard dtype":
        for r in results:
            r["point"]["dtype"] = "*"
    elif how == "bad kernel":
        results[0]["kernel"] = "v1/x"
    elif how == "no info for a candidate":
        del data["bench"]["variant_info"]["call_cta_la1"]
    elif how == "failures as a string":
        data["validation_failures"] = {"inline_cta_la1": "bf16/256/16/auto/v1"}
    elif how == "no results":
        data["bench"]["results"] = []
    return data


@pytest.mark.parametrize("how, needle", [
    ("zero speedup", "bench results are not"),
    ("nan speedup", "bench results are not"),
    ("string speedup", "bench results are not"),
    ("null speedup", "bench results are not"),
    ("string rounds", "bench results are not"),
    ("wildcard dtype", "bench results are not"),
    ("bad kernel", "bench results are not"),
    ("no info for a candidate", "has no configuration for it"),
    ("failures as a string", "not a kvpatch tune JSON"),
    ("no results", "nothing to choose from"),
])  # fmt: skip
def test_tune_from_damaged_data_is_refused(how: str, needle: str) -> None:
    from kvpatch.tune import rechoose

    rechoose(saved_report())  # undamaged: chosen again
    with pytest.raises(UsageError, match=needle):
        rechoose(_damaged(how))


def test_tune_from_damaged_data_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text(json.dumps(_damaged("nan speedup")))
    assert_one_line_error(run_cli("tune", "--from", "t.json", "-o", "k.toml", cwd=tmp_path), 2, "bench results are not")
    assert not (tmp_path / "k.toml").exists()


def test_tune_checks_both_outputs_first_and_writes_both_or_neither(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text(json.dumps(saved_report()))
    (tmp_path / "kvpatch.toml").write_text("# my table\n")
    (tmp_path / "d").mkdir()
    tune = ["tune", "--from", "t.json"]
    assert_one_line_error(run_cli(*tune, "--json", "d", cwd=tmp_path), 2, "--json 'd': is a directory")
    assert_one_line_error(run_cli(*tune, "-o", "d", cwd=tmp_path), 2, "--output 'd': is a directory")
    assert_one_line_error(run_cli(*tune, "-o", "-", cwd=tmp_path), 2, "stdout")
    assert (tmp_path / "kvpatch.toml").read_text() == "# my table\n"
    ok = run_cli(*tune, "--json", "again.json", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "[kvpatch]" in (tmp_path / "kvpatch.toml").read_text()
    assert json.loads((tmp_path / "again.json").read_text())["picked"] == saved_report()["picked"]


def test_two_outputs_naming_one_file_are_refused(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text(json.dumps(saved_report()))
    proc = run_cli("tune", "--from", "t.json", "-o", "same", "--json", "./same", cwd=tmp_path)
    assert_one_line_error(proc, 2, "name the same file")
    assert not (tmp_path / "same").exists()


def test_candidate_names_are_shown_literally(tmp_path: Path) -> None:
    """A candidate named like rich markup is printed as written, not read as markup (it
    crashed the table after writing the file)."""
    text = json.dumps(saved_report()).replace("call_cta_la1", "[bold]x[/bold]")
    (tmp_path / "t.json").write_text(text)
    proc = run_cli("tune", "--from", "t.json", "-o", "k.toml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[bold]x[/bold]" in proc.stdout


@pytest.mark.slow  # a shell and a new interpreter
def test_an_output_to_dev_stdout_appends_to_the_redirected_log(tmp_path: Path) -> None:
    """`-o /dev/stdout >> run.log` resolved to run.log, a regular file, and replaced it:
    the log's earlier lines were gone."""
    (tmp_path / "t.json").write_text(json.dumps(saved_report()))
    (tmp_path / "run.log").write_text("OLD LOG\n")
    proc = subprocess.run(f"{sys.executable} -m kvpatch tune --from t.json -o /dev/stdout >> run.log 2>&1",
                          shell=True, cwd=tmp_path, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert proc.returncode == 0
    log = (tmp_path / "run.log").read_text()
    assert log.startswith("OLD LOG\n[kvpatch]") and "wrote /dev/stdout" in log
