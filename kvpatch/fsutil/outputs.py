"""Outputs checked before any work is done: each can be written, none names another, an
input, or a protected file (the tree's header, kvpatch's own state), however it is spelled
(symlinks, ``..``, hard links, ``/dev/fd/N``)."""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterable, Mapping

from ..errors import UsageError
from .files import open_descriptor, resolve_target

#: The folder a kvpatch workspace keeps its state, its lock and its trees in (``.kvpatch/``): no
#: output goes into one, this directory's or another's.
STATE_DIR = ".kvpatch"

PathArg = str | os.PathLike[str]
Named = Mapping[str, PathArg | None] | Iterable[PathArg | None] | None


def output_problem(path: str | os.PathLike[str]) -> str | None:
    """Why :func:`write_atomic` could not write ``path``, checked before any work is done
    (None: it can, as far as the file system says now). A commands' outputs are checked
    first so that a bad path fails in a second, not after a long run."""
    text = os.fspath(path)
    if not text:
        return "an empty path"
    if text == "-":
        return "'-' (stdout) is not supported here: give a file name (or /dev/stdout)"
    fd = open_descriptor(text)
    if fd is not None:  # written through the descriptor: it must be open, for writing
        try:
            mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        except OSError:
            return f"descriptor {fd} is not open"
        return None if mode in (os.O_WRONLY, os.O_RDWR) else f"descriptor {fd} is open for reading only"
    try:
        st = os.stat(text)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    except OSError as e:
        return e.strerror or str(e)
    if st is not None and stat.S_ISDIR(st.st_mode):
        return "is a directory: give a file name"
    if st is not None and stat.S_ISSOCK(st.st_mode):
        return "is a socket: no file can be written there"
    if st is not None and not stat.S_ISREG(st.st_mode):  # a device or pipe: written in place
        if not os.access(text, os.W_OK):
            return "not writable"
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):  # one that cannot be opened now (/dev/tty
            try:  # without a terminal: ENXIO) fails before the work, not after it
                os.close(os.open(text, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY))
            except OSError as e:
                return f"cannot be opened for writing: {e.strerror or e}"
        return None  # a FIFO waits for its reader when written (FIFO_WAIT), as `diff -o pipe` before `cat pipe`
    parent = resolve_target(Path(text)).parent
    while not parent.exists():  # write_atomic creates missing parents
        if parent.parent == parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    try:  # a real file, not os.access: root passes that check on read-only mounts and /proc
        fd, probe = tempfile.mkstemp(prefix=".kvpatch-probe.", dir=parent)
    except OSError as e:
        return f"cannot create files in {parent}: {e.strerror or e}"
    os.close(fd)
    os.unlink(probe)
    return None


PathArg = str | os.PathLike[str]
#: Inputs or protected paths: ``{label: path}`` (the label names it in the error) or paths.
Named = Mapping[str, PathArg | None] | Iterable[PathArg | None] | None


def _named(items: Named, label: str) -> list[tuple[str, PathArg]]:
    if items is None:
        return []
    if isinstance(items, Mapping):
        return [(name, path) for name, path in items.items() if path is not None]
    return [(label, path) for path in items if path is not None]


def _where(path: PathArg) -> tuple[str, tuple[int, int] | None]:
    """Where a path really is: its resolved name (symlinks and ``..`` followed; for one of
    this process's descriptors, the file the descriptor is open on), and the (device,
    inode) of what it names when that exists (a hard link, a bind mount: one file)."""
    fd = open_descriptor(path)
    if fd is not None:
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            name = os.fspath(path)
        try:
            st = os.fstat(fd)
        except OSError:
            return name, None
        return name, (st.st_dev, st.st_ino)
    name = os.path.realpath(path)
    try:
        st = os.stat(name)
    except (OSError, ValueError):
        return name, None
    return name, (st.st_dev, st.st_ino)


def same_file(a: PathArg, b: PathArg) -> bool:
    """Whether writing ``a`` writes ``b``: one resolved path, or one inode."""
    (name_a, id_a), (name_b, id_b) = _where(a), _where(b)
    return name_a == name_b or (id_a is not None and id_a == id_b)


