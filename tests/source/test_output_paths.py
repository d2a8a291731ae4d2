"""Output paths checked before any work: a directory, a parent that is a file, a directory
kvpatch cannot create files in, an empty name, '-' where stdout cannot be taken, are each
named in words (the probe file that checks writability is removed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvpatch.errors import UsageError
from kvpatch.fsutil import check_outputs, output_problem


def test_output_problems(tmp_path: Path) -> None:
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


def test_check_outputs_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^--plot '.*': is a directory"):
        check_outputs(json=None, plot=tmp_path)
    check_outputs(json=tmp_path / "r.json", plot=None)  # fine: nothing raised


@pytest.mark.parametrize("where", ["protected", "state"])
def test_an_output_refused_for_its_folder_writes_nothing_there_first(where: str, tmp_path: Path) -> None:
    """A folder kvpatch never writes an output into (one it keeps, a workspace's ``.kvpatch/``) sees
    no probe file either: the refusal comes before the writability test, so the folder's entries
    and its modification time are as they were."""
    folder = tmp_path / ("kept" if where == "protected" else ".kvpatch")
    folder.mkdir()
    (folder / "state.json").write_text("{}")
    before = folder.stat().st_mtime_ns
    os.utime(folder, ns=(before - 10**9, before - 10**9))  # a probe's create and unlink would move it
    before = folder.stat().st_mtime_ns
    with pytest.raises(UsageError, match="never writes"):
        check_outputs(protected={"the kept folder": folder} if where == "protected" else None,
                      json=folder / "r.json")  # fmt: skip
    assert folder.stat().st_mtime_ns == before
    assert sorted(p.name for p in folder.iterdir()) == ["state.json"]
