"""``python -m kvpatch`` and the ``kvpatch`` command (:func:`main`)."""

from __future__ import annotations

import signal
import sys

#: What a signal that comes while kvpatch's modules load says, as kvpatch.cli's handlers say it later.
_SAID = {signal.SIGINT: "interrupted (Ctrl-C)", signal.SIGTERM: "terminated (SIGTERM)",
         signal.SIGHUP: "terminated (SIGHUP)"}  # fmt: skip


def _while_loading(signum: int, frame: object) -> None:
    """Before the command's own handlers (:func:`kvpatch.cli.run`): nothing to clean up yet, so one
    line and the code a shell reports for that signal, not a traceback from an import."""
    try:
        sys.stderr.write(f"error: kvpatch: {_SAID[signal.Signals(signum)]}\n")
    except (OSError, ValueError):  # stderr gone: the code says it
        pass
    raise SystemExit(128 + signum)


def main() -> None:
    """The console script: the command's modules load under :func:`_while_loading` (a signal this
    process started with ignored stays ignored), then :func:`kvpatch.cli.run` runs the command."""
    for sig in _SAID:
        try:
            if signal.getsignal(sig) not in (signal.SIG_IGN, None):
                signal.signal(sig, _while_loading)
        except (ValueError, OSError):  # not the main thread, or not this platform
            pass
    from .cli import run

    run()


if __name__ == "__main__":
    main()
