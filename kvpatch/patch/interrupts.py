"""Ctrl-C while libclang walks the AST.

libclang reports children through a ctypes callback. A KeyboardInterrupt raised inside
that callback cannot cross the C frames: ctypes prints it as an "ignored" exception,
the callback returns 0 and libclang stops visiting, so a walk silently ends early and
the code after it works on part of the AST (an apply interrupted there went on and
wrote the header). :func:`interruptible` wraps the patch package's entry points: an
interrupt swallowed that way, or one that struck while ctypes converted an argument,
is raised as a KeyboardInterrupt when the entry point returns, instead of anything it
returned or raised; so is a stop the CLI's handler noted (:func:`kvpatch.fsutil.stop_noted`:
SIGTERM and SIGHUP too, whose exception ctypes wraps in an ArgumentError under its own name).
Only the main thread gets SIGINT; elsewhere the wrapper is a plain call.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
from typing import Any, Callable, TypeVar

from ..fsutil import stop_noted

F = TypeVar("F", bound=Callable[..., Any])

_depth = 0  # nesting of interruptible calls on the main thread


def interruptible(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _depth
        if _depth or threading.current_thread() is not threading.main_thread():
            return fn(*args, **kwargs)
        swallowed: list[BaseException] = []
        previous = sys.unraisablehook

        def hook(unraisable: Any) -> None:
            if isinstance(unraisable.exc_value, KeyboardInterrupt):
                swallowed.append(unraisable.exc_value)
            else:
                previous(unraisable)

        def stopped() -> bool:  # a stop dropped in a callback: seen by the hook, or noted by the CLI's handler
            return bool(swallowed) or stop_noted() is not None

        sys.unraisablehook = hook
        _depth += 1
        try:
            result = fn(*args, **kwargs)
        except ctypes.ArgumentError as e:
            if stopped() or "KeyboardInterrupt" in str(e):
                raise KeyboardInterrupt from None
            raise
        except Exception:
            if stopped():  # what failed after the walk stopped early is not the news
                raise KeyboardInterrupt from None
            raise
        finally:
            _depth -= 1
            sys.unraisablehook = previous
        if stopped():
            raise KeyboardInterrupt
        return result

    return wrapper  # type: ignore[return-value]
