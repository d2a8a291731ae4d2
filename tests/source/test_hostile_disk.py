"""A full disk, a full quota or a path too long is said as what it is, with the path, and its
exit code (ENOSPC, EDQUOT: exit 1; ENAMETOOLONG: exit 2), wherever it strikes: never as a
damaged cache, a header kvpatch cannot patch (exit 4) or a failed clone."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from conftest import HEADER, fixture_text, git, make_tree

from kvpatch import fsutil
from kvpatch.fsutil import DiskFullError, PathTooLongError, machine_problem, problem_in_text
from kvpatch.source import git as gitcmd
from kvpatch.source import workspace


def _full_when_writing(monkeypatch: pytest.MonkeyPatch, name: str, code: int) -> None:
    real = fsutil.stage

    def stage(path, *a, **k):
        if Path(path).name == name:
            raise OSError(code, os.strerror(code), str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(fsutil, "stage", stage)
    monkeypatch.setattr(workspace, "stage", stage)


@pytest.mark.slow  # parses and patches the header (libclang)
@pytest.mark.parametrize("command", ["apply", "revert"])
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT], ids=["ENOSPC", "EDQUOT"])
def test_a_full_disk_is_said_so_with_the_path_and_exit_1(command: str, code: int, work: Path,
                                                         request: pytest.FixtureRequest,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    tree = request.getfixturevalue("applied" if command == "revert" else "git_tree")
    before = (tree / HEADER).read_bytes()
    args = ["apply", "--tree", str(tree)] if command == "apply" else ["revert"]
    _full_when_writing(monkeypatch, HEADER.rsplit("/", 1)[1], code)
    line = assert_one_line_error(run_cli(*args, cwd=work), 1, os.strerror(code), str(tree / HEADER))
    assert "free some space" in line and "cannot write" not in line
    assert (tree / HEADER).read_bytes() == before


def _release(tmp_path: Path) -> Path:
    tree = make_tree(tmp_path / "release", fixture_text())
    git(tree, "tag", "v0.10.2")
    return tree


@pytest.mark.parametrize("words, kind", [("No space left on device", DiskFullError),
                                         ("Disk quota exceeded", DiskFullError),
                                         ("File name too long", PathTooLongError)])  # fmt: skip
def test_a_checkout_that_fails_for_the_disk_does_not_blame_the_cache(words: str, kind: type, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    release = _release(tmp_path)

    def clone(argv, **kw):
        raise gitcmd.GitFailed(argv, 128, f"error: unable to write file .git/objects/ab/cd: {words}\nfatal: {words}")

    monkeypatch.setattr(gitcmd, "run", clone)
    with pytest.raises(kind) as info:
        workspace.checkout(release, tmp_path / "work" / ".kvpatch" / "vllm-0.10.2", "v0.10.2")
    assert words in str(info.value) and "vllm-0.10.2" in str(info.value)
    assert "damaged" not in str(info.value) and "delete" not in str(info.value)


def test_a_path_over_4096_characters_is_one_line_exit_2(tmp_path: Path) -> None:
    long = tmp_path / "/".join(["d" * 200] * 25)  # > 4096 characters
    proc = run_cli("apply", "--vllm", "v0.10.2", cwd=tmp_path, env={"KVPATCH_CACHE": str(long)})
    line = assert_one_line_error(proc, 2, "File name too long", "characters)", "use a shorter one")
    assert len(line) < 400


def test_the_classification() -> None:
    assert isinstance(machine_problem(OSError(errno.ENOSPC, "x", "/p")), DiskFullError)
    assert machine_problem(OSError(errno.ENOSPC, "x", "/p")).exit_code == 1
    assert machine_problem(OSError(errno.ENAMETOOLONG, "x", "/p")).exit_code == 2
    assert machine_problem(OSError(errno.EACCES, "x", "/p")) is None
    assert machine_problem(ValueError("x")) is None
    assert problem_in_text("fatal: could not lock config file: Permission denied", "/p") is None
