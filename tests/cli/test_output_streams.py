"""Where output goes: a zero-width terminal eats none of it, a piped table keeps every cell
whole, a closed stdout is no crash. Each test runs the command as a new process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli.cli_helpers import KVPATCH, kvpatch, kvpatch_env
from conftest import fixture_text, make_tree

pytestmark = pytest.mark.slow


def test_a_zero_width_terminal_eats_no_output(tmp_path: Path) -> None:
    """``COLUMNS=0``: errors still print, in one line, and JSON is whole."""
    tree = make_tree(tmp_path / "vllm", fixture_text())
    env = {**os.environ, "COLUMNS": "0", "LINES": "0"}
    bad = subprocess.run([sys.executable, "-m", "kvpatch", "apply", "--tree", str(tmp_path / "nope")], cwd=tmp_path,
                         env=env, capture_output=True, text=True)  # fmt: skip
    assert (
        bad.returncode == 2 and bad.stderr.startswith("error: kvpatch apply: --tree ") and bad.stderr.count("\n") == 1
    )
    out = subprocess.run([sys.executable, "-m", "kvpatch", "sites", "--tree", str(tree), "--json", "-"], cwd=tmp_path,
                         env=env, capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["key"]["loop_var"] == "block_idx"
    table = subprocess.run([sys.executable, "-m", "kvpatch", "sites", "--tree", str(tree)], cwd=tmp_path,
                           env=env, capture_output=True, text=True)  # fmt: skip
    assert "block_idx += NUM_WARPS" in table.stdout and "k_cache[...]" in table.stdout


def test_piped_tables_keep_every_cell_whole(tmp_path: Path) -> None:
    """Piped (stdout not a terminal), a table is as wide as its cells, whatever COLUMNS says."""
    tree = make_tree(tmp_path / "vllm", fixture_text())
    env = {**os.environ, "COLUMNS": "20"}
    out = subprocess.run([sys.executable, "-m", "kvpatch", "sites", "--tree", str(tree)], cwd=tmp_path, env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0
    assert any("block_idx += NUM_WARPS" in line for line in out.stdout.splitlines())


def test_a_closed_stdout_is_not_a_crash(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    tree = make_tree(tmp_path / "vllm", fixture_text())
    assert kvpatch("apply", "--tree", str(tree), cwd=work).returncode == 0
    for command in ("diff", "config", "sites"):
        proc = subprocess.run(f"{KVPATCH} {command} >&-", shell=True, cwd=work, env=kvpatch_env(work),
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (command, proc.stderr)


def _with_reader_gone(args: list[str], cwd: Path, streams: str = "stdout") -> subprocess.CompletedProcess:
    """``kvpatch ARGS`` with ``streams`` (stdout, stderr or both) a pipe whose reader has gone,
    as after ``| head -1`` has read its line; stderr is captured where it is not that pipe."""
    read, write = os.pipe()
    os.close(read)
    try:
        out = write if "stdout" in streams or streams == "both" else subprocess.DEVNULL
        err = write if "stderr" in streams or streams == "both" else subprocess.PIPE
        return subprocess.run([KVPATCH, *args], cwd=cwd, env=kvpatch_env(cwd), stdout=out, stderr=err, text=True,
                              timeout=120)  # fmt: skip
    finally:
        os.close(write)


def test_a_reader_that_goes_away_ends_the_command_as_sigpipe_would(tmp_path: Path) -> None:
    """``kvpatch sites | head -1``: exit 141 (what a shell reports for SIGPIPE), nothing on stderr;
    before, the CLI library ended each such command with a silent 1, 'another failure'."""
    work = tmp_path / "work"
    work.mkdir()
    tree = make_tree(tmp_path / "vllm", fixture_text())
    assert kvpatch("apply", "--tree", str(tree), cwd=work).returncode == 0
    for args in (["sites"], ["diff"], ["diff", "-o", "-"], ["config"], ["sites", "--json", "-"], ["--help"],
                 ["build", "--help"], ["--version"]):  # fmt: skip
        proc = _with_reader_gone(args, work)
        assert (proc.returncode, proc.stderr) == (141, ""), args


def test_an_error_keeps_its_exit_code_when_stderrs_reader_has_gone(tmp_path: Path) -> None:
    """The code is then all the caller learns: an invalid option is still 2, not the pipe's 141."""
    for args in (["apply", "--lookahead", "x"], ["apply", "--tree", str(tmp_path / "nope")]):
        assert _with_reader_gone(args, tmp_path, "stderr").returncode == 2, args


