"""Where each setting of a configuration comes from: the layers a user's input is laid on.

From the strongest: a rule the user gives (``--rule``, then the config file's rules); a base
setting the user gives (the command line, then the config file), which applies to every
kernel the shipped table leaves prefetching; the shipped table's rules; the base defaults.
:func:`resolve` makes the configuration (:func:`~.make.make_config` holds the rules) and
says, per base setting and per rule, which layer it came from, and what the user's base
settings replaced in the shipped table (``apply`` reports it, ``kvpatch config`` prints it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .defaults import DEFAULT_OVERRIDES, DEFAULT_TUNED_ON
from .machine import Machine
from .make import make_config, table_overrides
from .model import DTYPES, OVERRIDABLE, PatchConfig, Selector
from .settings import label

COMMAND_LINE, CONFIG_FILE, TABLE, DEFAULT = "command line", "config file", "shipped table", "default"


@dataclass(frozen=True)
class Resolved:
    """A configuration and where its settings came from."""

    config: PatchConfig
    tuned: Machine | None  # where its rules were tuned (None: unknown)
    #: base setting -> COMMAND_LINE / CONFIG_FILE / DEFAULT (or 'preset paper')
    settings: dict[str, str] = field(default_factory=dict)
    #: rule selector -> where the rule comes from, in words
    rules: dict[str, str] = field(default_factory=dict)
    #: setting -> (the user's value, the table rules whose value it replaced)
    replaced: dict[str, tuple[Any, list[str]]] = field(default_factory=dict)

    def replaced_kernels(self) -> dict[str, tuple[Any, list[tuple[str, int, int, str, str]]]]:
        """``replaced`` by kernel: setting -> (value, the kernels vLLM builds that took a
        replaced table value)."""
        taken = {}
        for kernel, sel, _ in self.config.kernel_variants():
            taken.setdefault(sel, []).append(kernel)
        return {k: (v, [kern for sel in sels for kern in taken.get(sel, [])]) for k, (v, sels) in self.replaced.items()}


def resolve(config_file: Path | None, **options: Any) -> Resolved:
    """A config file's values with the command line's over them (``--rule``s added to the
    file's rules, ``untuned`` dropping the shipped table), made into a configuration."""
    from .toml import read_config_file

    values, tuned = read_config_file(config_file) if config_file else ({}, None)
    file_values = dict(values)
    given = {k: v for k, v in options.items() if v is not None}
    cli_rules = _by_selector(given["rules"]) if isinstance(given.get("rules"), dict) else {}
    cli_dtypes = {d for d in DTYPES if d in given or d in cli_rules}
    for d in cli_dtypes:  # a dtype's table on the command line (--fp16, --rule fp16=...) replaces the file's
        values.pop(d, None)
    if isinstance(values.get("rules"), dict):  # each rule by what it selects, however it is spelled
        values["rules"] = {k: v for k, v in _by_selector(values["rules"]).items() if k not in cli_dtypes}
        if cli_rules:
            given["rules"] = {**values["rules"], **cli_rules}  # --rule adds to the file's rules, over them
    values.update(given)
    cfg = make_config(**values)
    inherits = cfg.preset == "default" and values.get("inherit_rules", True) is True
    own_rules = "rules" in file_values or any(d in file_values for d in DTYPES)
    if inherits and tuned is None and not own_rules:  # no file, or one that keeps the shipped table's rules
        tuned = DEFAULT_TUNED_ON
    if cfg.preset != "default":
        tuned = None
    return Resolved(cfg, tuned, _setting_sources(cfg, given, file_values),
                    _rule_sources(cfg, options, file_values, inherits),
                    table_overrides(**values) if inherits else {})  # fmt: skip


def _by_selector(rules: dict[str, Any]) -> dict[str, Any]:
    """Rules keyed by what they select (``fp16/128/*`` and ``fp16/0128`` are ``fp16/128``); one
    layer naming a selection twice is a one-line error."""
    out: dict[str, Any] = {}
    for k, v in rules.items():
        key = str(Selector.parse(k))
        if key in out:
            raise UsageError(f"rule {key} given twice")
        out[key] = v
    return out


def _setting_sources(cfg: PatchConfig, cli: dict[str, Any], file_values: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key in cfg.to_toml_dict():
        if key in (*DTYPES, "rules", "inherit_rules"):
            continue
        if key in cli:
            out[key] = COMMAND_LINE
        elif key in file_values:
            out[key] = CONFIG_FILE
        else:
            out[key] = "preset paper" if cfg.preset == "paper" and key != "preset" else DEFAULT
    return out


def _rule_sources(cfg: PatchConfig, cli: dict[str, Any], file_values: dict[str, Any], inherits: bool) -> dict[str, str]:
    cli_rules = {str(Selector.parse(s)) for s in (cli.get("rules") or {})} | {
        d for d in DTYPES if cli.get(d) is not None
    }
    file_rules = {
        str(Selector.parse(s))
        for s in (file_values.get("rules") or {} if isinstance(file_values.get("rules"), dict) else {})
    }
    file_rules |= {d for d in DTYPES if file_values.get(d) is not None}
    table = dict(DEFAULT_OVERRIDES) if inherits else {}
    user = sorted({s for s in (*cli_rules, *file_rules) if s not in DTYPES})
    out = {}
    for sel, items in cfg.overrides:
        if sel in cli_rules:
            where = "--rule" if sel not in DTYPES else f"--{sel}"
        elif sel in file_rules:
            where = CONFIG_FILE
        elif sel in table:
            where = TABLE
        else:
            where = "where a rule of yours meets the shipped table"
        if sel in table and table[sel] != items:
            changed = [label(k) for k in OVERRIDABLE if dict(table[sel]).get(k) != dict(items).get(k)]
            over = [
                u for u in user if u != sel and Selector.parse(u).intersect(Selector.parse(sel)) == Selector.parse(sel)
            ]
            where += (
                f" ({', '.join(changed)} changed"
                + (f" by rule {', '.join(sorted(over))}" if over else " by your settings")
                + ")"
            )
        out[sel] = where
    return out


def config_and_tuned(config_file: Path | None, **options) -> tuple[PatchConfig, Machine | None]:
    """A config file's values overridden by the options given on the command line (``--rule``s
    added to the file's rules), and where its rules were tuned: the file's
    ``[kvpatch.tuned]``; without it, the shipped default's machine where the shipped table is
    inherited and the file adds no rules of its own; None when unknown (a file with rules of its
    own and no record, the paper preset)."""
    r = resolve(config_file, **options)
    return r.config, r.tuned
