"""From user input to a :class:`~.model.PatchConfig`: every way a configuration reaches
kvpatch (CLI options, ``--preset``, a ``kvpatch.toml``) ends in :func:`make_config`, so
the rules live in one place."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..errors import UsageError, text_argument
from .defaults import DEFAULT_OVERRIDES
from .model import DTYPES, GROUPING, OVERRIDABLE, PAPER, PRESETS, SETTINGS, PatchConfig, Selector
from .settings import check, label, short


def make_config(**options: Any) -> PatchConfig:
    """Validate options (``None`` = not given) into a :class:`PatchConfig`.

    Each setting is checked by its entry in the table (:func:`~.settings.check`); then what
    settings require of each other. ``preset='paper'`` fixes the settings the paper's
    mechanism has (:data:`~.model.PAPER`); giving any of those explicitly alongside it, at
    another value, is an error rather than a silent override.
    """
    known = {"preset", *(s.name for s in SETTINGS), *DTYPES, "rules", "inherit_rules"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(f"unknown configuration key(s): {', '.join(map(_key, unknown))}")
    given = {k: v for k, v in options.items() if v is not None}
    preset = given.get("preset", "default")
    if preset not in PRESETS:
        raise UsageError(f"invalid preset {short(preset)}: choose one of {', '.join(PRESETS)}")
    cfg = replace(PatchConfig(), **{s.name: check(s, given[s.name]) for s in SETTINGS if s.name in given})
    if cfg.size is not None and cfg.align > cfg.size:
        raise UsageError(
            f"invalid align {cfg.align}: larger than size {cfg.size}, the rounded-down window could miss the tile"
        )
    if cfg.min_kv_mib and cfg.issue != "call" and preset != "paper":
        raise UsageError(
            f"min-kv-mib {cfg.min_kv_mib} needs issue=call (its test is in the call helper), not issue={cfg.issue}"
        )
    if preset == "paper":
        own = [s.label for s in SETTINGS if s.hidden and s.name in given and getattr(cfg, s.name) != s.paper_value]
        if own:  # kvpatch's own opt-in additions: the paper's mechanism has none
            raise UsageError(f"--preset paper takes no {', '.join(own)}")
        clash = sorted(k for k, fixed in PAPER.items() if k in given and getattr(cfg, k) != fixed)
        if clash:
            raise UsageError(f"--preset paper fixes {_spelled(clash)}; drop those options")
        if any(d in given for d in (*DTYPES, "rules", "inherit_rules")):
            raise UsageError("--preset paper takes no per-dtype settings or rules")
        return replace(cfg, preset="paper", overrides=(), **PAPER)
    return replace(cfg, overrides=_overrides(cfg, given))


def parse_override(text: str) -> dict[str, Any]:
    """``'scope=kv-head,issue=inline'`` (the CLI form) -> a dict; ``'none'`` -> {}; ``'off'`` -> {'off': True}."""
    if text_argument(text, "a rule's settings").strip() in ("", "none"):
        return {}
    out: dict[str, Any] = {}
    for item in text.split(","):
        if item.strip() == "off":
            out["off"] = True
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"invalid per-dtype setting {item!r}: use key=value[,key=value...] or off")
        value = value.strip()
        name = key.strip().replace("-", "_")
        if name in out:
            raise UsageError(f"invalid per-dtype setting {text!r}: {key.strip()} given twice")
        out[name] = {"true": True, "false": False}.get(value, value)
    return out


def parse_rules(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``['bf16/80/32=off', 'fp16/64=issue=call']`` (repeated ``--rule``) -> {selector: settings}."""
    if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple)):
        raise UsageError(f"the rules must be a list of SELECTOR=SETTINGS texts, not {type(items).__name__} "
                         "(one rule: ['fp16/64=off'])")  # fmt: skip
    out: dict[str, str] = {}
    for item in items:
        selector, sep, settings = text_argument(item, "a --rule").partition("=")
        if not sep or not selector.strip():
            raise UsageError(
                f"invalid --rule {item!r}: use SELECTOR=SETTINGS, e.g. bf16/80/32=off or fp16/64=issue=call"
            )
        key = str(Selector.parse(selector))
        if not settings.strip():
            raise UsageError(f"--rule {item!r} has no settings (an unset shell variable?): give settings, 'off', "
                             f"or '{key}=none' to drop the table's rule")  # fmt: skip
        if key in out:
            raise UsageError(f"--rule {key} given twice")
        out[key] = settings
    return out


def _spelled(names: Any) -> str:
    """Setting names as users write them, joined: ``lookahead, min-group``."""
    return ", ".join(map(label, names))


def _key(name: str) -> str:
    """A key kvpatch does not know, as users write keys (``look-ahead``); quoted where spaces or
    unprintable characters would otherwise not show (``'group-v-loads '``)."""
    shown = label(name)
    return shown if shown.isprintable() and shown.strip() == shown and shown else repr(shown)


