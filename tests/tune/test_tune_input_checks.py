"""``kvpatch tune --from``'s input and outputs: saved measurements that are damaged (in any of
several files, or a gzip stream cut short or followed by more) are refused in one line (exit 2)
and nothing is written; both outputs are checked before either is
written, and written both or neither; names from the file are printed literally."""

from __future__ import annotations

import copy
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli.cli_helpers import ROOT, assert_one_line_error, run_cli
from tune_helpers import saved_report, saved_run

from kvpatch.commands.tune import read_tune_json
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
    elif how == "unknown cache dtype":  # was read as fp8: the pick written for a kernel never measured
        for r in results:
            r["point"]["kv_cache_dtype"] = "fp9"
    elif how == "head size as text":
        for r in results:
            r["point"]["head_size"] = "256"
    elif how == "dispatched as text":  # "false" was dispatched
        results[1]["dispatched"] = "false"
    elif how == "no info for a candidate":
        del data["bench"]["variant_info"]["call_cta_la1"]
    elif how == "failures as a string":
        data["validation_failures"] = {"inline_cta_la1": "bf16/256/16/auto/v1"}
    elif how == "no results":
        data["bench"]["results"] = []
    elif how == "verdict misspelt":  # a slower point read as not slower: the pick changed
        timing["verdict"] = "Slower"
    elif how == "no verdict":
        del timing["verdict"]
    elif how == "grouped as text":  # 'no' was read as a grouped launch: the picks changed
        timing["grouped"] = "no"
    elif how == "failure of no kernel":  # silently ignored
        data["validation_failures"] = {"inline_cta_la1": ["zzz"]}
    elif how == "failure of no candidate":
        data["validation_failures"] = {"nobody": ["bf16/256/16/auto/v1"]}
    elif how == "exclusion of a wildcard":
        data["exclusions"] = {"inline_cta_la1": ["bf16/*"]}
    elif how == "baseline renamed":  # was read as the candidate 'stock' without a marker
        data["bench"]["baseline"] = "base"
    elif how == "candidate without a marker":
        data["bench"]["variant_info"]["inline_cta_la1"]["marker"] = ""
    return data


