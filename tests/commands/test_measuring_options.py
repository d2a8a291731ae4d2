"""The measuring commands (validate, bench, tune, bench-decode) and build check every option
and output path first: a bad one is one line, exit 2, before any build or the GPU check (on
this machine, without a GPU, the same commands with good options end in exit 5, no GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli


@pytest.mark.parametrize("args, needle", [
    (["validate", "--json", "."], "--json '.': is a directory"),
    (["bench", "--plot", "f/x.png"], "is not a directory"),
    (["bench", "--json", "/proc/r.json"], "cannot create files in /proc"),
    (["bench-decode", "--lib", "stock=s.so:s", "--json", "."], "--json '.': is a directory"),
    (["bench", "--json", "x", "--plot", "x"], "--json and --plot name the same file"),
])  # fmt: skip
def test_a_bad_output_path_fails_before_any_work(args: list[str], needle: str, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("a file")
    assert_one_line_error(run_cli(*args, cwd=tmp_path), 2, needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


@pytest.mark.parametrize("args, needle", [
    (["bench", "--heads", "0/8"], "invalid heads '0/8'"),
    (["bench", "--heads", "-32/8"], "invalid heads '-32/8'"),
    (["validate", "--heads", "0/2"], "invalid heads '0/2'"),
    (["validate", "--heads", "99999999999999999999/1"], "at most 1024 query heads"),
    (["bench", "--heads", "32/8,1025/1"], "invalid heads '1025/1': at most 1024 query heads"),
    (["validate", "--upstream", "--upstream-shard", "١/٢"], "invalid shard '١/٢'"),
    (["validate", "--upstream", "--upstream-shard", "+1/2"], "invalid shard '+1/2'"),
    (["validate", "--upstream", "--upstream-dir", "/proc/kvpatch-up"], "cannot create files in /proc"),
    (["validate", "--upstream", "--upstream-dir", "/dev/null/up"], "/dev/null is not a directory"),
    (["validate", "--upstream", "--upstream-shard", "1_0/2_0"], "invalid shard '1_0/2_0'"),
    (["bench", "--rounds", "0"], "reps and rounds must be >= 1"),
    (["bench", "--reps", "0"], "reps and rounds must be >= 1"),
    (["bench", "--warmup", "-1"], "warmup >= 0"),
    (["bench", "--kernels", "v3"], "unknown kernel 'v3'"),
    (["bench", "--no-warm", "--no-cold"], "neither warm nor cold"),
    (["validate", "--upstream", "--workers", "0"], "--workers must be >= 1"),
    (["validate", "--contexts", "99999999999"], "--contexts must be 1 to 131072 tokens"),
    (["bench", "--contexts", "512,131073"], "--contexts must be 1 to 131072 tokens"),
    (["bench-decode", "--lib", "stock=a.so:p", "--contexts", "0"], "--contexts must be 1 to 131072 tokens"),
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
    assert_one_line_error(run_cli(*args, cwd=tmp_path), 2, f"kvpatch {args[0]}: ", needle)


@pytest.mark.parametrize("args, needle", [
    (["bench-decode", "--lib", "stock=a.so:p", "--cap", "8;fork=qkv"], "invalid --cap '8;fork=qkv'"),
    (["bench-decode", "--lib", "stock=a.so:p", "--hint", ""], "invalid --hint ''"),
    (["bench", "--variant", "paper=k.toml"], "one of bench's own variants"),
    (["bench", "--variant", "mine=k.toml", "--variant", "mine=k.toml"], "--variant mine given twice"),
    (["build", "--full", "--dtypes", "fp16", "--all"], "--dtypes, --all do not apply"),
])  # fmt: skip
def test_ambiguous_options_are_refused(args: list[str], needle: str, tmp_path: Path) -> None:
    (tmp_path / "k.toml").write_text("lookahead = 2\n")
    assert_one_line_error(run_cli(*args, cwd=tmp_path), 2, needle)


@pytest.mark.slow  # imports torch
@pytest.mark.parametrize("command", ["validate", "bench", "bench-decode"])
def test_prebuilt_libraries_without_a_gpu_is_the_one_line_gpu_error(command: str, tmp_path: Path) -> None:
    """Before: `validate --lib`/`bench --lib` crashed with a traceback, `bench-decode --lib` too."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("checks the machine without a GPU")
    lib = tmp_path / "s.so"
    lib.write_bytes(b"\x7fELF not really")
    proc = run_cli(
        command, "--lib", f"stock={lib}:kvpatch_stock", "--lib", f"patched={lib}:kvpatch_patched", cwd=tmp_path
    )
    assert_one_line_error(proc, 5, "GPU")