def _rule_settings(name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, str) and not value.strip():  # never 'none': that drops the shipped table's rule
        raise UsageError(f"{name} has no settings (an unset shell variable?): give settings, 'off', or 'none' to drop "
                         "the table's rule")  # fmt: skip
    if isinstance(value, str):
        value = parse_override(value)
    if not isinstance(value, dict):
        raise UsageError(f"invalid {name} settings {value!r}: a table of {_spelled(OVERRIDABLE)}, 'off' or 'none'")
    value = {str(k).replace("-", "_"): v for k, v in value.items()}
    bad = sorted(set(value) - set(OVERRIDABLE))
    if bad:
        raise UsageError(f"{name} cannot override {', '.join(map(_key, bad))} (only {_spelled(OVERRIDABLE)})")
    if "off" in value and value["off"] is not True:
        if value["off"] is not False:
            raise UsageError(f"invalid {name} off {value['off']!r}: expected true")
        if len(value) == 1:
            raise UsageError(f"{name}: 'off = false' alone changes nothing; give the settings that turn these "
                             "kernels on (e.g. issue = \"call\"), or 'none' to drop the rule")  # fmt: skip
        del value["off"]
    if value.get("off") and set(value) - {"off", *GROUPING}:
        raise UsageError(f"{name}: 'off' takes no other settings but the grouped form's ({_spelled(GROUPING)}; "
                         "off is about the prefetch, and the grouped form runs without one)")  # fmt: skip
    return value


def _requested(given: dict[str, Any]) -> tuple[bool, dict[str, Any], bool]:
    """(whether the shipped table is inherited, the user's rules and per-dtype tables by
    selector, whether ``rules = "none"`` drops the table's non-dtype rules)."""
    inherit = given.get("inherit_rules", True)
    if not isinstance(inherit, bool):
        raise UsageError(f"invalid inherit-rules {inherit!r}: expected true or false")
    requested: dict[str, Any] = {d: given[d] for d in DTYPES if d in given}
    rules = given.get("rules")
    drop = False
    if rules is not None:
        if rules == "none":  # drop every default rule that is not a dtype's own table
            drop = True
        elif isinstance(rules, dict):
            for selector, value in rules.items():
                key = str(Selector.parse(selector))
                if key in requested:
                    raise UsageError(f"rule {key} given twice")
                requested[key] = value
        else:
            raise UsageError(f"invalid rules {rules!r}: a table of selector = settings, or 'none'")
    return inherit, requested, drop


def _table(base: PatchConfig, given: dict[str, Any], inherit: bool, requested: dict[str, Any],
           drop: bool) -> tuple[dict[str, tuple], dict[str, tuple[Any, list[str]]]]:  # fmt: skip
    """The shipped table as this configuration inherits it (none without ``inherit``), and
    what the user's base settings replaced in it: ``{setting: (value, [selectors])}``.

    A base setting the user gives applies to every kernel the table leaves prefetching: in
    each inherited rule that is not ``off`` and not replaced by a rule of the user's, the
    table's value of that setting gives way to the user's (a rule the user gives keeps its
    own: it is stronger); in an ``off`` rule only its grouping does (``group = 1`` ungroups
    every kernel). Which kernels prefetch at all stays the table's."""
    if not inherit:
        return {}, {}
    table = {k: v for k, v in DEFAULT_OVERRIDES if not drop or k in DTYPES}
    user = {k: getattr(base, k) for k in OVERRIDABLE if k != "off" and given.get(k) is not None}
    replaced: dict[str, tuple[Any, list[str]]] = {}
    for sel, items in list(table.items()):
        if sel in requested:
            continue
        yields = GROUPING if dict(items).get("off") else tuple(user)
        mine = {k: user[k] for k in yields if k in user}
        for k, v in items:
            if k in mine and mine[k] != v:
                replaced.setdefault(k, (mine[k], []))[1].append(sel)
        table[sel] = tuple((k, mine.get(k, v)) for k, v in items)
    return table, replaced


def _layer(under: tuple, over: tuple) -> tuple:
    """Rule settings ``over`` laid on ``under``: ``over``'s values win; ``off`` in ``over`` is
    off, settings in ``over`` turn an ``off`` rule on."""
    top = dict(over)
    if top.get("off"):
        return _ordered(top)
    merged = {k: v for k, v in under if k != "off"}  # of an off rule: only its grouping, if any
    merged.update(top)
    return _ordered(merged)


def _ordered(settings: dict[str, Any]) -> tuple:
    return tuple((k, settings[k]) for k in OVERRIDABLE if k in settings)


