"""What a setting of the patch is, and what every part of kvpatch does with one.

The settings themselves are the fields of :class:`~.model.PatchConfig` declared with
:func:`setting`: that class body is the one table of them (name, default, words or bounds,
help, marker word, rules, tuning, the paper preset). :func:`table` reads it into
:class:`Setting` records, and everything that handles a setting reads those: the value
checks of :func:`~.make.make_config` (:func:`check`), the marker (:func:`marker_words`, read
back by :mod:`.marker`), ``kvpatch.toml``, the options of ``apply`` and ``config`` (one per
setting, built by the CLI), the rules, and ``kvpatch tune``'s grid and candidate names.
"""

from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass, field, fields
from typing import Any, Iterable

from ..abi import exact_int
from ..errors import UsageError

#: ``paper=FREE``: ``--preset paper`` leaves the setting to the user (it is in the paper's marker).
FREE = "free"
#: ``paper``'s default: ``--preset paper`` fixes the setting at its default.
_DEFAULT = "default"


def label(name: str) -> str:
    """A setting's field name as users write it, in kvpatch.toml and as an option: ``min-group``."""
    return name.replace("_", "-")


@dataclass(frozen=True)
class Tune:
    """That ``kvpatch tune`` may vary a setting (a ``--grid`` key), and how."""

    #: Its place among the tuned settings: in the grid's order and in a candidate's name.
    rank: int
    #: Its part of a candidate's name: ``{}`` is the value without '-' (``la{}``: ``la2``).
    tag: str = "{}"
    #: The values the default grid tries (none: the default grid leaves it at its default).
    values: tuple[Any, ...] = ()
    #: Named in every candidate's name; else only where the value is not the default (so a
    #: new tuned setting leaves the names of every candidate without it as they were).
    always: bool = False


@dataclass(frozen=True)
class Setting:
    """One setting of the patch: a :class:`~.model.PatchConfig` field, as :func:`setting` declared it."""

    name: str  # the field, and the kvpatch.toml key ('-' or '_')
    default: Any
    #: The command-line option's help (``apply`` and ``config``: ``--name-with-dashes``).
    help: str
    #: The option's metavar; '' is the words joined by '|', or ``N``.
    metavar: str = ""
    #: A word setting's words (a setting with words is a word; with a bool default, a switch;
    #: else an integer).
    choices: tuple[str, ...] = ()
    #: An integer's bounds, each said in the error that refuses a value beyond it.
    low: int | None = None
    high: int | None = None
    #: Why ``high`` (said with it; a value below ``low`` is then "must be >= low"); none: a value
    #: outside is "must be low..high".
    why: str = ""
    #: What an integer counts, in messages ("bytes").
    unit: str = ""
    #: An integer that must be a positive multiple of this (0: any), or a power of two.
    multiple: int = 0
    power_of_two: bool = False
    #: An integer that may also be ``auto`` (held as None).
    auto: bool = False
    #: Its word in the marker ('': the name with '-'). The marker writes ``word=value`` where the
    #: value is not the default (``marked``: always), then a switch's word where it is on.
    marker: str = ""
    marked: bool = False
    #: Whether a rule (``--rule``, ``--fp16``, a table in kvpatch.toml) may set it per kernel.
    rule: bool = False
    #: Whether ``kvpatch tune`` may vary it (None: it may not).
    tune: Tune | None = None
    #: What ``--preset paper`` fixes it at (FREE: the user's choice; the default: its default).
    paper: Any = _DEFAULT
    #: Opt-in, for kvpatch's own use: no command-line option, and kvpatch.toml names it only when set.
    hidden: bool = False
    #: A setting of the grouped form (an ``off`` rule may still give it): "all" where every grouped
    #: kernel reads it (``group`` itself, which decides which kernels take the form, among them),
    #: "v1" where only grouped v1 launches do; "" for the prefetch's own settings.
    grouped: str = ""

    def __post_init__(self) -> None:
        """A table entry that cannot work is refused when the table is read (at import)."""
        if self.kind == "word" and self.default not in self.choices:
            raise ValueError(f"setting {self.name}: default {self.default!r} is not one of its words")
        if self.kind == "int" and (self.low is None or self.high is None):
            raise ValueError(f"setting {self.name}: an integer needs low and high")
        if self.kind != "int" and (self.low, self.high, self.auto) != (None, None, False):
            raise ValueError(f"setting {self.name}: only an integer has bounds")
        if self.grouped not in ("", "all", "v1"):
            raise ValueError(f"setting {self.name}: grouped is '', 'all' or 'v1'")
        for value in (self.default, *((self.paper,) if self.paper not in (FREE, _DEFAULT) else ()),
                      *(self.tune.values if self.tune else ())):  # fmt: skip
            if value is not None or not self.auto:
                check(self, value)

    @property
    def kind(self) -> str:
        """``bool`` (a switch), ``word`` (one of ``choices``) or ``int``."""
        return "bool" if isinstance(self.default, bool) else "word" if self.choices else "int"

    @property
    def label(self) -> str:
        """Its name as users write it: ``min-group``."""
        return label(self.name)

    @property
    def word(self) -> str:
        return self.marker or self.label

    @property
    def shown_metavar(self) -> str:
        return self.metavar or ("|".join(self.choices) if self.kind == "word" else "N")

    @property
    def paper_value(self) -> Any:
        """What ``--preset paper`` fixes it at (FREE: nothing)."""
        return self.default if self.paper == _DEFAULT else self.paper


def setting(default: Any, help: str, **spec: Any) -> Any:
    """A :class:`~.model.PatchConfig` field that is a setting: its default and its
    :class:`Setting` (the other arguments)."""
    return field(default=default, metadata={"setting": dict(help=help, **spec)})


