"""``--json PATH`` is an output like any other: checked, before any work, against the files
kvpatch keeps (the tree's header, the state), the command's inputs and the plugin's bundle;
a refused one is one line, exit 2, with everything it names unchanged."""

from __future__ import annotations

from cli.cli_helpers import assert_one_line_error, run_cli
from conftest import HEADER


def test_apply_and_sites_never_write_their_report_over_the_header_the_state_or_the_config(applied, work):
    header = applied / HEADER
    state = work / ".kvpatch" / "state.json"
    config = work / "kvpatch.toml"
    config.write_text("lookahead = 2\n")
    before = {p: p.read_bytes() for p in (header, state, config)}
    cases = [
        (["apply", "--tree", str(applied), "--json", str(header)], "the tree's header"),
        (["apply", "--json", str(state)], "kvpatch's state directory"),
        (["apply", "--tree", str(applied), "--config", str(config), "--json", str(config)], "is --config"),
        (["sites", "--tree", str(applied), "--json", str(header)], "the tree's header"),
    ]
    for args, why in cases:
        assert_one_line_error(run_cli(*args, cwd=work), 2, why)
    assert {p: p.read_bytes() for p in before} == before


def test_an_unwritable_report_is_refused_before_the_work(applied, work, monkeypatch):
    """apply patches nothing and build compiles nothing when --json cannot be written."""
    from kvpatch import jit

    monkeypatch.setattr(jit, "build", lambda *a, **k: (_ for _ in ()).throw(AssertionError("compiled")))
    header = applied / HEADER
    before = header.read_bytes()
    assert_one_line_error(run_cli("apply", "--tree", str(applied), "--lookahead", "2", "--json", "/proc/kvpatch/x",
                                  cwd=work), 2, "--json")  # fmt: skip
    assert header.read_bytes() == before
    assert_one_line_error(run_cli("build", "--json", "/proc/kvpatch/x", cwd=work), 2, "--json")


def test_plugin_enable_never_writes_its_report_into_the_bundle(applied, work, tmp_path):
    bundle = tmp_path / "bundle"
    assert_one_line_error(run_cli("plugin", "enable", "--dir", str(bundle), "--json", str(bundle / "bundle.json"),
                                  cwd=work), 2, "the plugin's bundle")  # fmt: skip
    assert not bundle.exists()
