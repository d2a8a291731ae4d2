"""The machine a configuration was tuned on, and how this one differs from it.

``kvpatch tune`` records a :class:`Machine` (GPU, driver, nvcc, the compile flags and
arch of the kernels it timed) in the ``[kvpatch.tuned]`` table of the file it writes;
the shipped default carries the H200 it was tuned on (:data:`kvpatch.config.DEFAULT_TUNED_ON`).
``kvpatch apply`` compares that record with this machine's (read at the edge, by
:func:`kvpatch.commands.common.local_machine`) and warns on every fact that is known on
both sides and differs (:func:`differences`): a tuned table is only as good as the
machine it was measured on. Everything here is pure.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..errors import UsageError

#: What a record holds, in the order it is shown; every field is compared.
FIELDS = ("gpu", "driver", "nvcc", "arch", "flags")


@dataclass(frozen=True)
class Machine:
    """Facts about a machine; ``None`` where unknown (e.g. no GPU visible)."""

    gpu: str | None = None  # "NVIDIA H200"
    driver: str | None = None  # "580.159.04"
    nvcc: str | None = None  # "13.0.88"
    arch: str | None = None  # "sm_90a": what the timed kernels were compiled for
    flags: str | None = None  # the nvcc flags of the timed kernels, space-separated
    #: when and where (free text, not compared): e.g. "2026-11-30, vLLM 0.10.2, tuning set"
    note: str | None = None

    def to_dict(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Any, where: str = "[kvpatch.tuned]") -> Machine:
        if not isinstance(data, dict):
            raise UsageError(f"invalid {where}: expected a table of {', '.join(f.name for f in fields(cls))}")
        known = {f.name for f in fields(cls)}
        bad = sorted(str(k) for k in data if str(k).replace("-", "_") not in known)
        if bad:
            raise UsageError(f"invalid {where}: unknown key(s) {', '.join(bad)}")
        values = {str(k).replace("-", "_"): v for k, v in data.items()}
        for k, v in values.items():
            if not isinstance(v, str):
                raise UsageError(f"invalid {where} {k} {v!r}: expected a string")
        return cls(**values)

    def describe(self) -> str:
        """``'NVIDIA H200, driver 580.159.04, nvcc 13.0.88, sm_90a'`` (the known facts)."""
        parts = [self.gpu or "unknown GPU"]
        if self.driver:
            parts.append(f"driver {self.driver}")
        if self.nvcc:
            parts.append(f"nvcc {self.nvcc}")
        if self.arch:
            parts.append(self.arch)
        return ", ".join(parts)


def differences(tuned: Machine, here: Machine) -> list[str]:
    """One line per fact known on both machines that differs, e.g. ``'gpu: tuned on NVIDIA H200, here NVIDIA A100'``."""
    out = []
    for name in FIELDS:
        a, b = getattr(tuned, name), getattr(here, name)
        if a is not None and b is not None and a.split() != b.split():
            out.append(f"{name}: tuned with {a}, here {b}")
    return out


def nvcc_version(text: str) -> str | None:
    """``'13.0.88'`` from ``nvcc --version``'s 'Cuda compilation tools, release 13.0, V13.0.88'."""
    m = re.search(r"\bV(\d+\.\d+\.\d+)", text) or re.search(r"release (\d+\.\d+)", text)
    return m.group(1) if m else None
