"""``--variant-info`` for validate and bench with ``--lib``: each entry names a ``--lib`` library,
its marker is text, and what kvpatch measures of a library itself (path, size, sha256) never comes
from the file. Refused in one line (exit 2) before the GPU is looked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli

from kvpatch.commands.common import prebuilt


@pytest.mark.parametrize("command", ["validate", "bench"])
@pytest.mark.parametrize(
    ("info", "needle"),
    [
        ({"patched": 5}, "its marker 5 is no text"),
        ({"patched": {"marker": None}}, "its marker None is no text"),
        ({"patched": {"marker": "x", "compile_flags": [], "sha256": "0" * 64}}, "gives sha256: what kvpatch measures"),
        ({"patched": {"marker": "x", "so": "/elsewhere.so", "bytes": 1}}, "gives bytes, so: what kvpatch measures"),
        ({"nope": "x"}, "'nope' is no --lib library (patched, stock)"),
    ],
)
def test_a_damaged_variant_info_is_refused_before_the_gpu(
    tmp_path: Path, command: str, info: dict, needle: str
) -> None:
    (tmp_path / "s.so").write_bytes(b"s")
    (tmp_path / "p.so").write_bytes(b"p")
    (tmp_path / "vi.json").write_text(json.dumps(info))
    proc = run_cli(
        command, "--lib", "stock=s.so:a", "--lib", "patched=p.so:b", "--variant-info", "vi.json", cwd=tmp_path
    )
    assert_one_line_error(proc, 2, needle)


def test_the_measured_facts_are_the_librarys_own(tmp_path: Path) -> None:
    (tmp_path / "s.so").write_bytes(b"stock")
    (tmp_path / "vi.json").write_text(json.dumps({"stock": {"marker": "stock", "compile_flags": ["-O3"]}}))
    libs = prebuilt([f"stock={tmp_path / 's.so'}:a"], tmp_path / "vi.json", loader=lambda specs: {})
    info = libs.info["stock"]
    assert info["bytes"] == 5 and info["so"] == str(tmp_path / "s.so") and info["compile_flags"] == ["-O3"]
