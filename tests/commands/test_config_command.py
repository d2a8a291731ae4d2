"""``kvpatch config``: the effective configuration as a complete kvpatch.toml, each setting with
where it came from; what it prints is a file ``--config`` reads back to the same configuration."""

from __future__ import annotations

import tomllib
from pathlib import Path

from cli.cli_helpers import run_cli

from kvpatch.config import load_config_file, make_config


def _setting_lines(toml: str) -> dict[str, str]:
    """``key = value  # source`` lines of the [kvpatch] table -> {key: the line}."""
    table = toml.split("\n\n", 1)[0].splitlines()
    assert table[0] == "[kvpatch]"
    return {line.split(" = ", 1)[0]: line for line in table[1:]}


def test_config_prints_the_default_with_where_each_setting_came_from(tmp_path: Path) -> None:
    proc = run_cli("config", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith('[kvpatch]\npreset = "default"  # default\nlookahead = 1  # default\n')
    data = tomllib.loads(proc.stdout)
    assert "rules" in data["kvpatch"] and "tuned" in data["kvpatch"]  # the shipped table, and where it was tuned
    assert all(line.endswith("# shipped table") or "# shipped table (" in line
               for line in proc.stdout.split("[kvpatch.rules]\n", 1)[1].split("\n\n", 1)[0].splitlines())  # fmt: skip


def test_config_names_the_command_line_and_the_file(tmp_path: Path) -> None:
    (tmp_path / "k.toml").write_text('lookahead = 3\ncache-hint = "evict_last"\n')
    proc = run_cli("config", "--config", "k.toml", "--lookahead", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = _setting_lines(proc.stdout)
    assert lines["lookahead"] == "lookahead = 2  # command line"
    assert lines["cache-hint"] == 'cache-hint = "evict_last"  # config file'
    assert lines["scope"] == 'scope = "cta"  # default'
    # the table's rules took the user's lookahead, and say so
    assert "lookahead changed by your settings" in proc.stdout
    # a rule's change is named as users write the setting
    ruled = run_cli("config", "--rule", "fp16/128=group-half-below=3", cwd=tmp_path)
    assert "(group-half-below changed by rule fp16/128)" in ruled.stdout, ruled.stdout
    assert proc.stderr.startswith("note: lookahead=2 replaces the tuned value at ")


def test_what_config_prints_reads_back_to_the_same_configuration(tmp_path: Path) -> None:
    from kvpatch.commands import configuration as C

    cases = [({}, []), ({"settings": {"lookahead": 2, "scope": "kv-head"}}, ["--lookahead", "2", "--scope", "kv-head"]),
             ({"preset": "paper"}, ["--preset", "paper"]),
             ({"untuned": True, "settings": {"issue": "inline"}}, ["--untuned", "--issue", "inline"]),
             ({"rules": ["bf16/128/16/auto/v1=off"], "dtypes": {"fp16": "issue=inline"}},
              ["--rule", "bf16/128/16/auto/v1=off", "--fp16", "issue=inline"])]  # fmt: skip
    seen = set()
    for opts, args in cases:
        expected = C.run(C.ConfigOptions(**opts)).resolved.config
        proc = run_cli("config", *args, cwd=tmp_path)
        assert proc.returncode == 0, (args, proc.stderr)
        (tmp_path / "printed.toml").write_text(proc.stdout)
        assert make_config(**load_config_file(tmp_path / "printed.toml")) == expected, args
        again = run_cli("config", "--config", "printed.toml", cwd=tmp_path)  # printed from the file: the same
        assert again.returncode == 0, (args, again.stderr)
        (tmp_path / "again.toml").write_text(again.stdout)
        assert make_config(**load_config_file(tmp_path / "again.toml")) == expected, args
        seen.add(expected.marker())
    assert len(seen) == len(cases)  # five different configurations


def test_a_config_file_with_a_bom_is_read(tmp_path: Path) -> None:
    (tmp_path / "k.toml").write_bytes(b"\xef\xbb\xbflookahead = 3\n")
    proc = run_cli("config", "--config", "k.toml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _setting_lines(proc.stdout)["lookahead"] == "lookahead = 3  # config file"
