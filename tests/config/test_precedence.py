"""The precedence of what a user gives over the shipped table, from the strongest: a rule the
user gives (``--rule``, then the config file's rules), a base setting the user gives (the
command line, then the config file) at the kernels the table leaves prefetching, the table's
rules, the base defaults. User rules are laid on the table's rules; at each kernel the most
specific user rule that selects it decides what it sets. A table rule that is off but groups
keeps its grouping when a user's rule turns the prefetch on there."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from kvpatch.config import OVERRIDABLE, PatchConfig, Selector, config_and_tuned, make_config, parse_override
from kvpatch.config.model import GROUPING


def _settings(cfg: PatchConfig) -> tuple:
    """What a rule decides of a kernel: off, or every setting a rule may set."""
    if cfg.off:
        return ("off",)
    return tuple((k, getattr(cfg, k)) for k in OVERRIDABLE if k != "off")


def _kernels(cfg: PatchConfig) -> dict[tuple, PatchConfig]:
    """What every kernel vLLM builds (fp8 caches too) gets."""
    return {kernel: c for kernel, _, c in replace(cfg, quantized="prefetch").kernel_variants()}


def _expected(rules: dict[str, str], **base) -> dict[tuple, tuple | None]:
    """The design, computed kernel by kernel from its parts: the table as the user's base
    settings leave it, and over it the most specific user rule that selects the kernel
    (None where two equally specific rules do: the configuration does not say)."""
    table = _kernels(make_config(**base))
    plain = replace(make_config(**base, inherit_rules=False, rules="none"), overrides=())
    parsed = {sel: (Selector.parse(sel), parse_override(text)) for sel, text in rules.items()}
    own = {s: make_config(**base, inherit_rules=False, rules={s: text}).for_selector(s) for s, text in rules.items()}
    out: dict[tuple, tuple | None] = {}
    for kernel, under in table.items():
        hits = [(s, sel, items) for s, (sel, items) in parsed.items() if sel.matches(*kernel)]
        if not hits:
            out[kernel] = _settings(under)
            continue
        top = max(sel.specificity for _, sel, _ in hits)
        best = [(s, items) for s, sel, items in hits if sel.specificity == top]
        if len(best) > 1:
            out[kernel] = None
            continue
        s, items = best[0]
        if items.get("off"):
            out[kernel] = ("off",)
            continue
        mine = own[s]
        # settings turn an 'off' kernel on, over the base; what the table's rule says of the
        # kernel's grouping (an off rule may group: no prefetch, the grouped form) it keeps
        start = under if not under.off else replace(plain, **{g: getattr(under, g) for g in GROUPING})
        out[kernel] = _settings(
            replace(start, **{k.replace("-", "_"): getattr(mine, k.replace("-", "_")) for k in items})
        )
    return out


def _check(rules: dict[str, str], **base) -> None:
    got = _kernels(make_config(**base, rules=rules))
    want = _expected(rules, **base)
    wrong = {k: (_settings(got[k]), w) for k, w in want.items() if w is not None and _settings(got[k]) != w}
    assert not wrong, f"{rules} {base}: {len(wrong)} kernels, e.g. {next(iter(wrong.items()))}"


# --------------------------------------------------------------------------- a user's rule


def test_a_rule_lays_its_settings_on_the_tuned_kernels_it_selects() -> None:
    """``--rule fp16/128=lookahead=3``: the tuned fp16 head-128 kernels keep every other tuned
    setting and take lookahead 3; the kernels the table leaves off are turned on, with the base
    settings and lookahead 3 (keeping the grouping an off rule of the table gives, e.g. fp16
    head 128 block 16 v1's grouped form at 4 CTAs per SM); no kernel outside the selector changes."""
    table = make_config()
    tuned = _kernels(table)
    cfg = make_config(rules={"fp16/128": "lookahead=3"})
    for kernel, c in _kernels(cfg).items():
        t = tuned[kernel]
        if kernel[:2] != ("fp16", 128):
            assert _settings(c) == _settings(t), kernel
        elif t.off:
            grouping = {g: getattr(t, g) for g in GROUPING}
            assert _settings(c) == _settings(replace(table, overrides=(), lookahead=3, **grouping)), kernel
        else:
            assert _settings(c) == _settings(replace(t, lookahead=3)), kernel
    tuned = cfg.resolve("fp16", 128, 32, "auto", "v1")
    assert (tuned.scope, tuned.min_group, tuned.lookahead) == ("kv-head-rotate", 2, 3)


def test_an_off_rule_turns_off_even_the_tuned_kernels() -> None:
    cfg = make_config(rules={"*/*/16": "off"})
    assert not any(
        cfg.prefetches(d, h, 16, "auto", k) for d in ("fp16", "bf16") for h in (64, 128, 256) for k in ("v1", "v2")
    )
    assert cfg.prefetches("fp16", 128, 32, "auto", "v1") and cfg.prefetches("bf16", 256, 16, "auto", "v1") is False


def test_the_most_specific_user_rule_decides_where_two_meet() -> None:
    """``*/*/16`` and the more specific ``fp16/64``, ``fp16/80`` (which the table has no rule for)
    and ``fp16/64/16``: at each kernel the most specific of the user's rules decides, whatever a
    less specific one of them says and wherever the table's rules put its selector."""
    cfg = make_config(rules={"*/*/16": "issue=inline", "fp16/80": "scope=kv-head", "fp16/64/16": "lookahead=3"})
    c = cfg.resolve("fp16", 80, 16, "auto", "v1")
    assert (c.off, c.issue, c.scope) == (False, "call", "kv-head")  # fp16/80 is more specific than */*/16
    c = cfg.resolve("fp16", 64, 16, "auto", "v2")  # the table has it off: fp16/64/16 turns it on, with its setting
    assert (c.off, c.issue, c.lookahead, c.scope) == (False, "call", 3, "cta")
    c = cfg.resolve("fp16", 64, 16, "auto", "v1")  # tuned: the table's settings, with lookahead 3 only
    assert (c.off, c.issue, c.lookahead, c.scope, c.read) == (False, "call", 3, "kv-head-rotate", "warp")
    c = cfg.resolve("fp16", 96, 16, "auto", "v1")  # only */*/16 selects it
    assert (c.off, c.issue, c.scope) == (False, "inline", "cta")
    c = cfg.resolve("fp16", 128, 16, "auto", "v2")  # only */*/16 selects it: over the tuned settings
    assert (c.off, c.issue, c.scope, c.min_group) == (False, "inline", "kv-head-rotate", 2)
    _check({"*/*/16": "issue=inline", "fp16/80": "scope=kv-head", "fp16/64/16": "lookahead=3"})


def test_a_less_specific_rule_does_not_undo_a_more_specific_one() -> None:
    """``*/64/16=off`` meets the table's fp16 rule at fp16/64/16, the selector of a more specific
    rule of the user's: that rule still decides there."""
    cfg = make_config(rules={"fp16/64": "issue=call", "*/64/16": "off", "fp16/64/16": "lookahead=3"})
    assert cfg.resolve("fp16", 64, 16).lookahead == 3 and not cfg.resolve("fp16", 64, 16).off
    assert not cfg.resolve("fp16", 64, 16, "auto", "v2").off
    assert cfg.resolve("bf16", 64, 16, "auto", "v1").off and cfg.resolve("bf16", 64, 16).off
    assert cfg.resolve("fp16", 64, 32, "auto", "v2").issue == "call"
    _check({"fp16/64": "issue=call", "*/64/16": "off", "fp16/64/16": "lookahead=3"})


def test_a_rule_that_drops_a_table_rule_leaves_none_of_its_settings() -> None:
    """``fp16/64/16/auto/v1=none`` drops the tuned rule: a broader rule of the user's then lays
    its settings on what is left there (the fp16 rule: off), not on the dropped one."""
    cfg = make_config(rules={"fp16/64/16/auto/v1": "none", "fp16/64": "issue=inline"})
    c = cfg.resolve("fp16", 64, 16, "auto", "v1")
    assert (c.off, c.issue, c.scope, c.min_group, c.read) == (False, "inline", "cta", 1, "lane")
    assert make_config(rules={"fp16/64/16/auto/v1": "none"}).resolve("fp16", 64, 16, "auto", "v1").off


def _random_rules(rng: random.Random) -> dict[str, str]:
    parts = (("fp16", "bf16", "fp32"), (64, 80, 128, 256), (16, 32), ("auto", "fp8"), ("v1", "v2"))
    settings = ("off", "issue=inline", "scope=kv-head", "lookahead=3", "read=warp,issue=split", "min-group=4",
                "scope=cta,lookahead=2", "none")  # fmt: skip
    rules: dict[str, str] = {}
    while len(rules) < rng.randint(2, 4):
        picked = [rng.choice(p) if rng.random() < 0.45 else "*" for p in parts]
        if all(p == "*" for p in picked[1:]):  # a dtype alone is the dtype's table, not a rule
            continue
        rules[str(Selector.parse("/".join(map(str, picked))))] = rng.choice(settings)
    return rules


@pytest.mark.parametrize("seed", range(24))
def test_every_kernel_gets_the_most_specific_user_rule_over_the_table(seed: int) -> None:
    rng = random.Random(seed)
    rules = _random_rules(rng)
    base = rng.choice([{}, {"lookahead": 2}, {"scope": "kv-head"}, {"issue": "inline"}])
    _check({s: v for s, v in rules.items() if v != "none"}, **base)


# --------------------------------------------------------------------------- a user's base setting


def test_a_base_setting_replaces_the_tables_value_where_it_prefetches() -> None:
    """``--lookahead 2``: every kernel the table leaves prefetching takes lookahead 2 (and keeps
    its other tuned settings); which kernels prefetch stays the table's."""
    table, cfg = _kernels(make_config()), make_config(lookahead=2)
    for kernel, c in _kernels(cfg).items():
        t = table[kernel]
        assert c.off == t.off, kernel
        if not t.off:
            assert _settings(c) == _settings(replace(t, lookahead=2)), kernel
    assert cfg.lookahead == 2


def test_a_users_rule_beats_a_users_base_setting() -> None:
    cfg = make_config(lookahead=2, rules={"fp16/128/16/auto/v2": "lookahead=4", "bf16/128": "scope=cta"})
    assert cfg.resolve("fp16", 128, 16, "auto", "v2").lookahead == 4
    c = cfg.resolve("bf16", 128, 16, "auto", "v1")
    assert (c.scope, c.lookahead, c.issue) == (
        "cta",
        2,
        "split",
    )  # the rule's scope, the base's lookahead, the table's issue
    assert cfg.resolve("fp16", 64, 16, "auto", "v1").lookahead == 2
    _check({"fp16/128/16/auto/v2": "lookahead=4", "bf16/128": "scope=cta"}, lookahead=2)


def test_the_command_line_beats_the_config_file(tmp_path: Path) -> None:
    """A base setting on the command line over the file's; ``--rule`` added to the file's rules,
    and of the same selector replacing it."""
    path = tmp_path / "kvpatch.toml"
    path.write_text('[kvpatch]\nlookahead = 3\nscope = "kv-head"\n\n[kvpatch.rules]\n'
                    '"fp16/128/16/auto/v1" = { issue = "inline" }\n"bf16/64" = { off = true }\n')  # fmt: skip
    cfg, _ = config_and_tuned(path, lookahead=2, rules={"bf16/64": "lookahead=5", "fp16/64/16/auto/v1": "off"})
    assert (cfg.lookahead, cfg.scope) == (2, "kv-head")
    assert cfg.resolve("fp16", 128, 16, "auto", "v1").issue == "inline"  # the file's rule, kept
    assert cfg.resolve("bf16", 64, 16, "auto", "v1").lookahead == 5  # the command line's, over the file's
    assert cfg.resolve("fp16", 64, 16, "auto", "v1").off
    assert cfg == make_config(lookahead=2, scope="kv-head", rules={
        "fp16/128/16/auto/v1": "issue=inline", "bf16/64": "lookahead=5", "fp16/64/16/auto/v1": "off"})  # fmt: skip


# --------------------------------------------------------------------------- in the generated text

_BASE_OPTIONS = [("lookahead", 3), ("scope", "cta"), ("issue", "call"), ("read", "lane"), ("min_group", 4),
                 ("size", 8192)]  # fmt: skip


@pytest.mark.parametrize("source", ["command line", "config file"])
@pytest.mark.parametrize(("name", "value"), _BASE_OPTIONS, ids=[n for n, _ in _BASE_OPTIONS])
def test_each_base_option_reaches_every_prefetching_kernel_of_the_patched_text(
    tmp_path: Path, source: str, name: str, value
) -> None:
    """``apply --NAME VALUE`` (or the same in kvpatch.toml) changes the generated header: the
    configuration the patched text carries gives that value at every kernel the shipped table
    leaves prefetching, and the same kernels prefetch as without it."""
    from conftest import FIXTURES, STOCK, fixture_text

    from kvpatch.config import config_from_marker
    from kvpatch.patch import inspect, patch

    if source == "command line":
        cfg = make_config(**{name: value})
    else:
        path = tmp_path / "kvpatch.toml"
        path.write_text(f"{name.replace('_', '-')} = {value!r}\n".replace("'", '"'), encoding="utf-8")
        cfg, _ = config_and_tuned(path)
    header = str(FIXTURES / STOCK)
    default = patch(fixture_text(), header, make_config()).patched
    text = patch(fixture_text(), header, cfg).patched
    assert text != default
    injected = inspect(text, header)
    assert injected.intact and len(injected.markers) == 1
    carried = config_from_marker(injected.markers[0])
    table, got = _kernels(make_config()), _kernels(carried)
    prefetching = [k for k, c in table.items() if not c.off]
    assert prefetching and all(not got[k].off for k in prefetching)
    assert all(getattr(got[k], name) == value for k in prefetching), name
    assert all(got[k].off for k, c in table.items() if c.off)


def test_the_tuned_values_a_base_setting_replaces_count_a_users_rule_of_the_same_selector() -> None:
    """Before: with a rule of the user's at a table rule's selector, the note 'replaces the tuned
    value at N kernels' left that selector out, though the base setting reaches it wherever the
    user's rule does not set it itself (``--lookahead 3 --rule bf16/64/16/auto/v1=read=warp``: 13
    of the 14 kernels said). After: counted as make_config lays them."""
    from kvpatch.config.make import table_overrides

    base = table_overrides(lookahead=3)["lookahead"][1]
    ruled = table_overrides(lookahead=3, rules={"bf16/64/16/auto/v1": "read=warp"})["lookahead"][1]
    assert sorted(ruled) == sorted(base) and "bf16/64/16/auto/v1" in ruled
    assert make_config(lookahead=3, rules={"bf16/64/16/auto/v1": "read=warp"}).resolve(
        "bf16", 64, 16, "auto", "v1").lookahead == 3  # fmt: skip
    # a rule that sets the setting itself, drops the table's rule or turns the kernel off keeps it
    own = table_overrides(lookahead=3, rules={"bf16/64/16/auto/v1": "lookahead=2"})["lookahead"][1]
    dropped = table_overrides(lookahead=3, rules={"bf16/64/16/auto/v1": "none"})["lookahead"][1]
    off = table_overrides(lookahead=3, rules={"bf16/64/16/auto/v1": "off"})["lookahead"][1]
    assert sorted(own) == sorted(dropped) == sorted(off) == sorted(set(base) - {"bf16/64/16/auto/v1"})
    assert make_config(lookahead=3, rules={"bf16/64/16/auto/v1": "off"}).resolve("bf16", 64, 16, "auto", "v1").off
    # the table's off rule a user's rule turns on takes a base setting of the grouped form as well
    assert table_overrides(group_v_loads="at-use", rules={"fp16/256/16/auto": "group-logits=global"}) == {
        "group_v_loads": ("at-use", ["fp16/256/16/auto"])
    }
