"""The header is read as UTF-8 only: another encoding is refused in one line (exit 4) naming
the byte and the line, by every command that reads it, and the header is left as it is."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from conftest import HEADER, STOCK, fixture_text, make_tree


@pytest.mark.parametrize("command", [["apply"], ["sites"], ["diff"], ["revert"]])
def test_a_header_that_is_not_utf8_is_refused(command: list[str], tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    data = (tree / HEADER).read_bytes().replace(b"float acc = 0.f;", b"float acc = 0.f; // \xff", 1)
    (tree / HEADER).write_bytes(data)
    proc = run_cli(*command, "--tree", str(tree), cwd=tmp_path)
    assert_one_line_error(proc, 4, "is not UTF-8 (byte 0xff at line", "UTF-8 header only")
    assert (tree / HEADER).read_bytes() == data