def table_overrides(**options: Any) -> dict[str, tuple[Any, list[str]]]:
    """What the base settings among ``options`` (as :func:`make_config` takes them) replace in
    the shipped table: ``{setting: (value, [rule selectors])}``; validated as make_config does."""
    cfg = make_config(**options)
    given = {k: v for k, v in options.items() if v is not None}
    if cfg.preset == "paper":
        return {}
    inherit, requested, drop = _requested(given)
    # as _overrides lays them (_layer): the base setting on every table rule, then the user's rule of
    # the same selector over it, which keeps what it sets itself; 'none' drops the table's rule, and
    # an 'off' rule of the user's keeps nothing of it
    _, replaced = _table(replace(cfg, overrides=()), given, inherit, {}, drop)
    own = {k: set(_rule_settings(k, v)) for k, v in requested.items()}
    out: dict[str, tuple[Any, list[str]]] = {}
    for setting, (value, selectors) in replaced.items():
        kept = [sel for sel in selectors if sel not in own or (own[sel] and not own[sel] & {setting, "off"})]
        if kept:
            out[setting] = (value, kept)
    return out


def _meetings(user: dict[str, tuple | None], table: dict[str, tuple]) -> dict[str, tuple]:
    """The rules where the user's rules meet the table's: a user's rule wins at every kernel
    it selects, also where a more specific table rule decides, and the most specific user rule
    that selects a kernel decides there (a less specific one never undoes it).

    Every selector where user rules and table rules meet (an intersection of one or more of
    each, other than a user's own selector) gets a rule: the most specific user rule holding it
    laid on the most specific table rule holding it. A kernel takes the most specific rule that
    selects it, which is then the intersection of every rule that selects it: that pair's rule."""
    mine = {Selector.parse(k): items for k, items in user.items() if items is not None and k not in DTYPES}
    theirs = {Selector.parse(k): items for k, items in table.items()}
    met = {m.intersect(t) for m in mine for t in theirs} - {None}
    todo = list(met)
    while todo:
        here = todo.pop()
        for other in (*mine, *theirs):
            inter = here.intersect(other)
            if inter is not None and inter not in met:
                met.add(inter)
                todo.append(inter)

    def strongest(rules: dict[Selector, tuple], where: Selector) -> Selector | None:
        """The most specific rule holding ``where`` (of two as specific: the one resolve tries first)."""
        return min(
            (r for r in rules if r.intersect(where) == where), key=lambda r: (-r.specificity, str(r)), default=None
        )

    out = {}
    for where in met - set(mine):  # a user's own selector is laid on the table's rule of that selector
        under = strongest(theirs, where)
        out[str(where)] = _layer(theirs[under] if under is not None else (), mine[strongest(mine, where)])
    return out


def _overrides(base: PatchConfig, given: dict[str, Any]) -> tuple:
    """Validated rules, in this precedence (the strongest first): a rule the user gives (at
    every kernel it selects, setting by setting: a more specific rule of the shipped table
    within it takes the user's values of what the user's rule sets, and is turned on by it; where
    two rules of the user's select a kernel, the more specific decides: :func:`_meetings`);
    a base setting the user gives (:func:`_table`); the shipped table's rules (none with
    ``inherit_rules`` false: a complete table, as :meth:`PatchConfig.to_toml_dict` writes
    it); the base defaults. A per-dtype table (``--fp16``, or a rule that names only a dtype)
    is the settings of that dtype's kernels no other rule names, as before."""
    inherit, requested, drop = _requested(given)
    table, _ = _table(base, given, inherit, {}, drop)
    plain = {**base.to_toml_dict(), **{d: "none" for d in DTYPES}, "rules": "none", "inherit_rules": False}
    user: dict[str, tuple | None] = {}
    for key, value in requested.items():
        settings = _rule_settings(key, value)
        if not settings:
            user[key] = None  # 'none': the table's rule of this selector is dropped
        else:  # validate the values the way the base ones are, then keep the normalised values
            effective = make_config(**{**plain, **{k: v for k, v in settings.items() if k != "off"}})
            user[key] = _ordered({k: True if k == "off" else getattr(effective, k) for k in settings})
    result = dict(table)
    for key, items in user.items():
        if items is None:
            result.pop(key, None)
        else:
            result[key] = _layer(table.get(key, ()), items)
    result.update(_meetings(user, {k: v for k, v in table.items() if user.get(k, ()) is not None}))
    overrides = tuple(sorted(result.items()))
    live = replace(base, overrides=overrides).live_variants()
    gated = [
        f"{sel or 'the base'} (issue={c.issue})" for sel, c in live if c.min_kv_mib and c.issue != "call" and not c.off
    ]
    if gated:
        raise UsageError(f"min-kv-mib needs issue=call (its test is in the call helper), but {', '.join(gated[:3])}"
                         + (f" and {len(gated) - 3} more" if len(gated) > 3 else "") + " would inherit it: give those "
                         "rules min-kv-mib=0, or set it only in call rules")  # fmt: skip
    callers = {
        (c.align, c.cache_hint) for _, c in live if c.issue == "call" and not c.off
    }  # fmt: skip (shadowed settings reach no kernel: not counted)
    if len(callers) > 1:
        raise UsageError("the kernels that use issue=call share one helper: give them the same align and cache-hint")
    return overrides
