"""The ``kvpatch`` command: each command parses options into its ``commands`` dataclass, runs
it, and renders the report (:mod:`kvpatch.render`).

Exit codes: 0 success; 1 other failure; 2 invalid parameters or configuration; 3 a release
could not be fetched (unknown, unsupported, no network); 4 the source cannot be patched
(sites not found, local edits, failed re-parse); 5 build or tool failure, or a missing tool
(also: no GPU); 6 a GPU check failed (bit mismatch); 130 interrupted (Ctrl-C), 143 SIGTERM,
129 SIGHUP; 141 the reader of the output went away (``kvpatch sites | head -1``). The codes live with the error types, kvpatch/errors.py. Errors are one line on
stderr, ``error: kvpatch COMMAND: ...`` (``--debug`` adds the traceback).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, NoReturn

import typer
from rich.markup import escape

from .. import __version__
from ..errors import KvpatchError, printable
from ..fsutil import note_stop, stop_noted
from ..fsutil.problems import machine_problem
from . import building, decode, measuring, patching, plugin  # noqa: F401,I001  (each registers its commands, in this order)
from .base import DEBUG, app, io


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"kvpatch {__version__}\n")
        raise typer.Exit()


@app.callback()
def main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    DEBUG["on"] = debug
    from ..commands.common import check_stdout

    try:
        cwd = Path.cwd()
    except FileNotFoundError:  # removed under the shell: every command works relative to it
        raise KvpatchError("the current directory no longer exists: cd to one that does") from None
    check_stdout(cwd)  # stdout made a file kvpatch keeps (cmd >> .kvpatch/state.json): refused first


# --------------------------------------------------------------------------- signals


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the process is, so that every cleanup a Ctrl-C runs
    (temporary files, nvcc's process groups, the workspace lock) runs for it too."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: The signal that ended the command (None: none, or Ctrl-C).
_SIGNAL: dict[str, int | None] = {"num": None}
#: What a shell reports for each ending: 128 + the signal's number.
EXIT_BY_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


def _on_signal(signum: int, frame: object) -> None:
    if _SIGNAL["num"] is None:
        _SIGNAL["num"] = signum
        note_stop(signum)  # remembered where the exception below gets lost (a ctypes callback)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)


def _unraisable(hook: Callable[[Any], object]) -> Callable[[Any], object]:
    """``sys.unraisablehook`` that says nothing of a stop's exception lost in a ctypes callback
    or a finalizer (the stop is noted; the command ends with it), and passes the rest on."""

    if getattr(hook, "kvpatch_quiet", False):  # installed already (a second run in one process)
        return hook

    def quiet(unraisable: Any) -> object:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and stop_noted() is not None:
            return None
        return hook(unraisable)

    quiet.kvpatch_quiet = True  # type: ignore[attr-defined]
    return quiet


def _install_signals() -> None:
    """Ctrl-C, SIGTERM and SIGHUP end a command alike (cleanup first; noted, so that one whose
    exception is lost inside libclang's callbacks still ends it). One this process started with
    ignored stays ignored (``nohup`` ignores SIGHUP so that a build outlives the terminal; an
    ignored SIGINT stays ignored, as in a shell's background job)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            if signal.getsignal(sig) not in (signal.SIG_IGN, None):
                signal.signal(sig, _on_signal)
        except (ValueError, OSError):  # not the main thread, or not this platform
            pass
    sys.unraisablehook = _unraisable(sys.unraisablehook)


# --------------------------------------------------------------------------- errors


def _command_name(argv: list[str]) -> str:
    """The subcommand being run (``apply``, ``plugin enable``), from the arguments: its
    first non-option words."""
    names = {c.name or (c.callback.__name__ if c.callback else "") for c in getattr(app, "registered_commands", [])}
    groups = {g.name: g.typer_instance for g in getattr(app, "registered_groups", []) if g.name}
    words = [a for a in argv if not a.startswith("-")]
    if not words:
        return ""
    if words[0] in groups:
        sub = {c.name or (c.callback.__name__ if c.callback else "") for c in groups[words[0]].registered_commands}
        return f"{words[0]} {words[1]}" if len(words) > 1 and words[1] in sub else words[0]
    return words[0] if words[0] in names else ""


def _one_line(message: str, code: int) -> NoReturn:
    """Print ``error: kvpatch COMMAND: message`` (user text escaped, never read as markup) and exit
    (with ``code`` even where stderr's reader has gone: the code is then all the caller gets)."""
    text = printable(re.sub(r"[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+", " ", str(message)).strip()) or "failed"
    command = _command_name(sys.argv[1:])
    where = f"kvpatch {command}: " if command else ""
    try:
        io.err.print(f"[red]error:[/] {escape(where + text)}", highlight=False, soft_wrap=True)
    except (OSError, SystemExit) as e:  # rich turns a broken pipe into SystemExit(1)
        if not _pipe_closed(e):
            raise
        _write_nowhere()
    sys.exit(code)


#: The reader of stdout or stderr went away (``kvpatch sites | head -1``): the command ends as
#: a program that leaves SIGPIPE at its default does, silently, with what a shell reports for that.
EXIT_PIPE_CLOSED = 128 + signal.SIGPIPE


def _pipe_closed(e: BaseException | None) -> bool:
    """Whether ``e``, or what it was raised from or while handling, is a write to a pipe no one
    reads (the CLI library and rich turn one into ``SystemExit(1)`` while handling it)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError) and e.errno == errno.EPIPE:
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _write_nowhere() -> None:
    """Point stdout and stderr at /dev/null, so that nothing more (Python's own flush at exit
    included) writes to a pipe no one reads."""
    null = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(null, stream.fileno())
        except (OSError, ValueError, AttributeError):  # no descriptor (a stream a test swapped in)
            pass
    os.close(null)


def _pipe_gone() -> NoReturn:
    _write_nowhere()
    sys.exit(EXIT_PIPE_CLOSED)


def _os_error(e: OSError) -> str:
    """An OSError in one line: what failed, on which path, why."""
    why = e.strerror or str(e) or type(e).__name__
    where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    return f"{where}: {why}" if where else why


def _interrupted() -> NoReturn:
    num = _SIGNAL["num"]
    if num is None or num == signal.SIGINT:
        _one_line("interrupted (Ctrl-C)", 130)
    _one_line(f"terminated ({signal.Signals(num).name})", EXIT_BY_SIGNAL.get(num, 128 + num))


def run() -> None:
    """Console-script entry point: one-line errors, exit codes from the error type.

    With ``standalone_mode=False`` Typer *returns* the exit code of an ``Exit`` (and turns
    a KeyboardInterrupt inside a command into ``Abort``) instead of exiting, so the returned
    code is what this process must exit with. SIGTERM and SIGHUP end a command as Ctrl-C
    does (cleanup first), with exit 143 and 129.
    """
    for name in ("stdout", "stderr"):  # started with the stream closed (cmd >&-): write nowhere, do not crash
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115 - lives as long as the process
        with contextlib.suppress(AttributeError, ValueError):  # a stream that cannot encode a path (LANG=C, ascii)
            getattr(sys, name).reconfigure(errors="backslashreplace")  # shows it escaped, never a traceback
    _install_signals()
    try:
        try:
            code = app(standalone_mode=False)
            sys.stdout.flush()  # what is still buffered, while a closed pipe can still be told apart
        except Exception as e:
            # what failed after a stop (ctypes' ArgumentError around it too) is the stop's doing
            if stop_noted() is not None and not _pipe_closed(e):
                _interrupted()
            raise
        if stop_noted() is not None:  # a stop whose exception was lost in a callback: not success
            _interrupted()
    except SystemExit as e:
        if _pipe_closed(e):
            _pipe_gone()
        raise
    except KeyboardInterrupt:  # outside the command (typer converts one inside it), or a signal
        _interrupted()
    except KvpatchError as e:
        if DEBUG["on"]:
            raise
        _one_line(str(e), e.exit_code)
    except typer.Abort:
        _interrupted()
    except typer.Exit as e:
        code = e.exit_code
    except OSError as e:  # the file system said no (permissions, read-only, disk full)
        if _pipe_closed(e):
            _pipe_gone()
        if DEBUG["on"]:
            raise
        problem = machine_problem(e)  # a full disk (exit 1) or a path too long (exit 2), said so
        if problem is not None:
            _one_line(str(problem), problem.exit_code)
        _one_line(_os_error(e), 1)
    except Exception as e:
        # Usage errors come from the click that typer vendors: each has format_message() and
        # an exit_code (2 for usage errors). One line each, except "no arguments", which shows the help.
        if type(e).__name__ == "NoArgsIsHelpError":
            e.show()
            sys.exit(e.exit_code)
        if callable(getattr(e, "format_message", None)) and isinstance(getattr(e, "exit_code", None), int):
            ctx = getattr(e, "ctx", None)
            hint = f" (see '{ctx.command_path if ctx is not None else 'kvpatch'} --help')"
            _one_line(e.format_message() + hint, e.exit_code)
        raise
    if code == 130:
        _interrupted()
    sys.exit(code if isinstance(code, int) else 0)
