"""The tree's files a parse of the header can open through ``#include``: found, checked and read
here, before libclang runs, and handed to it as unsaved files, so that libclang itself opens
none of them (a FIFO or a device among them would block it, with kvpatch's locks held).

:func:`included_files` follows the header's literal ``#include "..."`` / ``<...>`` (also
``#include_next``, ``#import`` and ``__has_include``), whatever ``#if`` they sit under, the way
clang resolves them: a quoted name beside the including file first, then in each ``-I``
directory, in order; the first candidate that exists and is not a directory is the one clang
would open. It is returned under every spelling clang forms for it (``attention/../x.h`` is
not ``x.h`` to clang's file manager), each checked to be a regular file of bounded size
(:func:`kvpatch.fsutil.read_regular`). A name that an ``#include`` builds from a macro is not
followed (nothing in vLLM's headers does that).
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from typing import Sequence

from ..errors import PatchError
from ..fsutil import FileTooLargeError, NotRegularFileError, file_kind, read_regular

#: ``#include "x"``, ``#include <x>``, ``#include_next``, ``#import``: (kind, name).
_DIRECTIVE = re.compile(rb'^[ \t]*#[ \t]*(?:include_next|include|import)[ \t]*([<"])([^>"\r\n]*)[>"]', re.MULTILINE)
#: ``__has_include("x")``, ``__has_include(<x>)``: clang looks the name up as an include.
_HAS_INCLUDE = re.compile(rb'__has_include(?:_next)?[ \t]*\([ \t]*([<"])([^>"\r\n]*)[>"]')

#: The most files one parse reads through includes (vLLM's header reaches about ten).
MAX_FILES = 1000
#: The most bytes they may hold together (vLLM's: about 100 kB).
MAX_BYTES = 64 << 20


def _names(data: bytes) -> list[tuple[bool, str]]:
    """(quoted, name) of every literal include of ``data``, in order."""
    found = [*_DIRECTIVE.finditer(data), *_HAS_INCLUDE.finditer(data)]
    found.sort(key=lambda m: m.start())
    return [(m.group(1) == b'"', os.fsdecode(m.group(2))) for m in found if m.group(2)]


def _join(directory: str, name: str) -> str:
    """How clang spells ``name`` looked up in ``directory`` (``llvm::sys::path::append``)."""
    directory = directory or "."
    return directory + name if directory.endswith("/") else f"{directory}/{name}"


def included_files(main: str, data: bytes, search: Sequence[str]) -> list[tuple[str, bytes]]:
    """``(spelling, bytes)`` of every existing file the parse of ``data`` (the file ``main``) can
    reach by literal includes, ``search`` being the ``-I`` directories in order. Refused
    (:class:`PatchError`, naming the file and who includes it) when one is not a regular file,
    cannot be read, or when they are more than :data:`MAX_FILES` files or :data:`MAX_BYTES`."""
    todo: list[tuple[str, bytes]] = [(main, data)]
    taken: dict[str, bool] = {main: True}  # spelling -> whether clang would open a file there
    out: list[tuple[str, bytes]] = []
    total = 0
    while todo:
        includer, text = todo.pop()
        for quoted, name in _names(text):
            if name.startswith("/"):
                candidates = [name]
            else:
                here = [_join(posixpath.dirname(includer), name)] if quoted else []
                candidates = [*here, *(_join(d, name) for d in search)]
            for spelling in candidates:
                if spelling in taken:
                    if taken[spelling]:
                        break
                    continue
                if not _opens(spelling):
                    taken[spelling] = False
                    continue
                taken[spelling] = True
                if len(out) >= MAX_FILES:
                    raise PatchError(f"{main} includes more than {MAX_FILES} files: not vLLM's header")
                body = _read(spelling, includer, MAX_BYTES - total)
                total += len(body)
                out.append((spelling, body))
                todo.append((spelling, body))
                break
    return out


def _opens(spelling: str) -> bool:
    """Whether clang would take the file at ``spelling`` (something that exists, not a directory)."""
    try:
        return not stat.S_ISDIR(os.stat(spelling).st_mode)
    except (OSError, ValueError):  # missing, a name too long, a loop: clang looks further too
        return False


def _read(spelling: str, includer: str, limit: int) -> bytes:
    shown = os.path.normpath(spelling)
    try:
        return read_regular(spelling, limit=limit)
    except NotRegularFileError as e:
        raise PatchError(f"{shown} (included by {includer}) is {e.kind}, not a regular file: kvpatch reads "
                         "only regular files") from None  # fmt: skip
    except FileTooLargeError:
        raise PatchError(f"{shown} (included by {includer}) takes the header's includes over {MAX_BYTES} bytes: "
                         "not vLLM's header") from None  # fmt: skip
    except OSError as e:
        raise PatchError(f"cannot read {shown} (included by {includer}): {e.strerror or e}") from None


#: The tree's files a build reads besides the header and its includes: vLLM's launcher, whose
#: instantiations are the full kernel set (``kvpatch build --all``, ``plugin enable``).
BUILD_INPUTS = ("csrc/attention/paged_attention_v1.cu",)


def check_tree_files(root: str | os.PathLike[str], names: Sequence[str] = BUILD_INPUTS) -> None:
    """Each of ``names`` under ``root`` that exists is a regular file of at most
    :data:`MAX_BYTES` (:class:`PatchError` otherwise): checked before a build reads them."""
    for name in names:
        path = os.path.join(root, name)
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            continue  # missing: the build says what that means
        if not stat.S_ISREG(st.st_mode):
            raise PatchError(f"{path} is {file_kind(st.st_mode)}, not a regular file: kvpatch reads only regular files")
        if st.st_size > MAX_BYTES:
            raise PatchError(f"{path} is {st.st_size} bytes: not vLLM's (kvpatch reads at most {MAX_BYTES})")
