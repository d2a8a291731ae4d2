"""The shell pieces the GPU-run scripts share (no GPU needed)."""

from __future__ import annotations

import lzma
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _lib_specs(libdir: Path, dest: Path) -> subprocess.CompletedProcess:
    script = 'source scripts/lib_specs.sh; lib_specs "$1" "$2"; printf "%s\\n" "${LIB_SPECS[@]}"'
    return subprocess.run(["bash", "-c", script, "lib_specs", str(libdir), str(dest)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def test_lib_specs_lists_libraries_and_unpacks_the_xz_ones(tmp_path: Path) -> None:
    libdir, dest = tmp_path / "libs", tmp_path / "unpacked"
    libdir.mkdir()
    (libdir / "libkvpatch_stock.so.xz").write_bytes(lzma.compress(b"stock bytes"))
    (libdir / "libkvpatch_patched.so").write_bytes(b"patched bytes")
    elsewhere = tmp_path / "other" / "libx.so"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"x")
    (libdir / "libs.txt").write_text("# a comment\nstock=libkvpatch_stock.so:kvpatch_stock\n\n"
                                     f"patched=libkvpatch_patched.so:kvpatch_patched\nx={elsewhere}:kvpatch_x\n")  # fmt: skip
    done = _lib_specs(libdir, dest)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"stock={dest}/libkvpatch_stock.so:kvpatch_stock",
                                        f"patched={libdir}/libkvpatch_patched.so:kvpatch_patched",
                                        f"x={elsewhere}:kvpatch_x"]  # fmt: skip
    assert (dest / "libkvpatch_stock.so").read_bytes() == b"stock bytes"


def test_lib_specs_stops_on_a_missing_library(tmp_path: Path) -> None:
    (tmp_path / "libs.txt").write_text("stock=libkvpatch_stock.so:kvpatch_stock\n")
    done = _lib_specs(tmp_path, tmp_path / "unpacked")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == f"error: {tmp_path}/libkvpatch_stock.so (from {tmp_path}/libs.txt) not found"
