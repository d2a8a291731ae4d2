"""What every command of the CLI shares: the app, the two consoles, the progress it draws,
option types, and the one ``--json`` convention.

``--json PATH`` writes the command's report as JSON to PATH; ``--json -`` writes it to
stdout instead of the table (so ``kvpatch sites --json - | jq`` works). Files are the
form for long GPU runs (their reports are large, the terminal gets the table); ``-``
the form for the quick commands' pipes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any, Iterator, Optional

import typer
from rich.console import Console
from rich.markup import escape

from ..commands.choices import DEFAULT_ARCH, decimal_number, folder_spelling, whole_number
from ..errors import UsageError, printable
from ..progress import Progress

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Patch vLLM's PagedAttention decode kernel with an L2 bulk prefetch of the next KV block; "
    "prefetch weights into L2 while HBM idles.",
    epilog="Exit codes: 0 ok, 2 bad parameters, 3 fetch failed, 4 cannot patch, 5 build or tool failure "
    "(no GPU too), 6 GPU check failed, 130 interrupted (143 SIGTERM, 129 SIGHUP), 141 output's reader gone, "
    "1 other.",
)

#: Columns a console narrower than this (``COLUMNS=0``, a tiny terminal) is drawn with.
MIN_WIDTH = 40
#: Columns when stdout is not a terminal: wide enough that no table cell is cut.
PIPE_WIDTH = 10_000


def console_for(stream: Any) -> Console:
    """A console for ``stream``: the terminal's width (at least :data:`MIN_WIDTH`: a zero or
    tiny ``COLUMNS`` must not eat output), or, piped, a width that keeps every cell whole."""
    terminal = hasattr(stream, "isatty") and stream.isatty()
    if terminal:
        width = shutil.get_terminal_size((80, 24)).columns
        width = width if width >= MIN_WIDTH else 80
    else:
        width = PIPE_WIDTH
    return Console(file=stream, width=width, soft_wrap=True, force_terminal=terminal or None, highlight=False)


class Consoles:
    """stdout (results) and stderr (progress, warnings, errors), made when first used so that
    they follow the streams the process really has."""

    @property
    def out(self) -> Console:
        return console_for(sys.stdout)

    @property
    def err(self) -> Console:
        return console_for(sys.stderr)


io = Consoles()
#: ``--debug``: tracebacks for errors
DEBUG = {"on": False}


class TerminalProgress(Progress):
    """Progress on stderr: each line as it comes; each step a spinner on a terminal, a line
    with its time when piped."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._lock = threading.Lock()
        self._bars: Any = None

    def say(self, text: str) -> None:
        self.console.print(escape(text), highlight=False, soft_wrap=True)

    @contextlib.contextmanager
    def step(self, label: str) -> Iterator[None]:
        t0 = time.perf_counter()
        if not self.console.is_terminal:
            yield
            self.say(f"{label} ({time.perf_counter() - t0:.1f} s)")
            return
        with self._lock:
            if self._bars is None:
                from rich.progress import Progress as Bars
                from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

                self._bars = Bars(SpinnerColumn(finished_text="✓"), TextColumn("{task.description}"), TimeElapsedColumn(),
                                  console=self.console)  # fmt: skip
                self._bars.start()
            task = self._bars.add_task(escape(label), total=1)
        try:
            yield
        finally:
            self._bars.update(task, completed=1, description=escape(f"{label} ({time.perf_counter() - t0:.1f} s)"))

    def close(self) -> None:
        if self._bars is not None:
            self._bars.stop()
            self._bars = None


@contextlib.contextmanager
def progress() -> Iterator[TerminalProgress]:
    """The progress a command runs with (its spinners stopped when it ends)."""
    p = TerminalProgress(io.err)
    try:
        yield p
    finally:
        p.close()


def warn(line: str) -> None:
    """One warning line on stderr (``warning: `` prefixed unless the line has it); control
    characters shown as escapes (:func:`kvpatch.errors.printable`)."""
    text = line if line.startswith("warning:") else f"warning: {line}"
    io.err.print(shown(text), highlight=False, soft_wrap=True)


def shown(value: object) -> str:
    """A path or value of the user's in a printed line: markup escaped, control characters shown
    as escapes (a newline in a file name must not forge a line of kvpatch's own)."""
    return escape(printable(str(value)))


def cwd() -> Path:
    return Path.cwd()


def csv(text: Optional[str], kind: Any = str, *, empty: bool = False) -> Optional[list]:
    """``'a,b'`` (or ``;``-separated) -> a list; None (not given) stays None. A list given empty
    (``--dtypes ''``, an unset shell variable) is a one-line error unless ``empty`` says it means
    something: it must not quietly become the default. Integers are ASCII digits (int() alone
    would also read '+5', '1_000' and other scripts' digits)."""
    if text is None:
        return None
    if kind is int:
        kind = whole_number
    try:
        items = [kind(x.strip()) for x in text.replace(";", ",").split(",") if x.strip()]
    except ValueError:
        what = ": comma-separated whole numbers" if kind is whole_number else ""
        raise UsageError(f"invalid list {text!r}{what}") from None
    if not items and not empty:
        raise UsageError(f"an empty list {text!r}: give at least one value")
    return items


def json_target(value: Optional[str]) -> tuple[Optional[Path], bool]:
    """``--json``'s value -> (the file a command writes, whether stdout holds the JSON);
    ``-`` is stdout."""
    if value is None:
        return None, False
    if value == "-":
        return Path("/dev/stdout"), True
    return Path(value), False


