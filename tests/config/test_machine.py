"""The machine a configuration was tuned on: the record, how a machine differs from it, how
this machine is read, and apply's warning."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvpatch.config import (
    DEFAULT_TUNED_ON,
    Machine,
    config_and_tuned,
    differences,
    dump_config,
    make_config,
    read_config_file,
)
from kvpatch.config.machine import nvcc_version
from kvpatch.errors import UsageError

H200 = Machine(gpu="NVIDIA H200", driver="580.159.04", nvcc="13.0.88", arch="sm_90a", flags="-O2 -g")
A100 = "NVIDIA A100-SXM4-80GB, 535.54.03"


def test_differences_name_each_known_fact_that_differs() -> None:
    here = Machine(gpu="NVIDIA A100-SXM4-80GB", driver="580.159.04", nvcc="12.8.93", flags="-O2  -g")
    assert differences(H200, here) == ["gpu: tuned with NVIDIA H200, here NVIDIA A100-SXM4-80GB",
                                       "nvcc: tuned with 13.0.88, here 12.8.93"]  # fmt: skip
    # unknown on either side (no GPU here, no arch recorded): not a difference
    assert differences(H200, Machine(nvcc="13.0.88", flags="-O2 -g")) == []
    assert differences(Machine(), here) == []


def test_nvcc_version_from_its_banner() -> None:
    assert nvcc_version("Cuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0") == "13.0.88"
    assert nvcc_version("release 12.4") == "12.4" and nvcc_version("garbage") is None


def test_describe_names_the_known_facts() -> None:
    assert H200.describe() == "NVIDIA H200, driver 580.159.04, nvcc 13.0.88, sm_90a"
    assert Machine().describe() == "unknown GPU"


def test_the_record_round_trips_through_kvpatch_toml(tmp_path: Path) -> None:
    path = tmp_path / "kvpatch.toml"
    odd = Machine(gpu='GPU "x"\\y', note="tab\there")
    for m in (H200, odd):
        path.write_text(dump_config(make_config(), m))
        cfg, tuned = config_and_tuned(path)
        assert tuned == m and cfg == make_config()
    path.write_text(dump_config(make_config()))
    assert read_config_file(path)[1] is None and config_and_tuned(path)[1] is None
    # without a file: the shipped default's machine; the paper preset and --untuned have none
    assert config_and_tuned(None)[1] == DEFAULT_TUNED_ON and config_and_tuned(None, preset="paper")[1] is None
    assert config_and_tuned(None, inherit_rules=False)[1] is None
    # a file that keeps the shipped table's rules (empty, or base settings only) is as no file; one
    # with rules of its own, a dtype's table or 'rules = "none"', and no record, is unknown
    for text, machine in (("", DEFAULT_TUNED_ON), ("lookahead = 2\n", DEFAULT_TUNED_ON),
                          ('[kvpatch.rules]\n"fp16/128" = { lookahead = 3 }\n', None),
                          ("[kvpatch.fp16]\nlookahead = 3\n", None), ('rules = "none"\n', None)):  # fmt: skip
        path.write_text(text)
        assert config_and_tuned(path)[1] == machine, text


@pytest.mark.parametrize("table, message", [("gpu = 3", "expected a string"), ("cpu = 'x'", "unknown key")])
def test_a_bad_record_is_a_usage_error(tmp_path: Path, table: str, message: str) -> None:
    path = tmp_path / "kvpatch.toml"
    path.write_text(f"[kvpatch]\nlookahead = 1\n\n[kvpatch.tuned]\n{table}\n")
    with pytest.raises(UsageError, match=message):
        read_config_file(path)


def _fake_smi(bindir: Path, line: str) -> None:
    bindir.mkdir(parents=True, exist_ok=True)
    smi = bindir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{line}'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)


def test_local_machine_reads_nvidia_smi_and_kvpatchs_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpatch.commands.common import local_machine
    from kvpatch.jit.flags import vllm_nvcc_flags

    _fake_smi(tmp_path, A100)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    m = local_machine(arch="sm_90a")
    assert (m.gpu, m.driver, m.arch) == ("NVIDIA A100-SXM4-80GB", "535.54.03", "sm_90a")
    assert m.flags == " ".join(vllm_nvcc_flags())


def test_apply_reports_how_this_machine_differs_from_where_the_rules_were_tuned(tmp_path: Path) -> None:
    """The default was tuned on an H200: on an A100, apply patches and names the differences."""
    from conftest import fixture_text, make_tree

    from kvpatch.commands.apply import ApplyOptions, run

    tree = make_tree(tmp_path / "vllm", fixture_text(), commit=False)
    work = tmp_path / "work"
    work.mkdir()
    here = Machine(gpu="NVIDIA A100-SXM4-80GB", driver="535.54.03", nvcc=DEFAULT_TUNED_ON.nvcc)
    report = run(ApplyOptions(tree=tree, cwd=work, force=True, here=here))
    assert report.changed and report.tuned_on == DEFAULT_TUNED_ON
    assert report.machine_differences == ("gpu: tuned with NVIDIA H200, here NVIDIA A100-SXM4-80GB",
                                          "driver: tuned with 580.159.04, here 535.54.03")  # fmt: skip
    assert report.to_json()["machine_differences"] == list(report.machine_differences)


@pytest.mark.slow
def test_apply_warns_on_the_command_line_when_the_machine_differs(tmp_path: Path) -> None:
    """``kvpatch apply`` with an A100 visible: it patches, warns on stderr and says where the
    rules were tuned."""
    from conftest import fixture_text, make_tree

    tree = make_tree(tmp_path / "vllm", fixture_text(), commit=False)
    work = tmp_path / "work"
    work.mkdir()
    _fake_smi(tmp_path / "bin", A100)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "400",
           "NO_COLOR": "1", "TERM": "dumb", "KVPATCH_CACHE": str(work / "no-cache")}  # fmt: skip

    def kvpatch(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kvpatch", *args], cwd=work, env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip

    proc = kvpatch("apply", "--tree", str(tree), "--force")
    assert proc.returncode == 0, proc.stderr
    assert "warning: tuned on another machine: gpu: tuned with NVIDIA H200, here NVIDIA A100-SXM4-80GB" in proc.stderr
    assert "tuned on: NVIDIA H200, driver 580.159.04" in proc.stdout
    # a file of base settings keeps the shipped table's rules, as --lookahead 2 does: the same record
    (work / "k.toml").write_text("[kvpatch]\nlookahead = 2\n")
    proc = kvpatch("apply", "--tree", str(tree), "--force", "--config", "k.toml")
    assert proc.returncode == 0 and "warning: tuned on another machine" in proc.stderr and "tuned on" in proc.stdout
    # rules of its own, no record: where they were tuned is unknown, and nothing is said
    (work / "k.toml").write_text('[kvpatch.rules]\n"fp16/128" = { lookahead = 3 }\n')
    proc = kvpatch("apply", "--tree", str(tree), "--force", "--config", "k.toml")
    assert proc.returncode == 0 and "warning: tuned" not in proc.stderr and "tuned on" not in proc.stdout


def test_a_record_beyond_ascii_reads_back_through_any_stream(tmp_path: Path) -> None:
    """``kvpatch config > kvpatch.toml`` under an ASCII stdout (``LANG=C``): the note's 'é' and '😀'
    are written as TOML escapes, not as '\\xe9' (which TOML does not read), and read back the same."""
    from cli.cli_helpers import kvpatch

    note = 'H200 \u00e9 \U0001f600 "quoted"\n'
    (tmp_path / "in.toml").write_text(dump_config(make_config(), replace(H200, note=note)), encoding="utf-8")
    proc = kvpatch("config", "--config", str(tmp_path / "in.toml"), cwd=tmp_path, env={"PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.isascii() and "\\u00e9" in proc.stdout and "\\U0001f600" in proc.stdout
    (tmp_path / "out.toml").write_text(proc.stdout, encoding="ascii")
    assert read_config_file(tmp_path / "out.toml")[1].note == note
