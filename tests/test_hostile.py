"""Hostile input to the measuring commands (validate, bench, tune, bench-decode) and the
weight-prefetch API: each is refused in one line with the documented exit code, before
any long work runs, and nothing is half-written. No GPU needed."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvpatch.errors import UsageError

from test_tune import _saved_report

try:
    import torch
except ImportError:  # pragma: no cover - CI installs CPU torch
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")


def kvpatch(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvpatch", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)  # fmt: skip


def one_line(proc: subprocess.CompletedProcess, code: int, needle: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- output paths, checked first


def test_output_problems(tmp_path: Path) -> None:
    from kvpatch.fsutil import check_outputs, output_problem

    afile = tmp_path / "f"
    afile.write_text("x")
    assert output_problem(tmp_path / "new" / "deeper" / "r.json") is None  # parents are created
    assert output_problem(afile) is None and output_problem("/dev/null") is None
    assert "is a directory" in output_problem(tmp_path)
    assert "is not a directory" in output_problem(afile / "r.json")
    assert "is not a directory" in output_problem(afile / "a" / "r.json")
    assert output_problem("") == "an empty path" and "stdout" in output_problem("-")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.geteuid() != 0:  # root writes anyway
            assert "cannot create files" in output_problem(ro / "r.json")
    finally:
        ro.chmod(0o700)
    assert "cannot create files" in output_problem("/proc/kvpatch-test.json")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".kvpatch-probe")]  # the probe is removed
    with pytest.raises(UsageError, match=r"^--plot '.*': is a directory"):
        check_outputs(json=None, plot=tmp_path)


def test_write_both_writes_neither_when_the_second_cannot_be_staged(tmp_path: Path) -> None:
    from kvpatch.fsutil import write_both

    first = tmp_path / "kvpatch.toml"
    first.write_text("# mine\n")
    with pytest.raises(IsADirectoryError):
        write_both(first, "new\n", tmp_path, "{}")
    assert first.read_text() == "# mine\n"
    write_both(first, "new\n", tmp_path / "t.json", "{}")
    assert first.read_text() == "new\n" and (tmp_path / "t.json").read_text() == "{}"
    write_both(first, "newer\n", "/dev/null", "{}")  # a device: written in place, not replaced
    assert first.read_text() == "newer\n" and Path("/dev/null").is_char_device()


@pytest.mark.parametrize("args, needle", [
    (["validate", "--json", "."], "--json '.': is a directory"),
    (["bench", "--plot", "f/x.png"], "is not a directory"),
    (["bench", "--json", "/proc/r.json"], "cannot create files in /proc"),
    (["bench-decode", "--lib", "stock=s.so:s", "--json", "."], "--json '.': is a directory"),
])  # fmt: skip
def test_a_bad_output_path_fails_before_any_work(args: list[str], needle: str, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("a file")
    one_line(kvpatch(*args, cwd=tmp_path), 2, needle)


def test_tune_checks_both_outputs_first_and_writes_both_or_neither(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text(json.dumps(_saved_report()))
    (tmp_path / "kvpatch.toml").write_text("# my table\n")
    (tmp_path / "d").mkdir()
    one_line(kvpatch("tune", "--from", "t.json", "--json", "d", cwd=tmp_path), 2, "--json 'd': is a directory")
    one_line(kvpatch("tune", "--from", "t.json", "-o", "d", cwd=tmp_path), 2, "--output 'd': is a directory")
    one_line(kvpatch("tune", "--from", "t.json", "-o", "-", cwd=tmp_path), 2, "stdout")
    assert (tmp_path / "kvpatch.toml").read_text() == "# my table\n"
    ok = kvpatch("tune", "--from", "t.json", "--json", "again.json", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "[kvpatch]" in (tmp_path / "kvpatch.toml").read_text()
    assert json.loads((tmp_path / "again.json").read_text())["picked"] == _saved_report()["picked"]


# --------------------------------------------------------------------------- options checked before building


@pytest.mark.parametrize("args, needle", [
    (["bench", "--heads", "0/8"], "invalid heads '0/8'"),
    (["bench", "--heads", "-32/8"], "invalid heads '-32/8'"),
    (["validate", "--heads", "0/2"], "invalid heads '0/2'"),
    (["bench", "--rounds", "0"], "reps and rounds must be >= 1"),
    (["bench", "--reps", "0"], "reps and rounds must be >= 1"),
    (["bench", "--warmup", "-1"], "warmup >= 0"),
    (["bench", "--kernels", "v3"], "unknown kernel 'v3'"),
    (["bench", "--no-warm", "--no-cold"], "neither warm nor cold"),
    (["validate", "--workers", "0"], "--workers must be >= 1"),
    (["validate", "--upstream-shard", "1/2"], "--upstream-shard needs --upstream"),
    (["validate", "--upstream-timeout", "60"], "--upstream-timeout needs --upstream"),
    (["validate", "--upstream", "--upstream-timeout", "0"], "--upstream-timeout must be > 0 seconds, not 0"),
    (["validate", "--upstream", "--upstream-timeout", "nan"], "--upstream-timeout must be > 0 seconds, not nan"),
    (["validate", "--upstream", "--upstream-timeout", "inf"], "--upstream-timeout must be > 0 seconds, not inf"),
    (["validate", "--upstream", "--upstream-shard", "3/2"], "invalid shard '3/2'"),
    (["validate", "--upstream", "--upstream-shard", "0/2"], "invalid shard '0/2'"),
    (["validate", "--upstream", "--upstream-shard", "half"], "invalid shard 'half'"),
    (["tune", "--rounds", "0"], "--reps and --rounds must be >= 1"),
    (["tune", "--jobs", "0"], "--jobs must be >= 1"),
    (["bench", "--lib", "[/red]=s.so:s"], "invalid library name '[/red]'"),
    (["bench-decode", "--lib", "stock=a.so:p", "--lib", "stock=b.so:q"], "given twice: stock"),
    (["bench-decode", "--lib", "stock=a.so:p", "--lib", "x+wpf=b.so:q"], "invalid library name 'x+wpf'"),
])  # fmt: skip
def test_bad_measuring_options_are_usage_errors_before_the_gpu_check(args: list[str], needle: str,
                                                                       tmp_path: Path) -> None:  # fmt: skip
    """On this machine without a GPU, the same commands with good options fail with exit 5
    (no GPU): exit 2 shows they were checked first."""
    one_line(kvpatch(*args, cwd=tmp_path), 2, needle)


@needs_torch
@pytest.mark.skipif(torch is not None and torch.cuda.is_available(), reason="checks the machine without a GPU")
@pytest.mark.parametrize("command", ["validate", "bench", "bench-decode"])
def test_prebuilt_libraries_without_a_gpu_is_the_one_line_gpu_error(command: str, tmp_path: Path) -> None:
    """Before: `validate --lib`/`bench --lib` crashed with a traceback, `bench-decode --lib` too."""
    lib = tmp_path / "s.so"
    lib.write_bytes(b"\x7fELF not really")
    proc = kvpatch(command, "--lib", f"stock={lib}:kvpatch_stock", "--lib", f"patched={lib}:kvpatch_patched",
                   cwd=tmp_path)  # fmt: skip
    one_line(proc, 5, "GPU")


# --------------------------------------------------------------------------- tune --from on damaged data


def _damaged(how: str) -> dict:
    data = copy.deepcopy(_saved_report())
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

    with pytest.raises(UsageError, match=needle):
        rechoose(_damaged(how))


def test_tune_from_damaged_data_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text(json.dumps(_damaged("nan speedup")))
    one_line(kvpatch("tune", "--from", "t.json", "-o", "k.toml", cwd=tmp_path), 2, "bench results are not")
    assert not (tmp_path / "k.toml").exists()


def test_candidate_names_are_shown_literally(tmp_path: Path) -> None:
    """A candidate named like rich markup is printed as written, not read as markup (it
    crashed the table after writing the file)."""
    data = _saved_report()
    text = json.dumps(data).replace("call_cta_la1", "[bold]x[/bold]")
    (tmp_path / "t.json").write_text(text)
    proc = kvpatch("tune", "--from", "t.json", "-o", "k.toml", env={"COLUMNS": "250"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[bold]x[/bold]" in proc.stdout


# --------------------------------------------------------------------------- arch lists, the weight-prefetch API


def test_an_sm_given_with_and_without_ptx_is_one_target() -> None:
    from kvpatch.arch import parse_arch_list

    (one,) = parse_arch_list("9.0a;9.0a+PTX")
    assert one.code == "sm_90a" and one.ptx
    assert [a.code for a in parse_arch_list("9.0+PTX 9.0;8.0")] == ["sm_90", "sm_80"]
    assert parse_arch_list("9.0+PTX 9.0")[0].ptx


def test_prefetch_controller_checks_grid_and_batch_where_given() -> None:
    from kvpatch.prefetch.controller import PrefetchController

    from test_prefetch import FakeAPI, FakeLibrary, FakeTensor

    api = FakeAPI()
    ctl = PrefetchController("cuda:0", api=api, library=FakeLibrary(api))
    w = FakeTensor(1 << 20, 1 << 16)
    for bad in (-3, 0, "8", True, 2.0):
        with pytest.raises(UsageError, match="prefetch grid"):
            ctl.add("p", 0, [w], grid=bad)
    ctl.add("p", 0, [w], batches={4: None, 16: None}, grid=5)
    assert ctl.table("p", 0, 3).grid == 5
    for bad in (0, -5, 1.5, "2", True):
        with pytest.raises(ValueError, match="batch must be"):
            ctl.fork("p", 0, bad)


def test_weight_ranges_refuses_a_tensor_for_a_list_and_odd_caps() -> None:
    from kvpatch.prefetch import weight_ranges

    from test_prefetch import FakeTensor

    w = FakeTensor(1 << 20, 4096)
    w.data_ptr()  # a tensor-like: iterating it would walk its rows
    with pytest.raises(ValueError, match="not a tensor"):
        weight_ranges(w)
    with pytest.raises(ValueError, match="expected tensors, got str"):
        weight_ranges([w, "weight"])
    for cap in ("4096", 4096.0, float("nan"), True):
        with pytest.raises(ValueError, match="cap_bytes must be an int"):
            weight_ranges([w], cap)
    assert weight_ranges([w], 1024) == [(1 << 20, 1024)]


@needs_torch
@pytest.mark.skipif(torch is not None and torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_prefetch_controller_without_a_gpu_says_so() -> None:
    from kvpatch.prefetch import PrefetchController

    with pytest.raises(UsageError, match="no CUDA GPU visible.*enabled=False"):
        PrefetchController("cuda")
    assert PrefetchController("cuda", enabled=False).fork("p", 0) is False


@pytest.mark.parametrize("args, needle", [
    (["bench-decode", "--lib", "stock=a.so:p", "--cap", "8;fork=qkv"], "invalid --cap '8;fork=qkv'"),
    (["bench-decode", "--lib", "stock=a.so:p", "--hint", ""], "invalid --hint ''"),
    (["bench", "--variant", "paper=k.toml"], "one of bench's own variants"),
    (["bench", "--variant", "mine=k.toml", "--variant", "mine=k.toml"], "--variant mine given twice"),
    (["apply", "--fp16", "lookahead=2,lookahead=3"], "lookahead given twice"),
    (["build", "--full", "--dtypes", "fp16", "--all"], "--dtypes, --all do not apply"),
])  # fmt: skip
def test_ambiguous_options_are_refused(args: list[str], needle: str, tmp_path: Path) -> None:
    (tmp_path / "k.toml").write_text("lookahead = 2\n")
    one_line(kvpatch(*args, cwd=tmp_path), 2, needle)


def test_a_config_file_with_a_bom_is_read(tmp_path: Path) -> None:
    (tmp_path / "k.toml").write_bytes(b"\xef\xbb\xbflookahead = 3\n")
    proc = kvpatch("config", "--config", "k.toml", cwd=tmp_path)
    assert proc.returncode == 0 and "lookahead = 3" in proc.stdout, proc.stderr


def test_prefetch_controller_add_takes_counts_as_ints_only() -> None:
    """add() coerced with int(): batches='16' became buckets 1 and 6, a cap of 0.9 turned a
    batch off, {2.7: cap} became bucket 2; a tensor for the list gave one row per element."""
    from kvpatch.prefetch.controller import PrefetchController

    from test_prefetch import FakeAPI, FakeLibrary, FakeTensor

    api = FakeAPI()
    ctl = PrefetchController("cuda:0", api=api, library=FakeLibrary(api))
    w = FakeTensor(1 << 20, 1 << 16)
    bad = [({"batches": "16"}, "batches must be"), ({"batches": 8}, "batches must be"),
           ({"batches": {2.7: 1 << 20}}, "batch must be an int"), ({"batches": {"4": 1 << 20}}, "batch must be an int"),
           ({"batches": {True: 1 << 20}}, "batch must be an int"), ({"batches": {1: 0.9}}, "must be an int"),
           ({"batches": {1: "32"}}, "must be an int"), ({"batches": {1: float("nan")}}, "must be an int"),
           ({"cap_bytes": 0}, "cap_bytes must be positive"), ({"cap_bytes": 1.5e6}, "cap_bytes must be an int")]  # fmt: skip
    for i, (kw, message) in enumerate(bad):
        with pytest.raises(ValueError, match=message):
            ctl.add("p", i, [w], **kw)
    with pytest.raises(ValueError, match="not a tensor"):
        ctl.add("p", 100, w)
    with pytest.raises(ValueError, match="expected tensors, got str"):
        ctl.add("p", 101, [w, "w"])
    ctl.add("p", 0, [w])  # nothing above was registered
    for batch in (0, -3, 2.5, "1", True):
        with pytest.raises(ValueError, match="batch must be"):
            ctl.fork("p", 0, batch)  # a window without buckets checks batch= too
    assert ctl.fork("p", 0, 7)
    for kw in ({"enabled": "false"}, {"enabled": 0}, {"grid": 2**31}, {"library": object()}):
        with pytest.raises(UsageError):
            PrefetchController("cuda:0", api=api, **({"library": FakeLibrary(api)} | kw))


def test_prefetch_launch_options_are_checked_before_ctypes() -> None:
    from kvpatch.prefetch.kernel import check_launch
    from kvpatch.prefetch.ranges import range_table

    with pytest.raises(UsageError, match="threads must be an int"):
        check_launch(threads="64")
    if torch is not None:
        with pytest.raises(ValueError, match="address 0"):
            range_table([(0, 4096)])


def test_an_output_to_dev_stdout_appends_to_the_redirected_log(tmp_path: Path) -> None:
    """`-o /dev/stdout >> run.log` resolved to run.log, a regular file, and replaced it:
    the log's earlier lines were gone."""
    (tmp_path / "t.json").write_text(json.dumps(_saved_report()))
    (tmp_path / "run.log").write_text("OLD LOG\n")
    proc = subprocess.run(f"{sys.executable} -m kvpatch tune --from t.json -o /dev/stdout >> run.log 2>&1",
                          shell=True, cwd=tmp_path, timeout=120)  # fmt: skip
    assert proc.returncode == 0
    log = (tmp_path / "run.log").read_text()
    assert log.startswith("OLD LOG\n[kvpatch]") and "wrote /dev/stdout" in log


