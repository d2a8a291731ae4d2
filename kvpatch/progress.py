"""How a command says what it is doing: the one progress convention.

Every command takes a :class:`Progress`: :meth:`~Progress.say` for a line of plain text
(a note, a warning, a measured point), :meth:`~Progress.step` around work that takes a
while (a compile, a link), which may run in several threads at once. The CLI passes one
that draws on the terminal (kvpatch.cli); tests pass :class:`Recorder`; library callers
that want silence pass nothing (:data:`QUIET`). ``console`` is the rich console of the
edges that draw their own bars (a download), or None.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Iterator


class Progress:
    """Says nothing (the base of every progress kind)."""

    console: Any = None

    def say(self, text: str) -> None:
        """One line of plain text (never markup)."""

    @contextlib.contextmanager
    def step(self, label: str) -> Iterator[None]:
        """Around one step of work; safe to use from several threads at once."""
        yield


#: The progress of a caller that wants none.
QUIET = Progress()


class Recorder(Progress):
    """Keeps every line and finished step (``'label (1.2 s)'``), in order: for tests and logs."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def say(self, text: str) -> None:
        with self._lock:
            self.lines.append(text)

    @contextlib.contextmanager
    def step(self, label: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        with self._lock:
            self.lines.append(f"{label} ({time.perf_counter() - t0:.1f} s)")
