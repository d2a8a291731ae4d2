"""The tree files a build reads itself (vLLM's launcher ``paged_attention_v1.cu``, every file the
header reaches by ``#include``) are read only as regular files of bounded size: a FIFO, a device
or a huge file there is one PatchError naming it (exit 4), never a read that blocks or never
ends. Each read runs in a thread the test gives up on (and unblocks) if it hangs."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable

import pytest

from kvpatch.errors import PatchError
from kvpatch.jit import source_closure, vllm_kernel_set
from kvpatch.source.includes import MAX_BYTES

HEADER_REL = "attention/attention_kernels.cuh"
HEADER_TEXT = '#include "attention_utils.cuh"\n#include "../cuda_compat.h"\n// the kernels\n'


def _within(seconds: float, fn: Callable[[], object], fifo: Path | None = None) -> object:
    """``fn()``'s result, or its exception raised here; the test fails if it runs longer than
    ``seconds`` (a reader blocked on ``fifo`` is released first, so the test run goes on)."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if fifo is not None:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the blocked reader sees end of file
        thread.join(5)
        pytest.fail(f"reading the tree's files blocked (> {seconds} s)")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


def _huge(path: Path, size: int) -> None:
    """A sparse file of ``size`` bytes (no disk used)."""
    with open(path, "wb") as f:
        f.truncate(size)


def _csrc(tmp_path: Path) -> Path:
    csrc = tmp_path / "csrc"
    (csrc / "attention").mkdir(parents=True)
    (csrc / "attention" / "attention_utils.cuh").write_text("// utils\n")
    (csrc / "cuda_compat.h").write_text("// compat\n")
    return csrc


def test_the_closure_reads_the_headers_includes(tmp_path: Path) -> None:
    files = source_closure(_csrc(tmp_path), HEADER_TEXT, HEADER_REL)
    assert files == {HEADER_REL: HEADER_TEXT, "attention/attention_utils.cuh": "// utils\n",
                     "cuda_compat.h": "// compat\n"}  # fmt: skip


def test_a_fifo_the_header_includes_is_refused_by_the_build(tmp_path: Path) -> None:
    csrc = _csrc(tmp_path)
    fifo = csrc / "attention" / "attention_utils.cuh"
    fifo.unlink()
    os.mkfifo(fifo)
    with pytest.raises(PatchError, match=r"attention_utils\.cuh \(included by attention/attention_kernels\.cuh\) "
                                         r"is a FIFO, not a regular file"):  # fmt: skip
        _within(10, lambda: source_closure(csrc, HEADER_TEXT, HEADER_REL), fifo)


def test_includes_past_the_bound_are_refused_by_the_build(tmp_path: Path) -> None:
    csrc = _csrc(tmp_path)
    _huge(csrc / "cuda_compat.h", MAX_BYTES + 1)
    with pytest.raises(PatchError, match=rf"cuda_compat\.h .* over {MAX_BYTES} bytes"):
        _within(30, lambda: source_closure(csrc, HEADER_TEXT, HEADER_REL))


def test_an_include_that_is_not_utf8_is_refused_by_the_build(tmp_path: Path) -> None:
    csrc = _csrc(tmp_path)
    (csrc / "cuda_compat.h").write_bytes(b"// \xff\n")
    with pytest.raises(PatchError, match=r"cuda_compat\.h \(included by .*\) is not UTF-8"):
        source_closure(csrc, HEADER_TEXT, HEADER_REL)


def _launcher(tmp_path: Path) -> Path:
    launcher = tmp_path / "vllm" / "csrc" / "attention" / "paged_attention_v1.cu"
    launcher.parent.mkdir(parents=True)
    return launcher


def test_a_fifo_as_the_launcher_is_refused_when_its_kernel_set_is_read(tmp_path: Path) -> None:
    launcher = _launcher(tmp_path)
    os.mkfifo(launcher)
    with pytest.raises(PatchError, match=r"paged_attention_v1\.cu is a FIFO, not a regular file"):
        _within(10, lambda: vllm_kernel_set(tmp_path / "vllm"), launcher)


def test_a_launcher_past_the_bound_is_refused_when_its_kernel_set_is_read(tmp_path: Path) -> None:
    _huge(_launcher(tmp_path), MAX_BYTES + 1)
    with pytest.raises(PatchError, match=rf"paged_attention_v1\.cu is {MAX_BYTES + 1} bytes"):
        _within(30, lambda: vllm_kernel_set(tmp_path / "vllm"))
