"""The L2 prefetch kernel: generated, built into a cached shared library, SASS checked,
loaded with ctypes.

The source is ``templates/prefetch/l2_prefetch.cu.j2`` rendered from a
:class:`PrefetchKernelSpec`; :func:`build_prefetch_library` hands it to kvpatch's one
JIT path (:mod:`kvpatch.jit.prefetch_plan`: the content-keyed cache under
``cache_root()/builds/<hash>``, a file lock around build-and-check, the compile flags
of every kvpatch build, the SASS check). The library exports::

    int kvpatch_l2_prefetch(const void* table, int rows, int grid, void* stream);
    int kvpatch_l2_prefetch_ex(const void* table, int rows, int grid, int threads,
                               long long chunk, int hint, void* stream);
    int kvpatch_l2_prefetch_abi_version(void);
    const char* kvpatch_l2_prefetch_config(void);
    const char* kvpatch_l2_prefetch_error_string(int code);

and, built with ``PrefetchKernelSpec(demote=True)`` (opt-in: the default source is unchanged)::

    int kvpatch_l2_prefetch_run(const void* table, int rows, int grid, int threads,
                                long long chunk, int hint, int mode, void* stream);

whose mode 0 is the prefetch, launched also with no rows (a fork's zero-byte control: the
same kernel and grid, no bytes), and mode 1 the demote: ``applypriority.global.L2::evict_normal``
on every 128-byte line of the rows (SASS ``CCTL.E.DML2``, sm_80+), which returns lines
prefetched with ``evict_last`` to normal priority without touching the data.
(``discard.global.L2`` would also end their stay, but the PTX ISA defines it as a weak write
of an unstable indeterminate value: on weights, a corruption the hardware merely happens not
to make.)

What nvcc 13.0 emits (checked after every build, :func:`kvpatch.jit.sass.check_prefetch_library`):

* sm_90 and newer: ``cp.async.bulk.prefetch.L2.global[.L2::cache_hint]`` ->
  ``UBLKPF.L2 [URa], URb[, desc[URc]]``.
* sm_80 / sm_86 / sm_89: ``prefetch.global.L2::evict_last`` -> ``CCTL.E.PML2 [R]``;
  ``prefetch.global.L2`` (and ``::evict_normal``) -> ``CCTL.E.PF2 [R]``.

Nothing here imports torch or does I/O at import time.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..abi import c_argument, exact_int, open_library
from ..arch import Arch, parse_arch_list
from ..config import MAX_SIZE
from ..errors import BuildError, UsageError

#: ``kvpatch_l2_prefetch_abi_version()``: bump when the exported functions change.
PREFETCH_ABI_VERSION = 2
#: Eviction priorities: the createpolicy hint on sm_90+, the prefetch qualifier below.
HINTS = ("evict_last", "evict_normal", "evict_first", "none")
#: The ``hint`` argument of ``kvpatch_l2_prefetch_ex`` for each name.
HINT_CODES = {"evict_last": 0, "evict_normal": 1, "evict_first": 2, "none": 3}
#: ``kvpatch_l2_prefetch_run``'s modes.
MODES = {"prefetch": 0, "demote": 1}
#: What ``applypriority.global.L2::evict_normal`` compiles to (sm_80 and sm_90 alike).
DEMOTE_SASS = "CCTL.E.DML2"
#: Threads per CTA a launch may ask for (``kvpatch_l2_prefetch_ex``).
MAX_THREADS = 1024
#: The largest chunk one bulk prefetch is given: the instruction's size limit, the same
#: one the KV patch's ``--size`` has (kvpatch.config.MAX_SIZE, 2^20 - 16).
MAX_CHUNK = MAX_SIZE
#: Environment variable naming a prebuilt library (used when the controller builds none).
LIBRARY_ENV = "KVPATCH_PREFETCH_LIB"


@dataclass(frozen=True)
class PrefetchKernelSpec:
    """What the prefetch library is built from: the per-line size (sm_80/89) and the
    defaults of a launch; chunk, hint and threads can also be given per launch
    (:meth:`PrefetchLibrary.launch`)."""

    chunk: int = 4096  # bytes per bulk prefetch (sm_90+)
    line: int = 128  # bytes per per-line prefetch (sm_80/89): the L2 line
    hint: str = "evict_last"
    threads: int = 32  # per CTA
    #: Also build the demote kernel and ``kvpatch_l2_prefetch_run`` (opt-in).
    demote: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.hint, str) or self.hint not in HINTS:
            raise UsageError(f"unknown prefetch hint {self.hint!r}: choose one of {', '.join(HINTS)}")
        if not (16 <= self.chunk <= MAX_CHUNK and self.chunk % 16 == 0):
            raise UsageError(f"prefetch chunk {self.chunk}: must be a multiple of 16 between 16 and {MAX_CHUNK}")
        if self.line not in (32, 64, 128):
            raise UsageError(f"prefetch line {self.line}: use 32, 64 or 128")
        if self.threads not in (32, 64, 128, 256):
            raise UsageError(f"prefetch threads {self.threads}: use 32, 64, 128 or 256")
        if not isinstance(self.demote, bool):
            raise UsageError(f"prefetch demote must be True or False, not {self.demote!r}")

    @property
    def marker(self) -> str:
        return f"chunk={self.chunk},line={self.line},hint={self.hint},threads={self.threads}" + (
            ",demote" if self.demote else ""
        )

    def source(self) -> str:
        from ..templating import render  # jinja2: only where the source is generated

        return (
            render(
                "prefetch/l2_prefetch.cu.j2",
                marker=self.marker,
                chunk=self.chunk,
                line=self.line,
                hint=self.hint,
                hint_code=HINT_CODES[self.hint],
                threads=self.threads,
                abi_version=PREFETCH_ABI_VERSION,
                max_chunk=MAX_CHUNK,
                demote=self.demote,
            )
            + "\n"
        )


def _archs(archs: str | Sequence[Arch]) -> list[Arch]:
    parsed = parse_arch_list(archs) if isinstance(archs, str) else list(archs)
    old = [str(a) for a in parsed if a.major < 8]
    if old:
        raise UsageError(f"the L2 prefetch needs sm_80 or newer; cannot build for {', '.join(old)}")
    return parsed


def check_launch(threads: int | None = None, chunk: int | None = None, hint: str | None = None) -> None:
    """:class:`UsageError` unless the per-launch options are ones the kernel takes."""
    for name, value in (("threads", threads), ("chunk", chunk)):
        if value is not None and exact_int(value) is None:  # a numpy or torch integer too, as everywhere
            raise UsageError(f"prefetch {name} must be an int, not {value!r}")
    if hint is not None and (not isinstance(hint, str) or hint not in HINTS):
        raise UsageError(f"unknown prefetch hint {hint!r}: choose one of {', '.join(HINTS)}")
    if chunk is not None and not (16 <= chunk <= MAX_CHUNK and chunk % 16 == 0):
        raise UsageError(f"prefetch chunk {chunk}: must be a multiple of 16 between 16 and {MAX_CHUNK}")
    if threads is not None and not (32 <= threads <= MAX_THREADS and threads % 32 == 0):
        raise UsageError(f"prefetch threads {threads}: a multiple of 32 up to {MAX_THREADS}")


def build_prefetch_library(
    archs: str | Sequence[Arch] = "9.0a",
    spec: PrefetchKernelSpec | None = None,
    *,
    cache: Path | None = None,
) -> Path:
    """Build (or find in the cache) the prefetch library for ``archs``; return its path.

    The cache directory is ``<cache>/builds/l2prefetch-<sha256 of source, flags, nvcc
    --version>`` (``cache`` defaults to :func:`kvpatch.source.cache.cache_root`); a file lock
    guards build and check, so concurrent callers build once; a cached library counts only
    when it still has the size and sha256 its ``result.json`` records. Raises
    :class:`BuildError` when nvcc or cuobjdump fails or the SASS check fails.
    """
    from ..jit.prefetch_plan import build_prefetch_library as build

    spec = spec or PrefetchKernelSpec()
    parsed = _archs(archs)
    library = build(spec.source(), spec.marker, parsed, cache=cache).library
    if spec.demote:
        check_demote_sass((library.parent / "kernel.sass").read_text(encoding="utf-8").splitlines(), parsed)
    return library


def check_demote_sass(lines: Sequence[str], archs: Sequence[Arch]) -> dict[str, int]:
    """Per arch the count of ``CCTL.E.DML2`` (the demote mode's instruction) in a prefetch
    library's SASS; :class:`BuildError` where an arch has none."""
    from ..jit.sass import sass_functions

    found: dict[str, int] = {}
    for fn in sass_functions(lines):
        found[fn.arch] = found.get(fn.arch, 0) + sum(DEMOTE_SASS in text for _, text in fn.instrs)
    for arch in archs:
        if not found.get(arch.code):
            raise BuildError(f"prefetch library: {arch.code} SASS has no {DEMOTE_SASS} (the demote mode)")
    return {a.code: found[a.code] for a in archs}


def archs_for_capability(major: int, minor: int) -> str:
    """The arch to build for a GPU of compute capability ``major.minor``."""
    if major < 8:
        raise UsageError(f"the L2 prefetch needs compute capability 8.0 or newer; this GPU has {major}.{minor}")
    return f"{major}.{minor}a" if major in (9, 10) else f"{major}.{minor}"


class PrefetchLibrary:
    """The built library, loaded with ctypes: ``launch(table_ptr, rows, grid, stream_ptr)``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._lib = open_library(path, "the L2 prefetch library", BuildError)
        self.path = Path(path)
        version = self._fn("kvpatch_l2_prefetch_abi_version", [], ctypes.c_int)()
        if version != PREFETCH_ABI_VERSION:
            raise BuildError(
                f"{self.path} has prefetch ABI {version}, this kvpatch expects {PREFETCH_ABI_VERSION}: rebuild it"
            )
        self.config: str = self._fn("kvpatch_l2_prefetch_config", [], ctypes.c_char_p)().decode()
        self._error_string = self._fn("kvpatch_l2_prefetch_error_string", [ctypes.c_int], ctypes.c_char_p)
        self._launch = self._fn(
            "kvpatch_l2_prefetch", [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p], ctypes.c_int
        )
        self._launch_ex = self._fn(
            "kvpatch_l2_prefetch_ex",
            [
                ctypes.c_void_p,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_longlong,
                ctypes.c_int,
                ctypes.c_void_p,
            ],
            ctypes.c_int,
        )
        #: The modes of :meth:`run`: both with ``PrefetchKernelSpec(demote=True)``, none without.
        self.modes: tuple[str, ...] = ()
        self._run = None
        if hasattr(self._lib, "kvpatch_l2_prefetch_run"):
            self._run = self._fn(
                "kvpatch_l2_prefetch_run",
                [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_int, ctypes.c_int,
                 ctypes.c_void_p],
                ctypes.c_int,
            )  # fmt: skip
            self.modes = tuple(MODES)

    def _fn(self, name: str, argtypes: list, restype: Any) -> Any:
        try:
            fn = getattr(self._lib, name)
        except AttributeError:
            raise BuildError(f"{self.path} has no {name}: not an L2 prefetch library") from None
        fn.argtypes, fn.restype = argtypes, restype
        return fn

    def __repr__(self) -> str:
        return f"PrefetchLibrary({str(self.path)!r}, {self.config!r})"

    def launch(
        self, table_ptr: int, rows: int, grid: int, stream_ptr: int, *,
        threads: int | None = None, chunk: int | None = None, hint: str | None = None,
    ) -> None:  # fmt: skip
        """Launch on the stream whose ``cudaStream_t`` is ``stream_ptr``; raise on error.
        ``threads`` per CTA, ``chunk`` bytes per bulk prefetch and the eviction ``hint``
        override the built-in defaults for this launch (checked by :func:`check_launch`)."""
        table_ptr, rows, grid, stream_ptr = _launch_args(table_ptr, rows, grid, stream_ptr)
        if threads is None and chunk is None and hint is None:
            rc = self._launch(table_ptr, rows, grid, stream_ptr)
        else:
            check_launch(threads, chunk, hint)
            code = -1 if hint is None else HINT_CODES[hint]
            rc = self._launch_ex(table_ptr, rows, grid, int(threads or 0), int(chunk or 0), code, stream_ptr)
        if rc != 0:
            raise RuntimeError(f"kvpatch_l2_prefetch failed: {self._error_string(rc).decode()} (error {rc})")

    def run(
        self, table_ptr: int, rows: int, grid: int, stream_ptr: int, *, mode: str = "prefetch",
        threads: int | None = None, chunk: int | None = None, hint: str | None = None,
    ) -> None:  # fmt: skip
        """``kvpatch_l2_prefetch_run``: ``mode='prefetch'`` launches the prefetch kernel even
        with ``rows == 0`` (the zero-byte control of a fork); ``mode='demote'`` returns every
        128-byte line of the rows to ``evict_normal``. Needs a library built with
        ``PrefetchKernelSpec(demote=True)`` (:attr:`modes`)."""
        if self._run is None:
            raise UsageError(
                f"{self.path} has no kvpatch_l2_prefetch_run: build it with PrefetchKernelSpec(demote=True)"
            )
        if not isinstance(mode, str) or mode not in MODES:
            raise UsageError(f"unknown prefetch mode {mode!r}: choose one of {', '.join(MODES)}")
        table_ptr, rows, grid, stream_ptr = _launch_args(table_ptr, rows, grid, stream_ptr)
        check_launch(threads, chunk, hint)
        code = -1 if hint is None else HINT_CODES[hint]
        rc = self._run(table_ptr, rows, grid, int(threads or 0), int(chunk or 0), code, MODES[mode], stream_ptr)
        if rc != 0:
            raise RuntimeError(
                f"kvpatch_l2_prefetch_run ({mode}) failed: {self._error_string(rc).decode()} (error {rc})"
            )


def _launch_args(table_ptr: Any, rows: Any, grid: Any, stream_ptr: Any) -> tuple[int, int, int, int]:
    """A launch's table address, rows, grid and ``cudaStream_t`` as the C launchers take them
    (:func:`kvpatch.abi.c_argument`: ints, never wrapped by ctypes; UsageError otherwise)."""
    return (
        c_argument(table_ptr, "void*", "prefetch launch: table_ptr"),
        c_argument(rows, "int", "prefetch launch: rows"),
        c_argument(grid, "int", "prefetch launch: grid"),
        c_argument(stream_ptr, "void*", "prefetch launch: stream_ptr"),
    )


def load_prefetch_library(
    path: str | os.PathLike[str] | None = None, *, capability: tuple[int, int] | None = None
) -> PrefetchLibrary:
    """``path``, else ``$KVPATCH_PREFETCH_LIB``, else a build for ``capability``."""
    path = path or os.environ.get(LIBRARY_ENV)
    if not path:
        if capability is None:
            raise UsageError(
                "load_prefetch_library: give a path, set $KVPATCH_PREFETCH_LIB or pass the GPU's capability"
            )
        path = build_prefetch_library(archs_for_capability(*capability))
    return PrefetchLibrary(path)