def test_an_apply_whose_readers_have_gone_leaves_the_header_whole(tmp_path: Path) -> None:
    """Stopped at its first write (as SIGPIPE stops a program), ``apply`` leaves the header stock or
    wholly patched, never between, and the next ``apply`` runs as if nothing had happened."""
    work = tmp_path / "work"
    work.mkdir()
    tree = make_tree(tmp_path / "vllm", fixture_text())
    header = tree / "csrc" / "attention" / "attention_kernels.cuh"
    stock = header.read_text()
    assert _with_reader_gone(["apply", "--tree", str(tree)], work, "both").returncode == 141
    assert header.read_text() == stock or "kvpatch:begin" in header.read_text()
    assert kvpatch("apply", "--tree", str(tree), cwd=work).returncode == 0
    assert kvpatch("revert", cwd=work).returncode == 0 and header.read_text() == stock
    assert sorted(p.name for p in header.parent.iterdir() if p.name.endswith(".tmp")) == []


def test_an_output_through_a_descriptor_must_be_one_open_for_writing(tmp_path: Path) -> None:
    """``--json /dev/fd/9`` with no descriptor 9, or ``/dev/stdin``: exit 2 before the header is
    touched (before, the header was patched, then the report failed: exit 1)."""
    work = tmp_path / "work"
    work.mkdir()
    tree = make_tree(tmp_path / "vllm", fixture_text())
    header = tree / "csrc" / "attention" / "attention_kernels.cuh"
    stock = header.read_bytes()
    for path, why in (
        ("/dev/fd/9", "descriptor 9 is not open"),
        ("/dev/stdin", "descriptor 0 is open for reading only"),
    ):
        proc = subprocess.run([KVPATCH, "apply", "--tree", str(tree), "--json", path], cwd=work, env=kvpatch_env(work),
                              input="", capture_output=True, text=True, timeout=120)  # fmt: skip  # stdin: a pipe's read end
        assert proc.returncode == 2 and why in proc.stderr, (path, proc.stderr)
        assert header.read_bytes() == stock and not (work / ".kvpatch" / "state.json").exists()


