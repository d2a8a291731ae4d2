"""The one table of settings (``PatchConfig``'s fields declared with ``setting``, read as
``SETTINGS``): every setting in it is taken by the command line of ``apply`` and ``config``,
checked by its own bounds there, in a kvpatch.toml and in a rule, written into the marker and
read back, and (where the table says so) varied by ``kvpatch tune``. A setting added to the
table that one of these places does not see fails here."""

from __future__ import annotations

import re
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli

from kvpatch.config import config_from_marker, dump_config, make_config, read_config_file
from kvpatch.config.model import GROUPING, OVERRIDABLE, SETTINGS, V1_ONLY, PatchConfig
from kvpatch.config.settings import Setting, as_text, check
from kvpatch.errors import UsageError
from kvpatch.tune import GRID, GRID_KEYS, candidates, parse_grid
from kvpatch.tune.grid import candidate_name

SHOWN = [s for s in SETTINGS if not s.hidden]
RULED = [s for s in SETTINGS if s.rule]
TUNED = [s for s in SETTINGS if s.tune is not None]
INTS = [s for s in SETTINGS if s.kind == "int"]
NAMES = {s.name: s for s in SETTINGS}


def sample(s: Setting) -> Any:
    """A value the setting takes that is not its default."""
    if s.kind == "bool":
        return not s.default
    if s.kind == "word":
        return next(c for c in s.choices if c != s.default)
    for n in (s.low, s.low + 1, s.low * 2, s.high):
        try:
            if check(s, n) != s.default:
                return n
        except UsageError:
            continue
    raise AssertionError(f"no value of {s.name} but its default")


def refused(s: Setting) -> list[Any]:
    """Values the setting's entry refuses."""
    if s.kind == "bool":
        return ["yes", 1]
    if s.kind == "word":
        return ["bogus", s.default.upper() + "x"]
    return [s.low - 1, s.high + 1, "x", 2.5]


def cli_words(s: Setting, value: Any) -> list[str]:
    if s.kind == "bool":
        return [f"--{s.label}" if value else f"--no-{s.label}"]
    return [f"--{s.label}", as_text(value)]


def test_every_field_is_a_setting_of_the_table_but_the_preset_the_off_switch_and_the_rules() -> None:
    assert {f.name for f in fields(PatchConfig)} - set(NAMES) == {"preset", "off", "overrides"}
    assert [s.name for s in SETTINGS] == [f.name for f in fields(PatchConfig) if f.name in NAMES]
    assert OVERRIDABLE == (*(s.name for s in RULED), "off")


def test_only_weight_tail_is_left_off_the_command_line() -> None:
    """A hidden setting has no option; which ones are is a decision, pinned here."""
    assert {s.name for s in SETTINGS if s.hidden} == {"weight_tail"}


def test_each_entry_has_help_and_a_default_within_its_bounds() -> None:
    for s in SETTINGS:
        assert s.help.strip() and s.help.endswith(".")
        if s.kind == "int":
            assert s.low <= (s.default if s.default is not None else s.low) <= s.high


def test_a_grouped_form_setting_says_so_in_its_help_and_which_kernels_read_it() -> None:
    """The table's ``grouped`` is what --help tells users: "group > 1" (and "v1 only") in exactly
    the grouped form's settings other than ``group`` itself."""
    for s in SETTINGS:
        assert ("group > 1" in s.help) == (bool(s.grouped) and s.name != "group"), s.name
        assert ("v1 only" in s.help) == (s.grouped == "v1"), s.name
    assert GROUPING[0] == "group" and set(V1_ONLY) < set(GROUPING)


