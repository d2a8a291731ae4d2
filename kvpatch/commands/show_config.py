"""``kvpatch config``: the effective configuration as a complete ``kvpatch.toml``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..config import Machine, PatchConfig, config_and_tuned, dump_config
from ..progress import QUIET, Progress


@dataclass
class ConfigOptions:
    config: Optional[Path] = None
    preset: Optional[str] = None


@dataclass(frozen=True)
class ConfigReport:
    config: PatchConfig
    tuned_on: Machine | None

    @property
    def toml(self) -> str:
        return dump_config(self.config, self.tuned_on)


def run(o: ConfigOptions, *, progress: Progress = QUIET) -> ConfigReport:
    return ConfigReport(*config_and_tuned(o.config, preset=o.preset))