def table(cls: type) -> tuple[Setting, ...]:
    """The settings among ``cls``'s fields, in their order."""
    return tuple(Setting(f.name, f.default, **f.metadata["setting"]) for f in fields(cls) if "setting" in f.metadata)


def check(s: Setting, value: Any) -> Any:
    """``value`` (from the command line, a kvpatch.toml, a rule or a marker) as the setting holds
    it, or a :class:`UsageError` in one line that names the setting and what it takes."""
    if s.kind == "bool":
        if not isinstance(value, bool):
            raise UsageError(f"invalid {s.label} {short(value)}: expected true or false")
        return value
    if s.kind == "word":
        # spaces around a word are dropped, as around a number ('ahead ' is ahead, ' 2' is 2)
        if not isinstance(value, str) or value.strip() not in s.choices:
            raise UsageError(f"invalid {s.label} {short(value)}: choose one of {', '.join(s.choices)}")
        return value.strip()
    if s.auto and (value is None or (isinstance(value, str) and value.strip() == "auto")):
        return None
    unit = f" {s.unit}" if s.unit else ""
    over = f"at most {s.high}{unit}" + (f" ({s.why})" if s.why else "")
    n = _integer(s, value, over)
    if s.power_of_two and (n < s.low or n & (n - 1)):
        raise UsageError(f"invalid {s.label} {short(n)}: must be a power of two >= {s.low}")
    if s.multiple and (n < s.low or n % s.multiple):
        raise UsageError(f"invalid {s.label} {short(n)}: must be a positive multiple of {s.multiple}{unit}")
    if s.why and n < s.low:
        raise UsageError(f"invalid {s.label} {short(n)}: must be >= {s.low}")
    if not s.why and not s.low <= n <= s.high:
        raise UsageError(f"invalid {s.label} {short(n)}: must be {s.low}..{s.high}")
    if n > s.high:
        raise UsageError(f"invalid {s.label} {short(n)}: {over}")
    return n


def _integer(s: Setting, value: Any, over: str) -> int:
    """An int, or a string of one (one sign at most: '+-5' is no number); floats (2.5, and
    2.0 too) and bools are refused; messages name the setting as users write it (``min-ctas``)."""
    n = exact_int(value)  # an int, a numpy or torch integer too; never a bool
    if n is not None:
        return n
    text = value.strip() if isinstance(value, str) else ""
    digits = text[1:] if text[:1] in ("+", "-") and not s.auto else text  # 'auto' or bytes: no sign
    if isinstance(value, str) and ascii_digits(digits):
        if len(digits.lstrip("0")) > 12:  # no bound here is anywhere near 12 digits
            raise UsageError(f"invalid {s.label} {short(value)}: {over}")
        return int(text)
    what = f"use 'auto' or a number of {s.unit or 'units'}" if s.auto else "expected an integer"
    raise UsageError(f"invalid {s.label} {short(value)}: {what}")


def marker_words(settings: Iterable[Setting], cfg: Any) -> list[str]:
    """The marker's words for ``settings`` of ``cfg``: ``word=value`` for each that is not its
    default (or is ``marked``), in table order, then the word of each switch that is on."""
    settings = tuple(settings)
    valued = [f"{s.word}={as_text(getattr(cfg, s.name))}" for s in settings
              if s.kind != "bool" and (s.marked or getattr(cfg, s.name) != s.default)]  # fmt: skip
    return valued + [s.word for s in settings if s.kind == "bool" and getattr(cfg, s.name)]


def as_text(value: Any) -> str:
    """A value as the marker writes it (None: ``auto``; bools ``true``/``false``)."""
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def ascii_digits(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also takes '²' (which int() refuses) and '٣' (which
    it reads as 3)."""
    return text.isascii() and text.isdigit()


def whole_number(text: str) -> int:
    """``'16'`` or ``'-3'`` -> an int; anything else int() would also take (``'+5'``, ``'1_000'``,
    ``'٣'``, spaces inside) is a ValueError: a count on a command line is written in ASCII digits."""
    digits = text[1:] if text.startswith("-") else text
    if not ascii_digits(digits):
        raise ValueError(f"not a whole number: {text!r}")
    return int(text)


def decimal_number(text: str) -> float:
    """``'2.5'`` or ``'-1'`` -> a float: ASCII digits with one '.' at most, a leading '-' at most;
    anything else float() would also take (``'1_0'``, ``'١٠'``, ``'1e3'``, spaces inside) is a
    ValueError, but for the words nan and inf, which the option's range check names."""
    if text.lower().lstrip("+-") in ("nan", "inf", "infinity"):
        return float(text)
    digits = text[1:] if text.startswith("-") else text
    if not (digits.count(".") <= 1 and ascii_digits(digits.replace(".", "", 1))):
        raise ValueError(f"not a decimal number: {text!r}")
    return float(text)


def check_seconds(value: float, option: str) -> float:
    """A duration option's value (``--budget``, a timeout): more than 0 and finite, else a
    :class:`UsageError` naming ``option`` and the value (nan and inf included)."""
    if not (value > 0 and math.isfinite(value)):
        raise UsageError(f"{option} must be > 0 seconds, not {value:g}")
    return value


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 40, 40


def short(value: Any) -> str:
    """``repr(value)``, cut to fit one line (a value may be thousands of characters, or
    nested thousands deep)."""
    text = (
        _REPR.repr(value)
        if not isinstance(value, int) or value.bit_length() < 64
        else f"{str(value)[:12]}... ({len(str(value))} digits)"
    )
    return text if len(text) <= 40 else text[:37] + "..."
