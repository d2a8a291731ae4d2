"""``kvpatch config``: the effective configuration as a complete ``kvpatch.toml``, each
setting with the layer it came from (:mod:`kvpatch.config.layers`); and the one place the
configuration options of ``apply`` and ``config`` are turned into a configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..config import dump_config, unreached
from ..config.layers import Resolved, resolve
from ..config.model import SETTINGS
from ..errors import UsageError
from ..progress import QUIET, Progress


@dataclass
class ConfigOptions:
    config: Optional[Path] = None  # a kvpatch.toml
    preset: Optional[str] = None
    #: settings of the table (kvpatch.config.model.SETTINGS) given on the command line, by name
    settings: dict[str, Any] = field(default_factory=dict)
    dtypes: dict[str, Optional[str]] = field(default_factory=dict)  # --fp16/--bf16/--fp32 text
    rules: list[str] = field(default_factory=list)  # --rule SELECTOR=SETTINGS
    untuned: bool = False  # start from the base settings everywhere: no shipped table


def configure(o: ConfigOptions) -> tuple[Resolved, list[str], list[str]]:
    """The options as a configuration with where it came from, the options given that change
    no kernel, and what the user's base settings replaced in the shipped table (pure but for
    reading ``--config``)."""
    from ..config import parse_rules

    rules = parse_rules(o.rules) if o.rules else None
    unknown = sorted(set(o.settings) - {s.name for s in SETTINGS})
    if unknown:
        raise UsageError(f"unknown setting(s): {', '.join(unknown)}")
    settings = {s.name: o.settings.get(s.name) for s in SETTINGS}
    r = resolve(o.config, preset=o.preset, rules=rules, inherit_rules=False if o.untuned else None,
                **{d: o.dtypes.get(d) for d in ("fp16", "bf16", "fp32")}, **settings)  # fmt: skip
    lines: list[str] = []
    if r.config.preset == "default":
        given = [k for k, v in settings.items() if v is not None]
        selectors = [*(rules or {}), *(d for d, v in o.dtypes.items() if v is not None)]
        user_rules = [str(s) for s in (rules or {})]
        lines = unreached(r.config, given, selectors, user_rules=user_rules)
    return r, lines, overridden_lines(r)


#: Query dtypes whose kernels nvcc compiles differently with inline asm in the key loop (the
#: loop is not unswitched on the ALiBi slope, which changes the rounding of the ALiBi term).
INLINE_CHANGES_FP = ("bf16", "fp32")


def overridden_lines(r: Resolved) -> list[str]:
    """One line per base setting that replaced the shipped table's value at some kernels, and
    one where the new ``issue`` puts those kernels' bit-identity with stock at risk."""
    out = []
    for key, (value, kernels) in r.replaced_kernels().items():
        if not kernels:
            continue
        shown = "auto" if value is None else str(value).lower() if isinstance(value, bool) else value
        out.append(
            f"{key.replace('_', '-')}={shown} replaces the tuned value at {len(kernels)} kernel{'s' * (len(kernels) != 1)}"
        )
        if key == "issue" and value == "inline":
            risky = [k for k in kernels if k[0] in INLINE_CHANGES_FP]
            if risky:
                out.append(f"warning: issue=inline replaces the tuned issue at {len(risky)} {'/'.join(INLINE_CHANGES_FP)} "
                           "kernels: inline asm changes how nvcc compiles their ALiBi term, so with ALiBi their outputs can "
                           "differ from stock's (check with 'kvpatch validate'; 'kvpatch build' warns per kernel)")  # fmt: skip
    return out


@dataclass(frozen=True)
class ConfigReport:
    resolved: Resolved
    unreached: tuple[str, ...] = ()
    overridden: tuple[str, ...] = ()

    @property
    def toml(self) -> str:
        return dump_config(self.resolved.config, self.resolved.tuned, sources=self.resolved)


def run(o: ConfigOptions, *, progress: Progress = QUIET) -> ConfigReport:
    resolved, lines, overridden = configure(o)
    for line in (*lines, *overridden):
        progress.say(line if line.startswith("warning:") else f"note: {line}")
    return ConfigReport(resolved, tuple(lines), tuple(overridden))
