"""Locks between kvpatch processes: :func:`hold_lock` (``flock`` on a file that stays).

``flock`` dies with its process, so a lock file left behind holds nothing; waiters share
one inode, so the file is never deleted on release (it carries a note saying so).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from .reading import NotRegularFileError, file_kind

#: What a lock file says about itself (written into it once, when it is empty).
LOCK_NOTE = ("This is a kvpatch lock file. A kvpatch command holds a lock (flock) on it while it changes "
             "{what}; the lock dies with the process. The file stays between commands: its presence does "
             "not mean it is held. You may delete it when no kvpatch command is running.\n")  # fmt: skip

_HELD = threading.local()  # (device, inode) -> depth, of the locks this thread holds


def _held() -> dict[tuple[int, int], int]:
    if not hasattr(_HELD, "locks"):
        _HELD.locks = {}
    return _HELD.locks


@contextlib.contextmanager
def hold_lock(path: str | os.PathLike[str], *, timeout: float | None = None,
              on_wait: Callable[[], None] | None = None, what: str = "the files it guards") -> Iterator[None]:  # fmt: skip
    """Hold an exclusive ``flock`` on the file ``path`` (created if missing, never
    truncated, never deleted: every waiter must lock the same inode).

    Released on exit, and by the kernel when the process dies, so a lock file left
    behind is never a held lock; an empty one is given :data:`LOCK_NOTE` saying so.
    Re-entrant within a thread (a nested hold of the same file is a no-op); other
    threads and processes wait. A lock file deleted or replaced while waited for is
    noticed after the wait and the file there now is locked instead, so its deleter
    does not make two holders. ``timeout`` (seconds; None: wait for ever) ends in
    TimeoutError; ``on_wait`` is called once when the lock is busy. ``fcntl.flock``:
    the lock other flock users of the file (filelock's FileLock) respect.
    """
    fd, key = _acquire(Path(path), timeout, on_wait)
    held = _held()
    if fd is None:  # this thread holds it already
        held[key] += 1
        try:
            yield
        finally:
            held[key] -= 1
        return
    held[key] = 1
    try:
        if os.fstat(fd).st_size == 0:
            with contextlib.suppress(OSError):
                os.pwrite(fd, LOCK_NOTE.format(what=what).encode("utf-8", "surrogateescape"), 0)  # a path's own bytes
        yield
    finally:
        del held[key]
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _acquire(
    path: Path, timeout: float | None, on_wait: Callable[[], None] | None
) -> tuple[int | None, tuple[int, int]]:
    deadline = None if timeout is None else time.monotonic() + timeout
    told = False
    while True:
        try:
            fd = os.open(
                path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o644
            )
        except OSError as e:  # O_NOFOLLOW's "too many levels of symbolic links" for any link: say what it is
            if e.errno == errno.ELOOP and os.path.islink(path):
                raise NotRegularFileError(path, "a symlink") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise NotRegularFileError(path, file_kind(st.st_mode))
            key = (st.st_dev, st.st_ino)
            if key in _held():
                os.close(fd)
                return None, key
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise
                if not told and on_wait is not None:
                    on_wait()
                told = True
                if deadline is None:
                    fcntl.flock(fd, fcntl.LOCK_EX)  # interruptible: Ctrl-C raises here
                    break
                if time.monotonic() >= deadline:
                    raise TimeoutError(errno.ETIMEDOUT, f"another kvpatch process holds the lock (waited {timeout:g} s)",
                                       str(path))  # fmt: skip
                time.sleep(0.02)
            try:
                now = os.stat(path, follow_symlinks=False)
                same = (now.st_dev, now.st_ino) == key
            except FileNotFoundError:
                same = False
            if same:
                return fd, key
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # deleted or replaced while we waited: lock what is there now