def test_dash_is_the_file_the_shell_made_stdout_and_is_checked_as_one(tmp_path: Path) -> None:
    """``diff -o - >> header`` and ``sites --json - >> .kvpatch/state.json`` are refused as
    ``-o header`` is (before, the diff was appended to the header)."""
    work = tmp_path / "work"
    work.mkdir()
    tree = make_tree(tmp_path / "vllm", fixture_text())
    assert kvpatch("apply", "--tree", str(tree), cwd=work).returncode == 0
    header, state = tree / "csrc" / "attention" / "attention_kernels.cuh", work / ".kvpatch" / "state.json"
    before = {p: p.read_bytes() for p in (header, state)}
    for args, target, why in ((["diff", "-o", "-"], header, "the tree's header"),
                              (["sites", "--json", "-"], state, "kvpatch's state directory")):  # fmt: skip
        with open(target, "ab") as out:
            proc = subprocess.run([KVPATCH, *args], cwd=work, env=kvpatch_env(work), stdout=out,
                                  stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 2 and why in proc.stderr, (args, proc.stderr)
    assert {p: p.read_bytes() for p in before} == before
    assert kvpatch("diff", "-o", "-", cwd=work).stdout.startswith("diff --git")  # a pipe: written as before


def test_plain_stdout_made_a_file_kvpatch_keeps_is_refused_as_dash_is(tmp_path: Path) -> None:
    """Before: ``kvpatch diff >> .kvpatch/state.json`` exited 0 and corrupted the state (the next
    command: "corrupt state"), ``config >> header`` appended TOML to the header and ``config
    --config k.toml >> k.toml`` broke its own input, where ``-o -`` was refused. After: every
    command refuses a stdout that is one of the files kvpatch keeps (of --tree too) or an input."""
    work = tmp_path / "work"
    work.mkdir()
    tree = make_tree(tmp_path / "vllm", fixture_text())
    other = make_tree(tmp_path / "other", fixture_text())
    assert kvpatch("apply", "--tree", str(tree), cwd=work).returncode == 0
    header, state = tree / "csrc" / "attention" / "attention_kernels.cuh", work / ".kvpatch" / "state.json"
    toml = work / "k.toml"
    toml.write_text("lookahead = 2\n")
    other_header = other / "csrc" / "attention" / "attention_kernels.cuh"
    before = {p: p.read_bytes() for p in (header, state, toml, other_header)}
    for args, target, why in ((["diff"], state, "kvpatch's state directory"), (["sites"], header, "the tree's header"),
                              (["config"], header, "the tree's header"), (["revert"], state, "kvpatch's state"),
                              (["bench", "--reps", "1"], state, "kvpatch's state directory"),
                              (["config", "--config", str(toml)], toml, "--config"),
                              (["sites", "--tree", str(other)], other_header, "the tree's header")):  # fmt: skip
        with open(target, "ab") as out:
            proc = subprocess.run([KVPATCH, *args], cwd=work, env=kvpatch_env(work), stdout=out,
                                  stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 2 and why in proc.stderr and proc.stderr.count("\n") == 1, (args, proc.stderr)
    assert {p: p.read_bytes() for p in before} == before
    with open(tmp_path / "d.patch", "wb") as out:  # a file of the user's own: written as before
        assert subprocess.run([KVPATCH, "diff"], cwd=work, env=kvpatch_env(work), stdout=out).returncode == 0
    assert (tmp_path / "d.patch").read_text().startswith("diff --git")


def test_a_stdout_that_cannot_encode_a_path_shows_it_escaped(tmp_path: Path) -> None:
    """A stdout in ASCII (``LANG=C`` on some systems) and a tree named ``tü``: the path is shown
    escaped, never a traceback after the header was written."""
    work = tmp_path / "work"
    work.mkdir()
    tree = make_tree(tmp_path / "t\u00fc", fixture_text())
    proc = kvpatch("apply", "--tree", str(tree), cwd=work, env={"PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-500:]
    assert "t\\xfc" in proc.stdout


@pytest.mark.slow  # a real release: a patch larger than a pipe holds
def test_a_reader_that_goes_away_part_way_through_a_large_output_is_141_not_0(tmp_path: Path, vllm_release) -> None:
    """``kvpatch diff | head -1`` on vLLM 0.10.2 (a 97 kB patch): the pipe took 64 kB, its reader
    left, and Python's buffered stdout dropped the rest without an error: exit 0 with the patch
    cut. Now every byte is written or the command ends as SIGPIPE would."""
    import shutil

    tree = tmp_path / "vllm"
    shutil.copytree(vllm_release("0.10.2") / "csrc", tree / "csrc")
    work = tmp_path / "work"
    work.mkdir()
    assert kvpatch("apply", "--tree", str(tree), cwd=work).returncode == 0
    proc = subprocess.Popen([KVPATCH, "diff"], cwd=work, env=kvpatch_env(work), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.read(10) == b"diff --git"
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (141, b"")
    whole = subprocess.run([KVPATCH, "diff"], cwd=work, env=kvpatch_env(work), capture_output=True, timeout=120)
    assert whole.returncode == 0 and len(whole.stdout) > 1 << 16
