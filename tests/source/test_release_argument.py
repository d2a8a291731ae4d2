"""What ``--vllm`` may name: a release number (refused in one short line otherwise, exit 2),
inside the range of releases that carry the header (refused before any download, exit 3)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli


@pytest.mark.parametrize("vllm", ["0." + "1" * 5000, "v" + "0.10.2" * 50], ids=["5000-digits", "300-chars"])
def test_absurd_vllm_values_are_usage_errors(vllm: str, tmp_path: Path) -> None:
    line = assert_one_line_error(run_cli("apply", "--vllm", vllm, cwd=tmp_path), 2, "not a vLLM release number")
    assert len(line) < 150


def test_an_unsupported_release_is_refused_before_any_download(tmp_path: Path) -> None:
    env = {"PIP_INDEX_URL": "http://127.0.0.1:9/never-asked"}
    line = assert_one_line_error(run_cli("apply", "--vllm", "0.25.0", cwd=tmp_path, env=env), 3, "0.6.4 through 0.22.1")
    assert "git clone" not in line and not (tmp_path / "no-cache").exists() and not (tmp_path / ".kvpatch").exists()
