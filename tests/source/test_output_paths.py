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
