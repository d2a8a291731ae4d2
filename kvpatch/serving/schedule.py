"""The order of engine starts: arms alternated, each in every position equally often.

Round ``r`` starts every arm once, the arm list rotated by ``r``: with three arms and four
rounds, ``kvpatch vllm twin / vllm twin kvpatch / twin kvpatch vllm / kvpatch vllm twin``. A
drift over the run (clocks, temperature, the page cache) then falls on every arm alike, and
the two arms compared in a round always ran next to each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from .options import Arm


@dataclass(frozen=True)
class Slot:
    """One engine start: its round, its place in the run, and its arm."""

    round: int
    index: int  # 0-based position in the whole run
    arm: Arm

    @property
    def name(self) -> str:
        """``'r02-vllm-twin'``: the file stem its raw data is kept under."""
        return f"r{self.round:02d}-{self.arm.name}"


def schedule(arms: Sequence[Arm], rounds: int) -> list[Slot]:
    """Every engine start of a run, in order (see the module)."""
    if not arms:
        return []
    slots = []
    for r in range(rounds):
        k = r % len(arms)
        for arm in (*arms[k:], *arms[:k]):
            slots.append(Slot(r, len(slots), arm))
    return slots


def pending(slots: Iterable[Slot], done: Iterable[str]) -> list[Slot]:
    """The slots whose runs are not among ``done`` (slot names): what a resumed run starts."""
    have = set(done)
    return [s for s in slots if s.name not in have]