def write_stdout(text: str) -> None:
    """``text`` on stdout, all of it, or an error: a reader that goes away part way is EPIPE
    (``run`` exits 141), never a silent exit 0 (Python's buffered stdout drops what a pipe did
    not take of a large write: ``kvpatch diff | head -1`` exited 0 with the patch cut)."""
    stream = sys.stdout
    stream.flush()
    try:
        fd = stream.fileno()
    except (AttributeError, ValueError, OSError):  # a stream without a descriptor (a test's)
        stream.write(text)
        stream.flush()
        return
    view = memoryview(text.encode(getattr(stream, "encoding", None) or "utf-8", errors="backslashreplace"))
    while view:
        view = view[os.write(fd, view) :]


def emit_json(value: Optional[str], data: Any) -> bool:
    """Write ``data`` as ``--json`` asks (nothing without it); True when it went to stdout."""
    if value is None:
        return False
    text = json.dumps(data, indent=2) + "\n"
    if value == "-":
        write_stdout(text)
        return True
    from ..fsutil import check_outputs, write_atomic

    check_outputs(json=value)
    write_atomic(value, text)
    return False


# --------------------------------------------------------------------------- option types


def path_value(value: str | Path) -> Path:
    """A path option's value (every one's ``parser``; a default comes as a Path): an empty one, an
    unset shell variable, is refused rather than taken for the current directory (``--dir ''``
    acted on it)."""
    if isinstance(value, Path):
        return value
    if not value.strip():
        raise typer.BadParameter("an empty path (an unset shell variable?): give a path")
    return Path(value)


def _typed(value: str) -> str:
    """An option's text as an error shows it: quoted, cut after 20 characters (thousands of digits)."""
    return repr(value) if len(value) <= 24 else f"{value[:20]!r}... ({len(value)} characters)"


def whole_value(value: str | int) -> int:
    """An integer option's value, a count as written on a command line (``whole_number``: ASCII
    digits, a leading '-' at most): '+5', '1_0' and '٣', which int() reads, are refused."""
    if isinstance(value, int):
        return value
    try:
        return whole_number(value.strip())
    except ValueError:  # thousands of digits too: int() refuses them
        raise typer.BadParameter(f"{_typed(value)} is not a whole number in ASCII digits") from None


def decimal_value(value: str | float) -> float:
    """A seconds or fraction option's value, a number as written on a command line
    (``decimal_number``: ASCII digits, one '.' at most, a leading '-' at most): '1_0', '١٠' and
    '1e3', which float() reads, are refused; nan and inf reach the option's own range check."""
    if isinstance(value, float | int):
        return float(value)
    try:
        return decimal_number(value.strip())
    except ValueError:
        raise typer.BadParameter(f"{_typed(value)} is not a number in ASCII digits (one '.' at most)") from None


def positive_value(value: str | int) -> int:
    """:func:`whole_value`, at least 1."""
    n = whole_value(value)
    if n < 1:
        raise typer.BadParameter(f"{n} is below 1")
    return n


def file_value(value: str | Path) -> Path:
    """A file option's value: :func:`path_value`, and a trailing '/' (a folder's spelling, which a
    Path drops: ``--config ok.toml/`` read ok.toml, ``-o out/`` wrote a file named out) refused."""
    if isinstance(value, str) and folder_spelling(value):
        raise typer.BadParameter(f"{value!r} ends in '/', a folder's spelling: give a file")
    return path_value(value)


VllmOpt = Annotated[Optional[str], typer.Option("--vllm", metavar="VERSION", help="vLLM release: v0.10.2 or 0.10.2.")]
TreeOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--tree",
        metavar="DIR",
        help="An existing vLLM checkout (default: the tree of the last apply here).",
        parser=path_value,
    ),
]
JsonOpt = Annotated[
    Optional[str],
    typer.Option(
        "--json", metavar="PATH", help="Write the report as JSON to PATH ('-': to stdout, instead of the table)."
    ),
]
PlotOpt = Annotated[
    Optional[Path],
    typer.Option("--plot", metavar="FILE", help="Draw the speedups into FILE: .png, .pdf or .svg.", parser=file_value),
]
JobsOpt = Annotated[
    Optional[int], typer.Option(parser=whole_value, metavar="N", help="Parallel nvcc processes (default: CPU count).")
]
ArchOpt = Annotated[
    str, typer.Option("--arch", metavar="ARCHS", help="TORCH_CUDA_ARCH_LIST syntax: 9.0a, 9.0, '8.0;9.0a', 9.0+PTX.")
]
#: ``--arch`` of a command that builds unless given ``--lib`` (None: not given).
BuildArchOpt = Annotated[
    Optional[str],
    typer.Option("--arch", metavar="ARCHS",
                 help=f"TORCH_CUDA_ARCH_LIST syntax: 9.0a, 9.0, '8.0;9.0a', 9.0+PTX (default {DEFAULT_ARCH}; not with --lib)."),
]  # fmt: skip
LibOpt = Annotated[
    list[str],
    typer.Option("--lib", metavar="NAME=PATH.so:PREFIX",
                 help="A prebuilt library (repeatable); nothing is built, 'stock' is the baseline."),
]  # fmt: skip
VariantInfoOpt = Annotated[
    Optional[Path],
    typer.Option("--variant-info", metavar="FILE",
                 help="With --lib: JSON {name: marker or {marker, compile_flags, ...}} recorded in the report.", parser=file_value),
]  # fmt: skip
DeviceOpt = Annotated[str, typer.Option("--device", hidden=True, help="torch device (tests: cpu).")]


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip() not in ("", "0")
