"""``kvpatch tune --lib``: its options (the libraries' names, their configurations from
``--variant-info``, ``--arch``) are checked before the GPU is looked for: one line, exit 2,
also on a machine without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli

from kvpatch.errors import BuildError
from kvpatch.tune import candidates


@pytest.fixture
def gpu_looked_for(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The GPU check, counted and failing as on a machine without one (exit 5), on every machine."""
    calls: list[str] = []

    def require_cuda() -> None:
        calls.append("require_cuda")
        raise BuildError("no GPU (the test's)")

    monkeypatch.setattr("kvpatch.gpu.env.require_cuda", require_cuda)
    return calls


@pytest.fixture
def libs(tmp_path: Path) -> Path:
    """A working directory with a library file (never loaded) and --variant-info files: one
    naming candidate 'b' by its marker, one whose marker does not parse."""
    (tmp_path / "fake.so").write_bytes(b"")
    (tmp_path / "vi.json").write_text(json.dumps({"b": candidates()["call_cta_la1"].marker()}))
    (tmp_path / "bad-vi.json").write_text(json.dumps({"b": "issue=sideways"}))
    return tmp_path


@pytest.mark.parametrize("args, needle", [
    (["--lib", "a=fake.so:p", "--lib", "b=fake.so:q"], "one library must be named 'stock'"),
    (["--lib", "stock=fake.so:p", "--lib", "b=fake.so:q"], "no configuration for 'b' ("),
    (["--lib", "stock=fake.so:p", "--lib", "b=fake.so:q", "--variant-info", "bad-vi.json"],
     "no configuration for 'b' ("),
    (["--lib", "stock=fake.so:p"], "give stock and at least one candidate"),
    (["--lib", "stock=fake.so:p", "--lib", "b=fake.so:q", "--variant-info", "vi.json", "--arch", "garbage"],
     "invalid arch 'garbage'"),
    (["--lib", "stock=fake.so:p", "--lib", "b=fake.so:q", "--variant-info", "vi.json", "--arch", "5.0"],
     "invalid arch '5.0'"),
])  # fmt: skip
def test_tune_checks_its_lib_options_before_looking_for_the_gpu(libs: Path, gpu_looked_for: list, args: list,
                                                                 needle: str) -> None:  # fmt: skip
    """Before: these were checked after the GPU was: exit 5 (no GPU) where a one-line exit 2 was
    due, as bench-decode says. After: exit 2, the GPU never looked for."""
    assert_one_line_error(run_cli("tune", *args, cwd=libs), 2, needle)
    assert gpu_looked_for == []


def test_valid_lib_options_get_as_far_as_the_gpu(libs: Path, gpu_looked_for: list) -> None:
    args = ["--lib", "stock=fake.so:p", "--lib", "b=fake.so:q", "--variant-info", "vi.json", "--arch", "9.0a"]
    assert_one_line_error(run_cli("tune", *args, cwd=libs), 5, "no GPU (the test's)")
    assert gpu_looked_for == ["require_cuda"]
