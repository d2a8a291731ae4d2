"""The in-kernel form of the weight prefetch, host side: the table of a weight-tail library.

A launcher library built from a header patched with ``weight_tail`` (:class:`kvpatch.config.PatchConfig`;
``templates/inject/weight_tail*.cuh.j2``) prefetches, at the tail of each attention kernel
(after its value loop: every load of the CTA issued and used), the rows of a ``__constant__``
table whose key is the launch's key cache: each layer has its own cache, so the key names the
layer, and vLLM's kernel signature stays as it is. Each CTA's thread 0 issues its share of the
row's bulk prefetches (``cp.async.bulk.prefetch.L2``, chunk c to CTA c mod CTAs, with the
table's eviction hint).

The route: the table is set once per configuration, before the graph is captured, by the
library's ``<prefix>_set_weight_prefetch(rows, count, hint, chunk, stream)``
(``cudaMemcpyToSymbolAsync`` into each launcher shard's copy). A setter called per launch,
inside the graph, would put a memcpy node before every attention on the main stream's
critical path; keyed rows cost a few constant-cache reads in each CTA's tail instead.

The table belongs to the loaded library: two arms that need different tables (the in-kernel
arm and its zero-byte control) load two copies of the file (:func:`second_copy`): ``dlopen``
of another path is another instance, with its own CUDA module and its own table.

Nothing here imports torch; ctypes only.
"""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path
from typing import Iterable, Sequence

from ..abi import c_argument, open_library
from ..errors import BuildError, UsageError
from .kernel import HINT_CODES

#: What a weight-tail library exports besides the launchers.
SETTER, MAX_ROWS = "set_weight_prefetch", "weight_tail_max_rows"


class WeightTail:
    """The table setter of one loaded weight-tail library (``path`` and ``prefix`` as its
    :class:`~kvpatch.gpu.launch.Kernels` has them: ``dlopen`` of the same path is the same
    instance, so this sets the table that library's kernels read)."""

    def __init__(self, path: str | os.PathLike[str], prefix: str) -> None:
        lib = open_library(path, "the weight-tail library", BuildError)
        if not isinstance(prefix, str) or not prefix.isidentifier():
            raise UsageError(f"the weight-tail library's prefix must be a C name (str), not {prefix!r}")
        self.path, self.prefix = Path(path), prefix
        try:
            self._set = getattr(lib, f"{prefix}_{SETTER}")
            max_rows = getattr(lib, f"{prefix}_{MAX_ROWS}")
        except AttributeError:
            raise BuildError(
                f"{self.path} has no {prefix}_{SETTER}: not a weight-tail build (PatchConfig weight_tail)"
            ) from None
        self._set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p]
        self._set.restype = ctypes.c_int
        max_rows.argtypes, max_rows.restype = [], ctypes.c_int
        self.max_rows = int(max_rows())
        self._error = getattr(lib, f"{prefix}_error_string", None)
        if self._error is not None:
            self._error.argtypes, self._error.restype = [ctypes.c_int], ctypes.c_char_p
        self.rows: tuple[tuple[int, int, int], ...] = ()

    def set(
        self, rows: Iterable[Sequence[int]], *, hint: str = "evict_normal", chunk: int = 65536, stream: int = 0
    ) -> None:
        """Fill the table: ``rows`` of (key cache address, weight address, bytes); asynchronous
        on ``stream`` (a ``cudaStream_t``; never one being captured). Raises UsageError for rows
        the kernels cannot take, RuntimeError for a CUDA error."""
        rows = tuple(_row(r) for r in rows)
        check_rows(rows, self.max_rows)
        stream = c_argument(stream, "void*", "weight-tail stream")
        if not isinstance(hint, str) or hint not in HINT_CODES:
            raise UsageError(f"unknown hint {hint!r}: choose one of {', '.join(HINT_CODES)}")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or not 16 <= chunk <= 1_048_560 or chunk % 16:
            raise UsageError(f"weight-tail chunk {chunk!r}: a multiple of 16 from 16 to 1048560")
        flat = (ctypes.c_longlong * max(1, 3 * len(rows)))(*[x for r in rows for x in r])
        rc = self._set(flat, len(rows), HINT_CODES[hint], chunk, stream)
        if rc != 0:
            what = self._error(rc).decode() if self._error is not None else f"error {rc}"
            raise RuntimeError(f"{self.prefix}_{SETTER} failed: {what} (error {rc})")
        self.rows = rows

    def clear(self, stream: int = 0) -> None:
        """An empty table: the kernels' tails do nothing."""
        self.set((), stream=stream)


def _row(row: Sequence[int]) -> tuple[int, ...]:
    """One row's values as the setter's ``long long`` table takes them (ints: UsageError otherwise)."""
    row = tuple(row)
    return tuple(c_argument(x, "long long", f"weight-tail row {row!r}: each value") for x in row)


def check_rows(rows: Sequence[Sequence[int]], max_rows: int) -> None:
    """UsageError unless each row is (key, address, bytes) with a non-zero key, a 16-byte
    aligned address and size, and there are at most ``max_rows``."""
    if len(rows) > max_rows:
        raise UsageError(f"weight-tail table: {len(rows)} rows, the kernels hold {max_rows}")
    for r in rows:
        if len(r) != 3:
            raise UsageError(f"weight-tail row {r!r}: (key cache, address, bytes)")
        key, address, size = r
        if key <= 0 or address <= 0 or size <= 0 or address % 16 or size % 16 or address >= 2**63 or key >= 2**63:
            raise UsageError(
                f"weight-tail row ({key:#x}, {address:#x}, {size}): positive, address and bytes multiples of 16"
            )


def second_copy(path: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """A copy of the library at ``dest`` (a file or a folder): loaded from there it is a
    second instance, with a table of its own."""
    src, out = Path(path), Path(dest)
    if os.fspath(dest).endswith(os.sep) and not out.is_dir():  # meant as a folder: never a file of its name
        raise UsageError(f"no folder {os.fspath(dest)!r} for the second copy of {src}")
    if out.is_dir():
        out = out / f"{src.stem}-copy{src.suffix}"
    if out.resolve() == src.resolve():
        raise UsageError(f"a second copy of {src} must be another file")
    shutil.copyfile(src, out)
    return out