def _within(path: PathArg, folder: PathArg) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it, however either is spelled."""
    name, _ = _where(path)
    top, top_id = _where(folder)
    here = Path(name)
    if here == Path(top) or Path(top) in here.parents:
        return True
    if top_id is None:
        return False
    for parent in here.parents:  # a bind mount or another name of the directory
        try:
            st = os.stat(parent)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == top_id:
            return True
    return False


def _shown(path: PathArg) -> str:
    text = os.fspath(path)
    return repr(text if len(text) <= 120 else text[:117] + "...")


def check_output(option: str, path: PathArg, *, inputs: Named = None, protected: Named = None) -> None:
    """One output of an option that takes ``-`` for stdout, checked as :func:`check_outputs` checks
    it; ``-`` too: where the shell made stdout a file (``kvpatch diff -o - >> header``), it may not
    be an input or a protected file. A closed stdout names no file (what is written there goes
    nowhere)."""
    if os.fspath(path) == "-":
        try:
            os.fstat(1)
        except OSError:
            return
        path = "/dev/stdout"
    check_outputs(inputs=inputs, protected=protected, **{option: path})


def check_outputs(*, inputs: Named = None, protected: Named = None, **paths: PathArg | None) -> None:
    """Refuse, before any work and before anything is written, outputs that cannot be
    written or would destroy something: a one-line :class:`UsageError` naming the option.

    ``paths`` are the outputs by option (``json=...`` is ``--json``; None: not asked for):
    each must pass :func:`output_problem`; no two may be one file; none may be one of
    ``inputs`` (``{"--from": path}``, or plain paths); none may be or lie inside one of
    ``protected`` (``{"the tree's header": path}``: files, and directories whose whole
    contents are protected, e.g. ``.kvpatch/``). "One file" is judged however it is
    spelled: symlinks, ``..``, hard links (one inode), ``/dev/fd/N``.
    """
    seen: list[tuple[str, PathArg]] = []
    read = _named(inputs, "an input")
    keep = _named(protected, "a file kvpatch keeps")
    for option, path in paths.items():
        if path is None:
            continue
        flag = option if option == "stdout" else f"--{option.replace('_', '-')}"  # stdout: the shell's redirection
        if os.fspath(path) in ("", "-"):  # output_problem says why, before a path test reads it as '.'
            raise UsageError(f"{flag} {os.fspath(path)!r}: {output_problem(path)}")
        for other_flag, other in seen:
            if same_file(path, other):
                raise UsageError(
                    f"{other_flag} and {flag} name the same file ({os.fspath(path)}): one would overwrite the other"
                )
        for label, source in read:
            if same_file(path, source):
                raise UsageError(f"{flag} {_shown(path)} is {label} ({os.fspath(source)}): writing it would destroy "
                                 "that input; give another file")  # fmt: skip
        for label, kept in keep:
            is_dir = os.path.isdir(kept)
            if same_file(path, kept) or (is_dir and _within(path, kept)) or \
                    (not os.path.exists(kept) and _within(path, kept)):  # fmt: skip
                where = f"inside {label}" if is_dir and not same_file(path, kept) else label
                raise UsageError(f"{flag} {_shown(path)} is {where} ({os.fspath(kept)}): kvpatch never writes an "
                                 "output there; give another file")  # fmt: skip
        if open_descriptor(os.fspath(path)) is None:
            if _is_stdout_file(path):
                raise UsageError(f"{flag} {_shown(path)} is where stdout goes (the shell's redirection): the report "
                                 "and it would overwrite each other; give another file")  # fmt: skip
            where = _state_dir_of(path)
            if where is not None:
                raise UsageError(f"{flag} {_shown(path)} is inside a kvpatch workspace's state directory ({where}): "
                                 "kvpatch never writes an output there; give another file")  # fmt: skip
        # last: its test creates (and removes) a file beside the output, which no folder refused above may see
        why = output_problem(path)
        if why is not None:
            raise UsageError(f"{flag} {os.fspath(path)!r}: {why}")
        seen.append((flag, path))


def stdout_file() -> os.stat_result | None:
    """The ``fstat`` of the regular file the shell redirected this process's stdout into
    (``cmd > F``); None for a terminal, a pipe or a closed stdout."""
    try:
        out = os.fstat(1)
    except OSError:
        return None
    return out if stat.S_ISREG(out.st_mode) else None


def _is_stdout_file(path: PathArg) -> bool:
    """Whether ``path`` is the regular file this process's stdout was redirected into (``cmd --json
    F > F``); a stream, or a descriptor named as the output (``-o /dev/stdout``), is none."""
    out = stdout_file()
    if out is None:
        return False
    try:
        st = os.stat(os.fspath(path))
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino)


def _state_dir_of(path: PathArg) -> Path | None:
    """The ``.kvpatch`` folder ``path`` lies in, however it is spelled (symlinks, ``..``), if any."""
    target = resolve_target(Path(os.fspath(path)).absolute())
    for folder in target.parents:
        if folder.name == STATE_DIR:
            return folder
    return None


def check_output_folder(option: str, folder: PathArg, *, protected: Named = None) -> None:
    """A folder a command writes files into (``--upstream-dir``): a one-line :class:`UsageError`
    where it is, or lies inside, one of ``protected`` (as :func:`check_outputs` judges a file), or
    where no file can be created in it (or, not there yet, in the folder it would be made in)."""
    for label, kept in _named(protected, "a file kvpatch keeps"):
        if _within(folder, kept):
            raise UsageError(f"{option} {_shown(folder)} is inside {label} ({os.fspath(kept)}): kvpatch never "
                             "writes there; give another folder")  # fmt: skip
    where = _state_dir_of(Path(os.fspath(folder)) / "x")  # the folder itself may be a .kvpatch
    if where is not None:
        raise UsageError(f"{option} {_shown(folder)} is inside a kvpatch workspace's state directory ({where}): "
                         "kvpatch never writes there; give another folder")  # fmt: skip
    why = output_problem(Path(os.fspath(folder)) / "x")  # a file in it: the folder is made where missing
    if why is not None:
        raise UsageError(f"{option} {_shown(folder)}: {why}")
