"""Errors as the shell reports them: one line on stderr, ``error: kvpatch COMMAND: ...``,
nothing on stdout, the exit code of the error's kind (2 for what the user typed), nothing
written; user text shown literally, never read as markup; ``--debug`` adds the traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, kvpatch, run_cli
from conftest import HEADER, STOCK, fixture_text, git, make_tree


def committed(tree: Path) -> bytes:
    return git(tree, "show", f"HEAD:{HEADER}", text=False)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--lookahead", "0"], "invalid lookahead 0: must be >= 1"),
        (["--size", "100"], "invalid size 100: must be a positive multiple of 16 bytes"),
        (["--align", "24"], "invalid align 24: must be a power of two >= 16"),
        (["--caches", "q"], "invalid caches 'q': choose one of k, v, kv"),
        (["--scope", "warp"], "invalid scope 'warp': choose one of cta, kv-head, kv-head-rotate"),
        (["--preset", "paper", "--lookahead", "2"], "--preset paper fixes lookahead; drop those options"),
    ],
)
def test_invalid_parameters(args: list[str], message: str, git_tree: Path, work: Path) -> None:
    proc = run_cli("apply", "--tree", str(git_tree), *args, cwd=work)
    assert assert_one_line_error(proc, 2) == f"error: kvpatch apply: {message}"
    assert (git_tree / HEADER).read_bytes() == committed(git_tree)
    assert not (work / ".kvpatch").exists()


def test_invalid_config_file(git_tree: Path, work: Path) -> None:
    (work / "kvpatch.toml").write_text("lookahaed = 2\n")
    proc = run_cli("apply", "--tree", str(git_tree), "--config", "kvpatch.toml", cwd=work)
    assert assert_one_line_error(proc, 2) == "error: kvpatch apply: unknown configuration key(s): lookahaed"
    assert (git_tree / HEADER).read_bytes() == committed(git_tree)


@pytest.mark.parametrize("args, needle", [(["apply", "--tree", "TREE", "--bogus"], "--bogus"),
                                          (["apply", "--tree", "TREE", "--lookahead", "two"], "--lookahead"),
                                          (["frobnicate"], "frobnicate"), (["diff", "-o"], "-o"),
                                          (["plugin", "enable", "--bogus"], "--bogus")],
                         ids=["unknown-option", "not-an-int", "unknown-command", "missing-value", "subcommand"])  # fmt: skip
def test_usage_errors_from_option_parsing_are_one_line(
    args: list[str], needle: str, git_tree: Path, work: Path
) -> None:
    proc = run_cli(*[str(git_tree) if a == "TREE" else a for a in args], cwd=work)
    line = assert_one_line_error(proc, 2, needle)
    assert "--help" in line
    assert (git_tree / HEADER).read_bytes() == committed(git_tree) and not (work / ".kvpatch").exists()


def test_the_error_names_the_command_and_the_subcommand(work: Path) -> None:
    assert run_cli("apply", "--bogus", cwd=work).stderr.startswith("error: kvpatch apply: ")
    assert run_cli("plugin", "enable", "--bogus", cwd=work).stderr.startswith("error: kvpatch plugin enable: ")
    assert run_cli("frobnicate", cwd=work).stderr.startswith("error: No such command")  # no command to name


def test_diff_without_state_says_apply_first(work: Path) -> None:
    line = assert_one_line_error(run_cli("diff", cwd=work), 2)
    assert line == "error: kvpatch diff: no tree: run 'kvpatch apply --vllm X' here first, or pass --tree PATH"


@pytest.mark.parametrize("command", ["revert", "sites"])
def test_other_commands_without_state(command: str, work: Path) -> None:
    assert_one_line_error(
        run_cli(command, cwd=work), 2, f"kvpatch {command}: ", "run 'kvpatch apply --vllm X' here first"
    )


def test_apply_without_a_target(work: Path) -> None:
    assert_one_line_error(run_cli("apply", cwd=work), 2, "pass --vllm X")


def test_apply_with_vllm_and_tree_together(git_tree: Path, work: Path) -> None:
    proc = run_cli("apply", "--vllm", "0.10.2", "--tree", str(git_tree), cwd=work)
    assert assert_one_line_error(proc, 2) == "error: kvpatch apply: give either --vllm or --tree, not both"
    assert not (work / ".kvpatch").exists()


@pytest.mark.slow  # a subprocess: --debug lets the exception out of the process
def test_debug_shows_the_traceback(work: Path) -> None:
    proc = kvpatch("--debug", "diff", cwd=work)
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "UsageError: no tree" in proc.stderr


def test_version(work: Path) -> None:
    from kvpatch import __version__

    proc = run_cli("--version", cwd=work)
    assert (proc.returncode, proc.stdout) == (0, f"kvpatch {__version__}\n")


@pytest.mark.slow  # applies (libclang)
def test_brackets_in_paths_and_values_are_shown_literally(tmp_path: Path, work: Path) -> None:
    odd = tmp_path / "[bold]x[/bold]" / "[red]"
    tree = make_tree(odd, fixture_text(STOCK))
    proc = run_cli("apply", "--tree", str(tree), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"patched {tree / HEADER}"
    empty = tmp_path / "[x]"
    empty.mkdir()
    assert_one_line_error(run_cli("apply", "--tree", str(empty), cwd=work), 4, f"{empty} has no {HEADER}")
    assert_one_line_error(run_cli("apply", "--tree", str(tree), "--caches", "[red]k", cwd=work), 2, "'[red]k'")


def test_control_characters_in_paths_and_values_are_shown_as_escapes(tmp_path: Path, work: Path) -> None:
    """Before: an escape sequence in a --tree or a [kvpatch.tuned] fact reached the terminal as it
    was (retitling it, colouring what followed), and a newline in a file name printed a second,
    forged line. After: each control character is shown as its escape."""
    esc = "\x1b]0;TITLE\x07"
    assert_one_line_error(run_cli("apply", "--tree", f"/no/such{esc}", cwd=work), 2, "\\x1b]0;TITLE\\x07")
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    config = tmp_path / "k.toml"
    config.write_text('[kvpatch.tuned]\ngpu = "NVIDIA H200"\nnvcc = "1.0\\nerror: forged \\u001b[31m"\n')
    proc = run_cli("apply", "--tree", str(tree), "--config", str(config), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr and "\\x1b[31m" in proc.stdout
    assert not any(line.startswith("error: forged") for line in (proc.stdout + proc.stderr).splitlines())
    odd = tmp_path / "out\nerror: forged.patch"
    proc = run_cli("diff", "-o", str(odd), cwd=work)
    assert proc.returncode == 0 and odd.exists() and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("args", [
    ["diff", "--tree", ""], ["diff", "-o", ""], ["sites", "--tree", " "], ["plugin", "disable", "--dir", ""],
    ["plugin", "enable", "--dir", ""], ["validate", "--upstream", "--upstream-dir", ""], ["tune", "--from", ""],
    ["tune", "-o", ""], ["bench-decode", "--libs-file", ""], ["bench", "--plot", ""],
])  # fmt: skip
def test_an_empty_path_is_refused_not_taken_for_the_current_directory(args: list[str], work: Path) -> None:
    """Before: '' (an unset shell variable) became '.': ``plugin disable --dir ''`` acted on the
    current directory and exited 0. After: one line, exit 2, the option named."""
    assert_one_line_error(run_cli(*args, cwd=work), 2, "Invalid value for '", args[-2], "an empty path")


@pytest.mark.parametrize("args", [
    ["config", "--config", "k.toml/"], ["diff", "-o", "out.patch/"], ["tune", "-o", "t.toml/"],
    ["tune", "--from", "t.json/"], ["bench-decode", "--libs-file", "libs.txt/"], ["bench", "--plot", "p.png/"],
    ["bench-decode", "--text", "t.txt/"],
])  # fmt: skip
def test_a_file_spelled_as_a_folder_is_refused(args: list[str], work: Path) -> None:
    """Before: a Path dropped the trailing '/': ``--config k.toml/`` read k.toml and ``-o out.patch/``
    wrote a file out.patch. After: one line, exit 2, nothing written."""
    (work / "k.toml").write_text("lookahead = 2\n")
    before = sorted(work.iterdir())
    assert_one_line_error(run_cli(*args, cwd=work), 2, args[-2], f"{args[-1]!r} ends in '/'")
    assert sorted(work.iterdir()) == before


def test_a_variant_file_spelled_as_a_folder_is_refused(work: Path) -> None:
    """``bench --variant v=k.toml/``: the file after NAME= is a file option too (it read k.toml)."""
    (work / "k.toml").write_text("lookahead = 2\n")
    assert_one_line_error(run_cli("bench", "--variant", "v=k.toml/", cwd=work), 2,
                          "invalid --variant 'v=k.toml/'", "ends in '/'")  # fmt: skip


def test_the_plugin_commands_show_control_characters_as_escapes(tmp_path: Path, work: Path) -> None:
    """Before: ``plugin disable --dir $'x\\ny'`` printed its folder over two lines, and the
    plugin's log line (in every vLLM process) carried a manifest's escape sequences raw."""
    proc = run_cli("plugin", "disable", "--dir", str(tmp_path / "x\ny\x1b[31m"), cwd=work)
    assert proc.returncode == 0 and proc.stdout.count("\n") == 1 and "\x1b" not in proc.stdout
    assert "x\\ny\\x1b[31m" in proc.stdout
    from kvpatch.vllm_plugin.checks import Decision

    line = Decision(action="refuse", reason="a manifest says 0.10.2\x1b]0;pwn\x07", registered=False).line()
    assert "\x1b" not in line and "\x07" not in line and "\\x1b]0;pwn\\x07" in line


def test_a_current_directory_removed_under_the_shell_is_said_as_that(tmp_path):
    """Before: every command said only "No such file or directory" (exit 1), naming nothing. After:
    that the current directory is gone, one line, exit 1."""
    import subprocess
    import sys

    from cli.cli_helpers import kvpatch_env

    gone = tmp_path / "gone"
    gone.mkdir()
    code = f"import os, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); sys.argv = ['kvpatch', 'config']; " \
           "from kvpatch.__main__ import main; main()"  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], env=kvpatch_env(tmp_path), capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 1 and proc.stderr == (
        "error: kvpatch config: the current directory no longer exists: cd to one that does\n"
    ), proc.stderr
