"""``kvpatch.toml``: reading and writing a configuration.

:func:`read_config_file` reads a file into :func:`~.make.make_config`'s options (one-line
errors for what TOML or kvpatch refuses), :func:`dump_config` writes what it reads back, and
:func:`config_and_tuned` layers the command line over a file.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .machine import Machine
from .make import make_config
from .model import DTYPES, SETTINGS, PatchConfig
from .settings import label

#: A kvpatch.toml is a few kB; a larger input is not one.
MAX_CONFIG_BYTES = 16 << 20


def load_config_file(path: Path) -> dict[str, Any]:
    """:func:`read_config_file`'s options (the ``[kvpatch.tuned]`` record checked and left out)."""
    return read_config_file(path)[0]


def read_config_file(path: Path) -> tuple[dict[str, Any], Machine | None]:
    """Read a ``kvpatch.toml``: keys at top level or under ``[kvpatch]`` (not both); '-' or '_';
    returns ``(options for make_config, the [kvpatch.tuned] machine record or None)``.

    Every problem is a :class:`UsageError` (exit 2) in one line: a missing, unreadable
    or non-UTF-8 file, a directory, invalid TOML, keys beside ``[kvpatch]``, and a key
    given twice in its two spellings (``cache-hint`` and ``cache_hint``).
    """
    from ..fsutil import read_text_input

    text = read_text_input(path, "config file", limit=MAX_CONFIG_BYTES)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"invalid TOML in {path}: {e}") from None
    except ValueError as e:  # e.g. an integer of thousands of digits
        raise UsageError(f"invalid TOML in {path}: {str(e).splitlines()[0][:100]}") from None
    except RecursionError:
        raise UsageError(f"invalid TOML in {path}: nested too deeply") from None
    if "kvpatch" in data:
        table = data["kvpatch"]
        if not isinstance(table, dict):
            raise UsageError(f"invalid config file {path}: [kvpatch] must be a table")
        beside = sorted(k for k in data if k != "kvpatch")
        if beside:
            raise UsageError(f"invalid config file {path}: key(s) {', '.join(beside)} outside [kvpatch] "
                             "(put every setting under [kvpatch], or use no [kvpatch] table)")  # fmt: skip
    else:
        table = data
    options = {
        _key(k, path): (_table(v, path, k) if isinstance(v, dict) else v) for k, v in _unique(table, path).items()
    }
    tuned = options.pop("tuned", None)
    _numbers_as_numbers(options, path)
    _no_empty_tables(options, path)
    return options, (None if tuned is None else Machine.from_dict(tuned, f"[kvpatch.tuned] in {path}"))


#: The integer settings, by name: in a file each is a TOML number (or ``"auto"`` where it takes that).
_INTEGERS = {s.name: s for s in SETTINGS if s.kind == "int"}


def _numbers_as_numbers(options: dict[str, Any], path: Path) -> None:
    """Refuse an integer setting written as a string (``lookahead = "2"``) at the top level, in
    a dtype's table or in a rule's: TOML has numbers, and a string there is a mistake the
    command line's parsing of text would otherwise hide."""
    tables = [("", options)] + [(f"[{d}] ", options[d]) for d in DTYPES if isinstance(options.get(d), dict)]
    rules = options.get("rules")
    if isinstance(rules, dict):
        tables += [(f"rule {sel!r}: ", t) for sel, t in rules.items() if isinstance(t, dict)]
    for where, table in tables:
        for key, value in table.items():
            s = _INTEGERS.get(_key(key, path))
            if s is not None and isinstance(value, str) and not (s.auto and value == "auto"):
                raise UsageError(f"invalid config file {path}: {where}{label(s.name)} = {value!r}: write the number "
                                 "without quotes" + (" (or \"auto\")" if s.auto else ""))  # fmt: skip


def _no_empty_tables(options: dict[str, Any], path: Path) -> None:
    """Refuse a rule's or a dtype's table with no settings (``"fp16/128/16/auto/v2" = {}``): read as
    none, it dropped the shipped rule without a word, where ``--rule SELECTOR=`` is refused."""
    rules = options.get("rules")
    tables = [(f"[{d}]", d, options[d]) for d in DTYPES if isinstance(options.get(d), dict)]
    if isinstance(rules, dict):
        tables += [(f"rule {sel!r}", sel, t) for sel, t in rules.items() if isinstance(t, dict)]
    for where, name, table in tables:
        if not table:
            raise UsageError(f"invalid config file {path}: {where} is an empty table: give settings, \"off\", or "
                             f"\"none\" to drop the table's rule for {name}")  # fmt: skip


def _key(key: Any, path: Path) -> str:
    return str(key).replace("-", "_")


