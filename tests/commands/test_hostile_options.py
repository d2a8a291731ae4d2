"""Every option of a GPU command is checked before torch, the GPU or nvcc is touched: a bad one is
one line, exit 2. Here torch cannot be imported at all, so a check that ran only after the GPU
check would end in exit 5 ("needs torch") instead."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from conftest import fixture_text, make_tree


@pytest.fixture
def no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import torch`` fails in this process (as on a machine without it)."""
    monkeypatch.setitem(sys.modules, "torch", None)


# {lib}: a library file that exists; {tree}: a tree to build from
@pytest.mark.parametrize("args, needle", [
    (["bench-decode", "--lib", "stock=/nonexistent.so:p"], "--lib stock '/nonexistent.so': no such file"),
    (["bench-decode", "--lib", "stock={lib}:p", "--prefetch-lib", "/nonexistent"], "--prefetch-lib '/nonexistent'"),
    (["bench-decode", "--lib", "stock={lib}:p", "--prefetch-lib", "/dev/null"], "is a character device"),
    (["bench-decode", "--tree", "{tree}", "--arch", "3.5"], "invalid arch '3.5'"),
    (["bench-decode-sweep", "--lib", "stock={lib}:p", "--out", "/etc/passwd"], "/etc/passwd is not a directory"),
    (["bench-decode-sweep", "--lib", "stock=/nonexistent.so:p"], "--lib stock '/nonexistent.so': no such file"),
    (["bench-decode-sweep", "--lib", "stock={lib}:p", "--prefetch-lib", "/tmp"], "is a directory"),
    (["bench", "--lib", "stock={lib}:p", "--head-sizes", "81"], "invalid --head-sizes value 81"),
    (["bench", "--lib", "stock={lib}:p", "--block-sizes", "7"], "invalid --block-sizes value 7"),
    (["bench", "--tree", "{tree}", "--arch", "3.5"], "invalid arch '3.5'"),
    (["bench", "--lib", "stock={lib}:p", "--device", "gpu"], "invalid --device 'gpu'"),
    (["bench", "--lib", "stock=/dev/zero:p"], "is a character device"),
    (["validate", "--lib", "stock={lib}:p", "--block-sizes", "7"], "invalid --block-sizes value 7"),
    (["validate", "--lib", "stock={lib}:p", "--head-sizes", "81"], "invalid --head-sizes value 81"),
    (["validate", "--tree", "{tree}", "--arch", "6.1"], "invalid arch '6.1'"),
    (["validate", "--lib", "stock={lib}:p", "--device", "cuda:x"], "invalid --device 'cuda:x'"),
    (["validate", "--lib", "stock={lib}:p", "--upstream", "--upstream-dir", "/etc/passwd"], "is not a directory"),
    (["tune", "--tree", "{tree}", "--arch", "5.0"], "invalid arch '5.0'"),
    (["build", "--tree", "{tree}", "--arch", "3.5"], "invalid arch '3.5'"),
    (["plugin", "enable", "--tree", "{tree}", "--arch", "3.5", "--release", "0.10.2"], "invalid arch '3.5'"),
    (["plugin", "enable", "--tree", "{tree}", "--dir", "/etc/passwd", "--build"], "/etc/passwd is not a directory"),
])  # fmt: skip
def test_every_option_is_checked_before_torch_the_gpu_or_nvcc(args: list[str], needle: str, tmp_path: Path,
                                                              no_torch: None) -> None:  # fmt: skip
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"\x7fELF not really")
    tree = make_tree(tmp_path / "vllm", fixture_text(), commit=False)
    argv = [a.format(lib=lib, tree=tree) for a in args]
    work = tmp_path / "work"
    work.mkdir()
    assert_one_line_error(run_cli(*argv, cwd=work, env={"PATH": "/nonexistent"}), 2, needle)
    assert "torch" not in sys.modules or sys.modules["torch"] is None
