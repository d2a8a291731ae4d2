"""A release's source distribution unpacked into a tree, refusing what a crafted archive could do:
members that leave the archive's top directory, any ``.git`` (a fetched tree never hands git a
repository, hooks or config), special files and odd names, too many members or bytes (a
decompression bomb); tarfile's ``data`` filter on the rest. A full disk is said as one (exit 1).
"""

from __future__ import annotations

import lzma
import math
import os
import shutil
import sys
import tarfile
import zlib
from pathlib import Path

from ..errors import FetchError
from ..fsutil.problems import machine_problem
from .sdist import _CHUNK, _short_reason

#: Bounds on what an sdist may unpack to (vLLM's hold ~5,000 files, ~50 MB): a decompression bomb stops here.
_MAX_MEMBERS = 200_000
_MAX_BYTES = 4 << 30
#: git's commit dates run from 1970 to 2099: member mtimes are clamped into that range.
_MTIME_RANGE = (0, 4_102_444_799)
_NAME_MAX, _PATH_MAX = 255, 4096

#: What extraction can raise besides FetchError: tarfile's errors (tarfile.FilterError included), the file
#: system's, and the decompressors' (zlib.error and lzma.LZMAError are not OSErrors), and ValueError/OverflowError
#: for values os calls cannot take.
_UNPACK_ERRORS: tuple[type[BaseException], ...] = (tarfile.TarError, OSError, EOFError, ValueError, OverflowError,
                                                   zlib.error, lzma.LZMAError, UnicodeError)  # fmt: skip


def _unpack(archive: Path, top: str, dest: Path) -> int:
    """Extract the sdist's ``top/`` directory as ``dest``; return the newest member mtime.

    The archive must be gzip (as an sdist's name says). Every member is checked before
    anything is written (:func:`_check_member`): it lies under ``top/``, no ``.git``
    anywhere, no special files, no links leaving the tree, sane names and mtimes; and
    tarfile's ``data`` filter checks again while extracting. Every failure is one
    :class:`FetchError` (exit 3).
    """
    staging = dest.parent / ".unpack"
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members: list[tarfile.TarInfo] = []
            total = 0
            for member in tar:
                _check_member(member, top, archive)
                members.append(member)
                total += member.size if member.isreg() else 0
                if len(members) > _MAX_MEMBERS:
                    raise FetchError(f"refusing to unpack {archive.name}: more than {_MAX_MEMBERS} members")
                if total > _MAX_BYTES:
                    raise FetchError(f"refusing to unpack {archive.name}: more than {_MAX_BYTES} bytes of files")
            while tar.fileobj.read(_CHUNK):  # to the end of the gzip stream: its CRC and length are checked
                pass
            if not hasattr(tarfile, "data_filter"):
                # 3.11.0-3.11.3 lack it, and the member check above does not resolve
                # chains of links the way extraction does: never unpack without it.
                raise FetchError(f"Python {sys.version.split()[0]} has no tarfile.data_filter; kvpatch needs "
                                 "Python 3.11.4 or newer to unpack a source distribution safely")  # fmt: skip
            staging.mkdir()
            tar.extractall(staging, members=members, filter="data")
    except FetchError:
        raise
    except _UNPACK_ERRORS as exc:
        raise machine_problem(exc, staging, doing=f"unpacking {archive.name}") or \
            FetchError(f"cannot unpack {archive.name}: {_short_reason(exc) or type(exc).__name__}") from None  # fmt: skip
    if not (staging / top).is_dir() or (staging / top).is_symlink():
        raise FetchError(f"{archive.name} has no top directory {top}/")
    os.replace(staging / top, dest)
    shutil.rmtree(staging, ignore_errors=True)
    return max((int(m.mtime) for m in members), default=0)


def _is_git(part: str) -> bool:
    """A path component git would take for a repository: ``.git`` in any case, and the
    spellings NTFS and HFS+ fold into it (``.git.``, ``.git `` and ``git~1``)."""
    folded = part.casefold().rstrip(". ")
    return folded in (".git", "git~1")


def _check_member(member: tarfile.TarInfo, top: str, archive: Path) -> None:
    """Refuse (FetchError) a member that could leave the tree, hand git a repository,
    hooks or config, make a special file, or break extraction; clamp its mtime."""
    name = member.name

    def refuse(why: str) -> FetchError:
        shown = name if len(name) <= 120 else name[:117] + "..."
        return FetchError(f"refusing to unpack {archive.name}: {why} {shown!r}")

    for text, what in ((name, "member"), (member.linkname, "link target of")):
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
            raise refuse(f"a control character (NUL, newline, ...) in the {what}")
    if len(name.encode("utf-8", "surrogateescape")) > _PATH_MAX or \
            any(len(part.encode("utf-8", "surrogateescape")) > _NAME_MAX for part in name.split("/")):  # fmt: skip
        raise refuse("a name longer than the file system allows:")
    parts = Path(name).parts
    if name.startswith(("/", "\\")) or ".." in parts or not parts or parts[0] != top:
        raise refuse("unsafe or unexpected member")
    if any(_is_git(part) for part in parts):
        raise refuse("a .git inside the release (git must never read a fetched repository, hooks or config):")
    if member.islnk() or member.issym():
        target = Path(member.linkname)
        base = Path(name).parent if member.issym() else Path()
        resolved = os.path.normpath(base / target)
        if target.is_absolute() or resolved.startswith("..") or Path(resolved).parts[:1] != (top,):
            raise refuse("a link leaving the tree:")
        if any(_is_git(part) for part in Path(resolved).parts):
            raise refuse("a link into a .git:")
    if not (member.isfile() or member.isdir() or member.islnk() or member.issym()):
        raise refuse("a special file (device, FIFO):")
    if not isinstance(member.mtime, (int, float)) or not math.isfinite(member.mtime):
        raise refuse(f"a non-finite mtime ({member.mtime!r}) on")
    low, high = _MTIME_RANGE
    member.mtime = min(max(int(member.mtime), low), high)