def test_two_outputs_naming_one_file_are_refused(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text(json.dumps(_saved_report()))
    one_line(kvpatch("tune", "--from", "t.json", "-o", "same", "--json", "./same", cwd=tmp_path), 2, "name the same file")
    assert not (tmp_path / "same").exists()
    one_line(kvpatch("bench", "--json", "x", "--plot", "x", cwd=tmp_path), 2, "--json and --plot name the same file")


@pytest.mark.parametrize("args, needle", [
    (["--quantized", "prefetch"], "--quantized prefetch changes no kernel: every fp8-cache kernel is off"),
    (["--rule", "fp16/64/16/fp8/v1=lookahead=2"], "only fp8-cache kernels"),
    (["--rule", "fp16/48=lookahead=2"], "selects no kernel vLLM builds"),
    (["--rule", "fp16/64/16=lookahead=3"], "more specific rules decide"),
])  # fmt: skip
def test_apply_says_why_an_option_or_rule_changes_no_kernel(args: list[str], needle: str, tmp_path: Path) -> None:
    from conftest import fixture_text, make_tree

    tree = make_tree(tmp_path / "vllm", fixture_text())
    proc = kvpatch("apply", "--tree", str(tree), *args, cwd=tmp_path)
    warned = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert proc.returncode == 0 and len(warned) == 1 and needle in warned[0], proc.stderr


def test_apply_refuses_what_would_be_ignored(tmp_path: Path) -> None:
    one_line(kvpatch("apply", "--preset", "paper", "--min-group", "4", cwd=tmp_path), 2, "--preset paper fixes min_group")
    one_line(kvpatch("apply", "--rule", "fp16/128/16/auto=off=false", cwd=tmp_path), 2, "'off = false' alone changes nothing")


def test_apply_without_a_target_and_a_corrupt_state_says_so(tmp_path: Path) -> None:
    (tmp_path / ".kvpatch").mkdir()
    (tmp_path / ".kvpatch" / "state.json").write_text("{bad")
    one_line(kvpatch("apply", cwd=tmp_path), 1, "corrupt")


def test_shadowed_call_settings_do_not_block_the_live_ones(tmp_path: Path) -> None:
    """The one call-form helper takes the settings of a kernel that uses it: a rule's
    align=64 on the only live call-form kernel was refused because the dead base settings
    (align 16) also counted, while the reach warning called --align 64 dead."""
    from conftest import HEADER, fixture_text, make_tree

    tree = make_tree(tmp_path / "vllm", fixture_text())
    from kvpatch.defaults import DEFAULT_OVERRIDES

    # every kernel the default turns on, but the one this test gives align=64
    live = [sel for sel, kv in DEFAULT_OVERRIDES if ("off", True) not in kv]
    off = [x for sel in live if sel != "bf16/64/16/auto/v2" for x in ("--rule", f"{sel}=off")]
    proc = kvpatch("apply", "--tree", str(tree), *off, "--rule", "bf16/64/16/auto/v2=align=64", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (tree / HEADER).read_text()
    helper = text[text.index("kvpatch_prefetch_l2(const void*"):]
    assert "& ~0x3fULL" in helper.split("}", 1)[0]  # align 64: the live kernel's
    proc = kvpatch("apply", "--tree", str(tree), *off, "--rule", "bf16/64/16/auto/v2=align=64", "--rule",
                   "fp16/64/16/auto/v2=align=32,issue=call", cwd=tmp_path)  # fmt: skip
    one_line(proc, 2, "share one helper")  # two live call-form kernels that disagree: still refused
