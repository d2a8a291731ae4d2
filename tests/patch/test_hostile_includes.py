"""Every tree file the parse of the header can include is checked to be a regular file of bounded
size before libclang runs, and handed to libclang by kvpatch: a FIFO, socket or device among
them is a one-line PatchError, never a parse that blocks inside libclang."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from conftest import HEADER, fixture_text, in_thread, make_tree

from kvpatch.errors import PatchError, UsageError
from kvpatch.patch import read_header
from kvpatch.source import includes

INCLUDES = '#include "attention_utils.cuh"\n#include "../cuda_compat.h"\n'


def included_tree(root: Path) -> Path:
    """The fixture tree whose header includes two siblings, as vLLM's does; the second includes a
    third by a path through another directory (``../attention/x``: another spelling to clang)."""
    text = fixture_text().replace("#include <cstdint>\n", "#include <cstdint>\n" + INCLUDES, 1)
    tree = make_tree(root, text, commit=False)
    csrc = tree / "csrc"
    (csrc / "attention" / "attention_utils.cuh").write_text("#pragma once\n")
    (csrc / "quantization").mkdir()
    (csrc / "cuda_compat.h").write_text('#pragma once\n#include "quantization/../attention/dtypes.cuh"\n')
    (csrc / "attention" / "dtypes.cuh").write_text("#pragma once\n")
    return tree


def special(path: Path, kind: str, keep: list) -> None:
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        here = os.getcwd()
        os.chdir(path.parent)
        try:
            sock.bind(path.name)
        finally:
            os.chdir(here)
        keep.append(sock)
    else:  # /dev/null, not /dev/zero: without the check libclang would read /dev/zero until memory ran out
        path.symlink_to("/dev/null")


def unblock(fifo: Path) -> None:
    """Let a reader blocked on ``fifo`` go (a failed test must not leave a thread in libclang)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
@pytest.mark.parametrize("which", ["csrc/attention/attention_utils.cuh", "csrc/attention/dtypes.cuh"])
def test_every_file_the_parse_can_include_is_checked_before_libclang_opens_it(kind: str, which: str, tmp_path: Path
                                                                              ) -> None:  # fmt: skip
    tree = included_tree(tmp_path / "vllm")
    text = (tree / HEADER).read_text()
    assert read_header(text, str(tree / HEADER)).sites  # the tree as it is parses
    keep: list = []
    special(tree / which, kind, keep)
    try:
        finished, error = in_thread(lambda: read_header(text, str(tree / HEADER)), 20)
        assert finished, f"the parse blocked on a {kind} the header includes"
    finally:
        unblock(tree / which)
        for s in keep:
            s.close()
    assert isinstance(error, PatchError), error
    assert Path(which).name in str(error) and "not a regular file" in str(error)


def test_the_included_files_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = included_tree(tmp_path / "vllm")
    (tree / "csrc" / "attention" / "attention_utils.cuh").write_bytes(b"// x\n" * 1000)
    monkeypatch.setattr(includes, "MAX_BYTES", 4000)
    with pytest.raises(PatchError, match="attention_utils.cuh .* over 4000 bytes"):
        read_header((tree / HEADER).read_text(), str(tree / HEADER))


def test_included_files_are_found_under_every_spelling_clang_forms(tmp_path: Path) -> None:
    tree = included_tree(tmp_path / "vllm")
    header = str(tree / HEADER)
    found = dict(
        includes.included_files(
            header, (tree / HEADER).read_bytes(), [str(tree / "csrc"), str(tree / "csrc" / "attention")]
        )
    )
    attention = str(tree / "csrc" / "attention")
    assert set(found) == {f"{attention}/attention_utils.cuh", f"{attention}/../cuda_compat.h",
                          f"{attention}/../quantization/../attention/dtypes.cuh"}  # fmt: skip


def test_a_header_path_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not UTF-8"):
        read_header(fixture_text(), os.fsdecode(bytes(tmp_path) + b"/\xff/" + HEADER.encode()))
