"""Every command's ``--help`` prints: help text holds brackets ('dtype[/head[/block...]]'),
which rich once read as markup and crashed on (it did for apply's --rule)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cli.cli_helpers import ROOT
from typer.testing import CliRunner

from kvpatch.cli import app


def _commands() -> list[str]:
    """Every command, ``plugin enable`` and the other subcommands included."""

    def name(c) -> str:
        return c.name or c.callback.__name__.replace("_", "-")

    top = [name(c) for c in app.registered_commands]
    subs = [f"{g.name} {name(c)}" for g in app.registered_groups for c in g.typer_instance.registered_commands]
    return sorted(top + subs)


def test_the_commands_are_all_there() -> None:
    names = _commands()
    for expected in ("apply", "sites", "diff", "revert", "config", "build", "validate", "bench", "tune", "bench-decode",
                     "plugin enable", "plugin disable", "plugin status", "plugin check"):  # fmt: skip
        assert expected in names


@pytest.mark.parametrize("command", _commands())
def test_every_commands_help_renders(command: str) -> None:
    result = CliRunner().invoke(app, [*command.split(), "--help"], env={"COLUMNS": "250"}, catch_exceptions=True)
    assert result.exit_code == 0 and result.exception is None, (result.output[-1500:], result.exception)
    assert "Usage" in result.output
    if command == "apply":
        assert "dtype[/head[/block[/kv[/kernel]]]]" in result.output


def test_the_top_level_help_lists_the_exit_codes() -> None:
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0 and "Exit codes: 0 ok, 2 bad parameters" in result.output


@pytest.mark.slow  # a new interpreter
def test_python_m_kvpatch_prints_help() -> None:
    proc = subprocess.run([sys.executable, "-m", "kvpatch", "apply", "--help"], capture_output=True, text=True, cwd=ROOT,
                          env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"}, timeout=120)  # fmt: skip
    assert proc.returncode == 0 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-1500:]
    assert "dtype[/head[/block[/kv[/kernel]]]]" in proc.stdout