@pytest.mark.parametrize("command", ["apply", "config"])
def test_the_help_of_apply_and_config_lists_every_setting(command: str, tmp_path: Path) -> None:
    result = run_cli(command, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # each option's entry: its line and the lines wrapped under it, compared without whitespace
    entries = ["".join(e.split()) for e in re.split(r"\n(?=  -)", result.stdout)]
    for s in SHOWN:
        flag = f"--{s.label}/--no-{s.label}" if s.kind == "bool" else f"--{s.label}{s.shown_metavar}"
        entry = [e for e in entries if e.startswith(flag)]
        assert len(entry) == 1 and entry[0].endswith("".join(s.help.split())), (s.name, entry)
    for s in SETTINGS:
        if s.hidden:
            assert f"--{s.label}" not in result.stdout


def test_apply_and_config_have_the_same_options(tmp_path: Path) -> None:
    def options(command: str) -> list[str]:
        return re.findall(r"^  (--[a-z0-9-]+)", run_cli(command, "--help", cwd=tmp_path).stdout, re.M)

    apply_only = {"--vllm", "--tree", "--remote", "--force", "--force-write", "--json"}
    assert [o for o in options("apply") if o not in apply_only] == options("config")


@pytest.mark.parametrize("s", SHOWN, ids=lambda s: s.name)
def test_config_takes_each_setting_from_the_command_line(s: Setting, tmp_path: Path) -> None:
    value = sample(s)
    result = run_cli("config", "--untuned", *cli_words(s, value), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    shown = "true" if value is True else "false" if value is False else f'"{value}"' if s.kind == "word" else value
    assert f"\n{s.label} = {shown}  # command line\n" in result.stdout


@pytest.mark.parametrize("s", SHOWN, ids=lambda s: s.name)
def test_apply_hands_each_setting_to_the_configuration(s: Setting, monkeypatch, tmp_path: Path) -> None:
    from kvpatch.commands import apply as A

    seen = {}

    def stop(opts, **_):
        seen.update(opts.settings)
        raise UsageError("stopped before the tree")

    monkeypatch.setattr(A, "run", stop)
    value = sample(s)
    assert_one_line_error(run_cli("apply", "--untuned", *cli_words(s, value), cwd=tmp_path), 2, "stopped before")
    assert set(seen) == {x.name for x in SHOWN} and check(s, seen[s.name]) == value
    assert all(v is None for k, v in seen.items() if k != s.name)


@pytest.mark.parametrize("s", INTS, ids=lambda s: s.name)
def test_the_command_line_refuses_an_integer_beyond_the_tables_bounds(s: Setting, tmp_path: Path) -> None:
    for command in ("config", "apply"):
        for value in (s.low - 1, s.high + 1):
            line = assert_one_line_error(run_cli(command, "--untuned", f"--{s.label}", str(value), cwd=tmp_path), 2)
            assert re.search(rf"invalid ({s.label}|{s.name}) {value}:", line), line
        if s.rule:
            rule = f"fp16/128/16={s.label}={s.high + 1}"
            line = assert_one_line_error(run_cli(command, "--untuned", "--rule", rule, cwd=tmp_path), 2)
            assert re.search(rf"invalid ({s.label}|{s.name}) {s.high + 1}:", line), line


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)
def test_each_setting_is_checked_by_its_entry(s: Setting) -> None:
    """Everything the entry refuses, make_config refuses (one line, exit 2, naming the setting),
    from the base settings and from a rule; its bounds and words themselves are taken."""
    for value in refused(s):
        tries = [{"inherit_rules": False, s.name: value}]
        if s.rule:
            tries.append({"inherit_rules": False, "rules": {"fp16/128/16": {s.name: value}}})
        for options in tries:
            with pytest.raises(UsageError) as info:
                make_config(**options)
            message = str(info.value)
            assert info.value.exit_code == 2 and "\n" not in message and len(message) < 200
            assert re.match(rf"invalid ({s.label}|{s.name}) ", message), message
    accepted = [*s.choices] if s.kind == "word" else [True, False] if s.kind == "bool" else [s.low, s.high]
    for value in accepted:
        assert getattr(make_config(inherit_rules=False, **{s.name: value}), s.name) == value


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)
def test_each_setting_goes_through_the_marker_and_kvpatch_toml(s: Setting, tmp_path: Path) -> None:
    base = make_config(inherit_rules=False)
    cfg = make_config(inherit_rules=False, **{s.name: sample(s)})
    assert getattr(cfg, s.name) == sample(s) and cfg.marker() != base.marker()
    assert config_from_marker(cfg.marker()) == cfg
    (tmp_path / "kvpatch.toml").write_text(dump_config(cfg))
    assert make_config(**read_config_file(tmp_path / "kvpatch.toml")[0]) == cfg
    assert (s.name in cfg.to_toml_dict()) and (s.name in base.to_toml_dict()) != s.hidden


