"""The configuration's input as the commands take it: values out of range or in odd digits,
bad config files, settings given twice or that would be ignored, rules that disagree about
the one call-form helper are each one line (exit 2) and nothing is written; a marker the
configuration cannot read back is no crash."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from conftest import HEADER, STOCK, fixture_text, make_tree


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--lookahead", str(2**29)], "at most 1024"),
        (["--lookahead", "9" * 5000], "--lookahead"),
        (["--align", str(2**64)], "at most 4096"),
        (["--size", "1048576"], "at most 1048560 bytes (cp.async.bulk.prefetch's limit)"),
        (["--size", "\u00b2"], "invalid size"),  # '2'.isdigit() but int() refuses it
        (["--rule", "fp16/\u00b2=off"], "head size"),
        (["--fp16", "lookahead=\u00b2"], "invalid lookahead"),
        (["--fp16", "lookahead=\u0663"], "invalid lookahead"),  # Arabic-Indic 3: not read as 3
        (["--fp16", "lookahead=2,lookahead=3"], "lookahead given twice"),
        (["--fp16", "lookahead=+-5"], "invalid lookahead '+-5': expected an integer"),
        (["--rule", "fp16/128/16=lookahead=-+5"], "invalid lookahead '-+5'"),
        (["--rule", "fp16/" + "9" * 5000 + "/16=off"], "head size"),
    ],
    ids=[
        "lookahead",
        "lookahead-5000-digits",
        "align",
        "size",
        "size-superscript",
        "rule-superscript",
        "setting-superscript",
        "setting-arabic-indic",
        "setting-twice",
        "sign-pair",
        "sign-pair-in-rule",
        "selector-5000-digits",
    ],
)
def test_out_of_range_values_are_refused(args: list[str], needle: str, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    proc = run_cli("apply", "--tree", str(tree), *args, cwd=tmp_path)
    assert_one_line_error(proc, 2, needle)
    assert (tree / HEADER).read_text() == fixture_text(STOCK) and not (tmp_path / ".kvpatch").exists()


@pytest.mark.slow  # applies (libclang)
def test_a_zero_padded_size_is_the_number(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text(STOCK))
    proc = run_cli("apply", "--tree", str(tree), "--size", "00000000000016", cwd=tmp_path)
    assert proc.returncode == 0 and "at most" not in proc.stderr, proc.stderr
    assert " size=16 " in (tree / HEADER).read_text()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "is a directory"),
        (b"lookahead = 2 # \xff\n", "is not UTF-8 (byte 0xff"),
        (b"lookahead = " + b"9" * 5000 + b"\n", "invalid TOML"),
        (b"lookahead = 2\n[kvpatch]\nsize = 64\n", "key(s) lookahead outside [kvpatch]"),
        (
            b'[kvpatch]\ncache-hint = "none"\ncache_hint = "evict_last"\n',
            "'cache-hint' and 'cache_hint' are the same setting",
        ),
        (b'[kvpatch.fp16]\nissue = "call"\n"issue" = "inline"\n', "invalid TOML"),
        (b'"[red]x[/]" = 1\n', "unknown configuration key(s): [red]x[/]"),
    ],
    ids=["directory", "not-utf8", "huge-int", "keys-beside-table", "both-spellings", "duplicate", "markup-in-key"],
)
def test_bad_config_files_are_one_line(content: bytes | None, needle: str, tmp_path: Path) -> None:
    path = tmp_path / "k.toml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    assert_one_line_error(run_cli("config", "--config", "k.toml", cwd=tmp_path), 2, "kvpatch config: ", needle)


def test_apply_refuses_what_would_be_ignored(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("apply", "--preset", "paper", "--min-group", "4", cwd=tmp_path), 2,
                          "--preset paper fixes min-group")  # fmt: skip
    assert_one_line_error(run_cli("apply", "--rule", "fp16/128/16/auto=off=false", cwd=tmp_path), 2,
                          "'off = false' alone changes nothing")  # fmt: skip


@pytest.mark.slow  # applies (libclang)
def test_a_marker_with_odd_digits_is_not_a_crash(tmp_path: Path) -> None:
    """A hand-made marker pair whose setting int() cannot read ('2' as a superscript)."""
    anchor = "  // Iterate over the key blocks"
    text = fixture_text(STOCK).replace(
        anchor, "  // kvpatch:begin key lookahead=\u00b2\n  // kvpatch:end key\n" + anchor, 1
    )
    tree = make_tree(tmp_path / "vllm", text)
    for command in (["sites"], ["diff"], ["revert"], ["apply"]):
        proc = run_cli(*command, "--tree", str(tree), cwd=tmp_path)
        assert "Traceback" not in proc.stderr and proc.returncode in (0, 2, 4), (command, proc.stderr)
    assert run_cli("revert", "--force", "--tree", str(tree), cwd=tmp_path).returncode == 0
    assert (tree / HEADER).read_text() == fixture_text(STOCK)


@pytest.mark.slow  # applies (libclang)
def test_shadowed_call_settings_do_not_block_the_live_ones(tmp_path: Path) -> None:
    """The one call-form helper takes the settings of a kernel that uses it: a rule's
    align=64 on the only live call-form kernel was refused because the dead base settings
    (align 16) also counted, while the reach warning called --align 64 dead."""
    from kvpatch.config import DEFAULT_OVERRIDES

    tree = make_tree(tmp_path / "vllm", fixture_text())
    # every kernel the default turns on, but one of its call-form kernels, which this test gives align=64
    live = [sel for sel, kv in DEFAULT_OVERRIDES if ("off", True) not in kv]
    mine = next(sel for sel, kv in DEFAULT_OVERRIDES if sel in live and ("issue", "call") in kv)
    off = [x for sel in live if sel != mine for x in ("--rule", f"{sel}=off")]
    proc = run_cli("apply", "--tree", str(tree), *off, "--rule", f"{mine}=align=64", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (tree / HEADER).read_text()
    helper = text[text.index("kvpatch_prefetch_l2(const void*") :]
    assert "& ~0x3fULL" in helper.split("}", 1)[0]  # align 64: the live kernel's
    other = "fp16/64/16/auto/v2" if mine != "fp16/64/16/auto/v2" else "bf16/64/16/auto/v1"
    proc = run_cli("apply", "--tree", str(tree), *off, "--rule", f"{mine}=align=64", "--rule",
                   f"{other}=align=32,issue=call", cwd=tmp_path)  # fmt: skip
    assert_one_line_error(proc, 2, "share one helper")  # two live call-form kernels that disagree: still refused


@pytest.mark.parametrize("command", ["config", "apply"])
def test_an_empty_value_from_an_unset_variable_is_refused_not_read_as_something(command, tmp_path):
    """``--rule "$SEL="`` would drop a shipped rule and ``--config "$CFG"`` would read the current
    directory: both are one line, exit 2, with nothing written."""
    proc = run_cli(command, "--rule", "fp16/128/16=", cwd=tmp_path)
    assert_one_line_error(proc, 2, "--rule 'fp16/128/16=' has no settings", "'fp16/128/16=none' to drop")
    proc = run_cli(command, "--config", "", cwd=tmp_path)
    assert_one_line_error(proc, 2, "--config is empty")
    for dtype in ("--fp16", "--bf16", "--fp32"):  # before: read as 'none', the dtype's shipped table dropped
        assert_one_line_error(run_cli(command, dtype, "", cwd=tmp_path), 2, "has no settings", "'none' to drop")
    (tmp_path / "rules.toml").write_text('[kvpatch.rules]\n"fp16/128" = ""\n')
    proc = run_cli(command, "--config", str(tmp_path / "rules.toml"), cwd=tmp_path)
    assert_one_line_error(proc, 2, "fp16/128 has no settings")
    # an empty table is an empty value too (before: read as 'none', the shipped rule dropped silently)
    for text, needle in (('[kvpatch.rules]\n"fp16/128/16/auto/v2" = {}\n', "rule 'fp16/128/16/auto/v2' is an empty table"),
                         ("[kvpatch]\nfp16 = {}\n", "[fp16] is an empty table"), ("[kvpatch.bf16]\n", "[bf16] is an empty table")):  # fmt: skip
        (tmp_path / "empty.toml").write_text(text)
        proc = run_cli(command, "--config", str(tmp_path / "empty.toml"), cwd=tmp_path)
        assert_one_line_error(proc, 2, needle, '"none" to drop')
    assert not (tmp_path / ".kvpatch").exists()  # no workspace, no state: nothing was applied


@pytest.mark.parametrize(
    ("file_rule", "cli"),
    [
        ('"fp16/128/*" = { lookahead = 7 }', ["--rule", "fp16/128=lookahead=5"]),
        ('"fp16/0128" = { lookahead = 7 }', ["--rule", "fp16/128=lookahead=5"]),
        ('"fp16" = { lookahead = 7 }', ["--fp16", "lookahead=5"]),
        ('"fp16/*" = { lookahead = 7 }', ["--rule", "fp16=lookahead=5"]),
    ],
    ids=["star", "zero-padded", "dtype-rule-vs---fp16", "dtype-star-vs-rule"],
)
def test_a_command_line_rule_is_stronger_than_the_files_however_either_is_spelled(file_rule, cli, tmp_path):
    """The command line's rule replaces the file's rule for the same kernels (before: 'given twice',
    exit 2, when the two were spelled differently); one file naming a selection twice is still
    refused."""
    (tmp_path / "k.toml").write_text(f"[kvpatch.rules]\n{file_rule}\n")
    proc = run_cli("config", "--config", str(tmp_path / "k.toml"), *cli, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "lookahead = 5" in proc.stdout and "lookahead = 7" not in proc.stdout
    (tmp_path / "twice.toml").write_text(
        '[kvpatch.rules]\n"fp16/128/*" = { lookahead = 7 }\n"fp16/0128" = { lookahead = 5 }\n'
    )
    assert_one_line_error(run_cli("config", "--config", str(tmp_path / "twice.toml"), cwd=tmp_path), 2, "given twice")


def test_the_python_api_refuses_what_is_not_text_with_a_kvpatch_error():
    """None or bytes where text is expected: a UsageError naming the argument, not an AttributeError."""
    from kvpatch.config import config_from_marker, make_config, parse_override, parse_rules
    from kvpatch.errors import UsageError
    from kvpatch.patch.header import patch

    with pytest.raises(UsageError, match="a rule's settings must be text"):
        parse_override(None)
    with pytest.raises(UsageError, match="a --rule must be text"):
        parse_rules([None])
    with pytest.raises(UsageError, match="a --rule must be text .*not bytes"):
        parse_rules([b"fp16=off"])
    with pytest.raises(UsageError, match="a configuration marker must be text"):
        config_from_marker(None)
    with pytest.raises(UsageError, match="the header must be text .*not bytes"):
        patch(b"//", "h.cuh", make_config())


def test_the_file_readers_and_the_arch_parser_refuse_what_is_no_path_or_no_text() -> None:
    """Before: read_config_file(None) was os.fspath's TypeError and parse_arch_list(None) an
    AttributeError. After: a UsageError naming the argument (every reader of a user's file goes
    through one check)."""
    from kvpatch.arch import parse_arch_list
    from kvpatch.config import load_config_file, read_config_file
    from kvpatch.errors import UsageError

    for read in (read_config_file, load_config_file):
        with pytest.raises(UsageError, match="config file must be a path .*not NoneType"):
            read(None)
    with pytest.raises(UsageError, match="the arch list must be text .*not bytes"):
        parse_arch_list(b"9.0a")


@pytest.mark.parametrize("text", [
    "rules=none", "inherit_rules=true", "inherit-rules=true", "fp16=off", "bf16=none", "fp32=x",
    "lookahead=1\tsize=auto",  # a tab: marker() writes single spaces
    "lookahead=1\u00a0size=auto",
    "lookahead=1\u2028size=auto",
])  # fmt: skip
def test_a_marker_holding_words_marker_never_writes_is_refused_as_one(text: str) -> None:
    """Before: the words make_config takes apart from the settings (rules, the dtypes) reached it
    twice, a TypeError (a hand-edited header's marker: a traceback from sites, diff, apply,
    revert); other blanks than one space passed. After: not a kvpatch marker."""
    from kvpatch.config import config_from_marker, make_config
    from kvpatch.errors import UsageError

    with pytest.raises(UsageError, match="not a kvpatch marker"):
        config_from_marker(text)
    cfg = make_config()
    assert config_from_marker(cfg.marker()) == cfg


def test_the_configurations_python_api_refuses_what_it_cannot_read_in_one_line() -> None:
    """Before: parse_rules(None) was a TypeError and parse_rules("fp16=off") read each character
    as a rule ('invalid --rule 'f''); make_config(size=<array>) was numpy's 'truth value is
    ambiguous' ValueError, and a numpy integer was no integer. After: a UsageError that says
    what to give, and a numpy integer is taken."""
    np = pytest.importorskip("numpy")
    from kvpatch.config import make_config, parse_rules
    from kvpatch.errors import UsageError

    for rules in (None, "fp16=off"):
        with pytest.raises(UsageError, match="the rules must be a list of SELECTOR=SETTINGS texts"):
            parse_rules(rules)
    assert parse_rules(["fp16=off"]) == {"fp16": "off"}
    with pytest.raises(UsageError, match="invalid size"):
        make_config(size=np.array([1, 2]))
    assert make_config(lookahead=np.int64(2)).lookahead == 2
    with pytest.raises(UsageError, match="invalid lookahead"):
        make_config(lookahead=np.bool_(True))