@pytest.mark.parametrize("how, needle", [
    ("zero speedup", "bench results are not"),
    ("nan speedup", "bench results are not"),
    ("string speedup", "bench results are not"),
    ("null speedup", "bench results are not"),
    ("string rounds", "bench results are not"),
    ("wildcard dtype", "bench results are not"),
    ("bad kernel", "bench results are not"),
    ("unknown cache dtype", "bench results are not"),
    ("head size as text", "bench results are not"),
    ("dispatched as text", "bench results are not"),
    ("no info for a candidate", "has no configuration for it"),
    ("failures as a string", "not a kvpatch tune JSON"),
    ("no results", "nothing to choose from"),
    ("verdict misspelt", "bench results are not"),
    ("no verdict", "bench results are not"),
    ("grouped as text", "bench results are not"),
    ("failure of no kernel", "validation_failures list 'zzz' for 'inline_cta_la1': no one kernel"),
    ("failure of no candidate", "validation_failures name 'nobody', which is no candidate"),
    ("exclusion of a wildcard", r"exclusions list 'bf16/\*'"),
    ("baseline renamed", "the baseline 'base' is none of the libraries"),
    ("candidate without a marker", "no configuration for 'inline_cta_la1'"),
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


def test_control_characters_in_candidate_names_are_shown_as_escapes(tmp_path: Path) -> None:
    """Before: a newline in a saved candidate's name split its table cell and an ESC reached the
    terminal raw. After: each is shown as its escape, as in every other line kvpatch prints."""
    text = json.dumps(saved_report()).replace("call_cta_la1", "in\\nline\\u001b[31m")
    (tmp_path / "t.json").write_text(text)
    proc = run_cli("tune", "--from", "t.json", "-o", "k.toml", cwd=tmp_path, env={"COLUMNS": "300"})
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "in\\nline\\x1b[31m" in proc.stdout


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


#: A real saved tune JSON (tune-28's): tests copy it, never change it.
REAL_TUNE_JSON = ROOT / "benchmarks" / "evidence" / "bounded-table" / "tune.json.gz"


def _real_with_machine(tmp_path: Path, name: str, machine: object) -> None:
    data = json.loads(gzip.decompress(REAL_TUNE_JSON.read_bytes()))
    data["machine"] = machine if not isinstance(machine, dict) else {**data["machine"], **machine}
    (tmp_path / name).write_text(json.dumps(data))


@pytest.mark.parametrize("machine, needle", [
    ({"gpu": ["NVIDIA H200"]}, "invalid machine in bad.json gpu ['NVIDIA H200']: expected a string"),
    ({"gpu": {"name": "NVIDIA H200"}}, "invalid machine in bad.json gpu {'name': 'NVIDIA H200'}: expected a string"),
    ("NVIDIA H200", "invalid machine in bad.json: expected a table"),
])  # fmt: skip
def test_a_hostile_machine_in_any_of_several_tune_jsons_is_one_line(tmp_path: Path, machine: object,
                                                                     needle: str) -> None:  # fmt: skip
    """Before: with several --from files the machines were compared before their values were
    checked: a list or a table as the GPU was a traceback (unhashable type), exit 1, where one
    --from bad.json alone was exit 2. After: every file is checked as one alone is, first or last."""
    shutil.copy(REAL_TUNE_JSON, tmp_path / "tune.json.gz")
    _real_with_machine(tmp_path, "bad.json", machine)
    for order in (["tune.json.gz", "bad.json"], ["bad.json", "tune.json.gz"], ["bad.json"]):
        args = [a for name in order for a in ("--from", name)]
        assert_one_line_error(run_cli("tune", *args, "-o", "k.toml", cwd=tmp_path), 2, needle)
    assert not (tmp_path / "k.toml").exists()


def test_a_damaged_tune_json_is_refused_among_several_even_where_a_later_one_remeasured_it(tmp_path: Path) -> None:
    """Before: merging kept each kernel's rows from the last file that measured it and checked
    only those: a file whose damaged rows a later file re-measured was used without a word. After:
    each file is checked as one --from alone checks it, and the error names the file."""
    old = saved_run({"inline_cta_la1": {"fp16/128/16/auto/v2": [1.5, 1.4]}})
    old["bench"]["results"][0]["variants"]["inline_cta_la1"]["speedup"] = "fast"
    new = saved_run({"inline_cta_la1": {"fp16/128/16/auto/v2": [1.3, 1.2]}})
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    proc = run_cli("tune", "--from", "old.json", "--from", "new.json", "-o", "k.toml", cwd=tmp_path)
    assert_one_line_error(proc, 2, "--from old.json: the tune JSON's bench results are not")
    assert not (tmp_path / "k.toml").exists()
    ok = run_cli("tune", "--from", "new.json", "--from", "new.json", "-o", "k.toml", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("how, needle", [
    ("without its last 8 bytes (CRC and size)", "gzip stream is cut short"),
    ("cut in half", "gzip stream is cut short"),
    ("with garbage after it", "7 bytes follow the gzip stream"),
    ("with a second gzip member", "bytes follow the gzip stream"),
])  # fmt: skip
def test_a_gzip_that_does_not_end_or_has_bytes_after_it_is_refused(tmp_path: Path, how: str, needle: str) -> None:
    """Before: `gzip -t` said 'unexpected end of file', tune --from chose from it, exit 0 (and
    ignored anything after the stream). After: one line, exit 2, nothing written."""
    raw = REAL_TUNE_JSON.read_bytes()
    damaged = {"without its last 8 bytes (CRC and size)": raw[:-8], "cut in half": raw[: len(raw) // 2],
               "with garbage after it": raw + b"garbage", "with a second gzip member": raw + gzip.compress(b"{}")}[how]  # fmt: skip
    (tmp_path / "t.json.gz").write_bytes(damaged)
    proc = run_cli("tune", "--from", "t.json.gz", "-o", "k.toml", cwd=tmp_path)
    assert_one_line_error(proc, 2, "cannot read tune JSON t.json.gz", needle)
    assert not (tmp_path / "k.toml").exists()
    (tmp_path / "t.json.gz").write_bytes(raw)  # the whole file: read
    assert read_tune_json(tmp_path / "t.json.gz")["machine"]["gpu"] == "NVIDIA H200"