@pytest.mark.parametrize("s", RULED, ids=lambda s: s.name)
def test_each_rule_setting_goes_through_a_rule_and_its_marker(s: Setting) -> None:
    # inline, so the rule's kernels need not share the call helper's align and hint with the base
    inline = {"issue": "inline"} if s.name not in ("issue", "min_kv_mib") else {}
    cfg = make_config(inherit_rules=False, rules={"fp16/128/16": {s.name: sample(s), **inline}})
    assert getattr(cfg.resolve("fp16", 128, 16), s.name) == sample(s)
    assert getattr(cfg.resolve("bf16", 128, 16), s.name) == s.default
    assert config_from_marker(cfg.marker()) == cfg


def test_a_setting_no_rule_may_set_is_refused_in_a_rule() -> None:
    for s in SETTINGS:
        if not s.rule:
            with pytest.raises(UsageError, match="cannot override"):
                make_config(rules={"fp16/128/16": {s.name: sample(s)}})


def test_the_paper_preset_fixes_every_setting_it_does_not_leave_free() -> None:
    paper = make_config(preset="paper")
    for s in SETTINGS:
        if s.paper == "free":
            assert config_from_marker(make_config(preset="paper", **{s.name: sample(s)}).marker()).preset == "paper"
        else:
            assert getattr(paper, s.name) == s.paper_value
            said = f"--preset paper takes no {s.label}" if s.hidden else f"--preset paper fixes {s.label}"
            with pytest.raises(UsageError, match=said):
                make_config(preset="paper", **{s.name: next(v for v in (sample(s), s.default) if v != s.paper_value)})


def test_the_tune_grid_is_the_tables(tmp_path: Path) -> None:
    assert GRID_KEYS == tuple(s.name for s in sorted(TUNED, key=lambda s: s.tune.rank))
    assert GRID == tuple((s.name, s.tune.values) for s in sorted(TUNED, key=lambda s: s.tune.rank) if s.tune.values)
    assert len({s.tune.rank for s in TUNED}) == len(TUNED)
    keys = f"keys {', '.join(s.label for s in sorted(TUNED, key=lambda s: s.tune.rank))};"
    assert "".join(keys.split()) in "".join(run_cli("tune", "--help", cwd=tmp_path).stdout.split())


@pytest.mark.parametrize("s", TUNED, ids=lambda s: s.name)
def test_tune_varies_each_tuned_setting_and_names_its_candidates_apart(s: Setting) -> None:
    default = check(s, s.default) if s.default is not None else None
    grid = parse_grid(f"{s.label}={as_text(default)},{as_text(sample(s))}")
    assert dict(grid)[s.name] == (default, sample(s))
    base = replace(make_config(inherit_rules=False), issue="call")  # every setting pairs with the call form
    assert candidate_name(replace(base, **{s.name: sample(s)})) != candidate_name(base)
    built = candidates(base, [tuple((k, ("call",) if k == "issue" != s.name else v) for k, v in grid)])
    assert {getattr(c, s.name) for c in built.values()} == {default, sample(s)}


def test_the_default_candidates_keep_their_names() -> None:
    """Names are in saved tune JSONs and --exclude patterns: the table must not change them."""
    assert sorted(candidates()) == sorted(
        f"{i}_{sc}_la{la}" for i in ("inline", "call", "split") for sc in ("cta", "kvhead") for la in (1, 2)
    )
    assert candidate_name(make_config(inherit_rules=False, min_group=2, min_ctas=64, min_kv_mib=8, read="warp")) == (
        "call_cta_la1_mg2_ctas64_kv8_warp"
    )
