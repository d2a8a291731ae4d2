"""A FIFO among the tree's files a command reads (a file the header includes, the tree's
``csrc/torch_bindings.cpp``) is a one-line refusal, never a command that hangs with its locks
held; each command runs in its own process, killed (and the test failed) if it hangs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, kvpatch_process
from conftest import HEADER
from patch.test_hostile_includes import included_tree


@pytest.mark.slow  # a new process per command
@pytest.mark.parametrize("command", ["sites", "apply"])
def test_a_fifo_the_header_includes_is_refused_before_libclang(command: str, tmp_path: Path) -> None:
    tree = included_tree(tmp_path / "vllm")
    utils = tree / "csrc" / "attention" / "attention_utils.cuh"
    utils.unlink()
    os.mkfifo(utils)
    before = (tree / HEADER).read_bytes()
    assert_one_line_error(
        kvpatch_process(command, "--tree", str(tree), cwd=tmp_path), 4, "attention_utils.cuh", "is a FIFO"
    )
    assert (tree / HEADER).read_bytes() == before


@pytest.mark.slow
def test_a_fifo_as_the_trees_torch_bindings_is_refused_by_plugin_enable(tmp_path: Path) -> None:
    tree = included_tree(tmp_path / "vllm")
    os.mkfifo(tree / "csrc" / "torch_bindings.cpp")
    proc = kvpatch_process("plugin", "enable", "--tree", str(tree), "--release", "0.10.2", "--dir", str(tmp_path / "b"),
                cwd=tmp_path)  # fmt: skip
    assert_one_line_error(proc, 2, "torch_bindings.cpp", "is a FIFO, not a regular file")
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_a_fifo_as_the_trees_launcher_is_refused_before_the_build_reads_it(tmp_path: Path) -> None:
    tree = included_tree(tmp_path / "vllm")
    os.mkfifo(tree / "csrc" / "attention" / "paged_attention_v1.cu")
    assert_one_line_error(
        kvpatch_process("build", "--tree", str(tree), "--all", cwd=tmp_path), 4, "paged_attention_v1.cu", "is a FIFO"
    )