def _unique(table: dict[str, Any], path: Path, where: str = "") -> dict[str, Any]:
    """``table``, refusing a key given in both spellings ('cache-hint' and 'cache_hint')."""
    seen: dict[str, str] = {}
    for key in table:
        norm = str(key).replace("-", "_")
        if norm in seen:
            raise UsageError(
                f"invalid config file {path}: {where}{seen[norm]!r} and {key!r} are the same setting; keep one"
            )
        seen[norm] = str(key)
    return table


def _table(value: dict[str, Any], path: Path, name: str) -> dict[str, Any]:
    if str(name) == "rules":  # rule selectors are kept as written; their settings are tables too
        return {str(a): (_table(b, path, f"rules.{a}") if isinstance(b, dict) else b) for a, b in value.items()}
    return {_key(a, path): b for a, b in _unique(value, path, f"[{name}] ").items()}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return _toml_string(str(value))


def dump_config(cfg: PatchConfig, tuned: Machine | None = None, *, sources: Any = None) -> str:
    """``kvpatch.toml`` text that :func:`read_config_file` reads back to ``(cfg, tuned)``;
    with ``sources`` (a :class:`~.layers.Resolved`), each line says where it came from."""
    settings = getattr(sources, "settings", {}) or {}
    rule_from = getattr(sources, "rules", {}) or {}

    def note(where: str | None) -> str:
        return f"  # {where}" if where else ""

    lines = ["[kvpatch]"]
    tables = []
    for key, value in cfg.to_toml_dict().items():
        if isinstance(value, dict):
            tables.append((key, value))
            continue
        where = settings.get(key) if key not in DTYPES else rule_from.get(key, "no rule" if sources else None)
        lines.append(f"{label(key)} = {_toml_value(value)}{note(where)}")
    for name, table in tables:
        lines.append("")
        lines.append(f"[kvpatch.{name}]" + note(rule_from.get(name) if name in DTYPES else None))
        if name == "rules":
            lines += [f'"{sel}" = {{ ' + ", ".join(f"{label(k)} = {_toml_value(v)}" for k, v in items.items())
                      + " }" + note(rule_from.get(sel)) for sel, items in table.items()]  # fmt: skip
            continue
        lines += [f"{label(k)} = {_toml_value(v)}" for k, v in table.items()]
    if tuned is not None:
        lines += ["", "[kvpatch.tuned]"] + [f"{k} = {_toml_string(v)}" for k, v in tuned.to_dict().items()]
    return "\n".join(lines) + "\n"


def _toml_string(value: str) -> str:
    """A TOML basic string in ASCII: quotes, backslashes, control characters and every character
    beyond ASCII escaped (``\\u00e9``), so that the file reads back the same whatever encoding the
    stream it went through had (``kvpatch config > f`` under ``LANG=C``)."""
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F or 0x80 <= ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        elif ord(ch) > 0xFFFF:
            out.append(f"\\U{ord(ch):08x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


#: The variants ``kvpatch bench`` names itself (stock, the tree's patch, the presets; the A/A
#: twin, ``stock-aa``, is no identifier).
RESERVED_VARIANTS = ("stock", "patched", "paper", "control")
#: A variant's name: part of C symbols and file names (ASCII letters, digits and '_', first a letter).
VARIANT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def check_variant_name(name: str) -> str:
    """``name`` if it can name a variant, else a one-line :class:`UsageError`."""
    if not VARIANT_NAME.fullmatch(name):
        raise UsageError(f"invalid variant name {name!r}: use ASCII letters, digits and '_', first a letter")
    return name


def variant_files(variant: list[str]) -> dict[str, Path]:
    """``--variant NAME=config.toml`` items -> {name: its file}, each name checked once."""
    files: dict[str, Path] = {}
    for item in variant:
        name, sep, path = item.partition("=")
        if not sep or not path:
            raise UsageError(f"invalid --variant {item!r}: use NAME=config.toml")
        from ..fsutil import folder_spelling

        if folder_spelling(path):
            raise UsageError(f"invalid --variant {item!r}: the file ends in '/', a folder's spelling: give a file")
        check_variant_name(name)
        if name in RESERVED_VARIANTS:
            raise UsageError(f"invalid --variant {item!r}: {name!r} is one of bench's own variants "
                             f"({', '.join(RESERVED_VARIANTS)}); pick another name")  # fmt: skip
        if name in files:
            raise UsageError(f"--variant {name} given twice")
        files[name] = Path(path)
    return files


def variant_configs(variant: list[str]) -> dict[str, PatchConfig]:
    """``--variant NAME=config.toml`` items -> {name: configuration}."""
    return {name: make_config(**load_config_file(path)) for name, path in variant_files(variant).items()}
