"""The launcher ABI: the C interface between a built kernel library and the runtime.

``kvpatch.jit`` renders launchers (``templates/build/launcher.cu.j2``) that return
:data:`ABI_VERSION` from ``<prefix>_abi_version()``; a library with another is refused.
Bump it whenever the template's exported functions change.

This module is the one place that knows the C signatures: the parameter tables
below (name and C type, in order) give the ctypes prototypes, and
:func:`load` / :class:`LauncherLibrary` is the one ctypes binding of a library.
It imports the standard library only (no torch): the callers pass raw device
pointers, ints and floats. :func:`open_library` is the one ``ctypes.CDLL`` of a library file
kvpatch is given (this module's, the prefetch kernel's, a weight-tail library's), and
:func:`c_argument` the one check of an int before ctypes takes it.

Exported by every library (``<prefix>`` is the variant's symbol prefix):

* ``int <prefix>_paged_attention_v1(V1_PARAMS...)`` and ``..._v2(V2_PARAMS...)``:
  0 on success, a ``cudaError_t`` value, or :data:`NOT_BUILT` (-1) for a
  configuration the library was not built with; launched on ``stream``.
* ``int <prefix>_abi_version()``, ``int <prefix>_scale_by_value()`` (1: the kernels
  take ``k_scale``/``v_scale`` by value, vLLM 0.6.4), ``const char* <prefix>_configs()``
  (``'dtype/kv_cache_dtype/head_size/block_size'`` joined by ``,``) and
  ``const char* <prefix>_error_string(int)``.

Exported only by a library whose header holds the grouped form (``group`` > 1 somewhere), and
optional here (a library without it is still this ABI):

* ``long long <prefix>_grouped_launches()``: how many launches took the grouped form so far
  (the rest ran vLLM's form; both give the same output, so only this tells them apart).
"""

from __future__ import annotations

import ctypes
import operator
import os
from pathlib import Path
from typing import Any

from .errors import BuildError, KvpatchError, UsageError

ABI_VERSION = 1

#: What the launchers return for a configuration the library was not built with.
NOT_BUILT = -1

#: The parameters both launchers share, after v1's ``out`` / v2's four output pointers.
COMMON_PARAMS: tuple[tuple[str, str], ...] = (
    ("query", "const void*"), ("key_cache", "const void*"), ("value_cache", "const void*"),
    ("num_seqs", "int"), ("num_heads", "int"), ("head_size", "int"), ("num_kv_heads", "int"),
    ("scale", "float"),
    ("block_tables", "const int*"), ("max_num_blocks_per_seq", "int"), ("seq_lens", "const int*"),
    ("block_size", "int"), ("max_seq_len", "int"), ("alibi_slopes", "const float*"),
    ("q_stride", "int"), ("kv_block_stride", "int"), ("kv_head_stride", "int"),
    ("dtype", "int"), ("kv_cache_dtype", "int"),
    ("k_scale_ptr", "const float*"), ("v_scale_ptr", "const float*"), ("k_scale", "float"), ("v_scale", "float"),
    ("stream", "void*"),
)  # fmt: skip
V1_PARAMS: tuple[tuple[str, str], ...] = (("out", "void*"), *COMMON_PARAMS)
V2_PARAMS: tuple[tuple[str, str], ...] = (
    ("out", "void*"), ("exp_sums", "float*"), ("max_logits", "float*"), ("tmp_out", "void*"), *COMMON_PARAMS,
)  # fmt: skip

_SCALARS = {"int": ctypes.c_int, "float": ctypes.c_float}


def ctype(c_type: str) -> Any:
    """The ctypes type of one parameter's C type: ``int``, ``float``, or a pointer."""
    if c_type.endswith("*"):
        return ctypes.c_void_p
    try:
        return _SCALARS[c_type]
    except KeyError:
        raise ValueError(f"no ctypes type for C type {c_type!r}") from None


def argtypes(params: tuple[tuple[str, str], ...]) -> list[Any]:
    """The ctypes ``argtypes`` of a parameter table."""
    return [ctype(t) for _, t in params]


#: The values each C type takes, as ``(low, high + 1, in words)``: what :func:`c_argument` lets through.
C_RANGES = {
    "int": (-(2**31), 2**31, "a 32-bit int"),
    "long long": (-(2**63), 2**63, "a 64-bit int"),
    "void*": (0, 2**64, "an address (an int from 0 to 2**64-1)"),
}


def exact_int(value: Any) -> int | None:
    """``value`` as an int where it is one (a numpy or torch integer scalar too), else None: never a
    bool, a float, a string or a one-element array (what ctypes and the launch tables would wrap,
    truncate or misread)."""
    if isinstance(value, bool) or getattr(value, "ndim", 0) != 0 or "bool" in str(getattr(value, "dtype", "")):
        return None  # a bool, also as a numpy or torch scalar; an array of one element is no int either
    try:
        return operator.index(value)
    except TypeError:
        return None


def c_argument(value: Any, c_type: str, what: str) -> int:
    """``value`` as an argument of C type ``c_type`` (``int``, ``long long``, ``void*``): an int (a
    numpy or torch integer too; no bool, float or string) within that type's range, else a
    one-line :class:`UsageError` naming ``what``. ctypes would wrap it, truncate it or pass
    the address of a Python buffer instead."""
    low, high, words = C_RANGES[c_type]
    n = exact_int(value)
    if n is None or not low <= n < high:
        raise UsageError(f"{what} must be {words}, not {value!r}")
    return n


def open_library(path: str | os.PathLike[str], what: str, error: type[KvpatchError]) -> ctypes.CDLL:
    """``ctypes.CDLL`` of the regular file at ``path`` (``what`` names it in errors). A path that
    is not a regular file (a directory, a FIFO, a socket, a device) is a one-line
    :class:`UsageError` before ``dlopen`` sees it: ``dlopen`` of a FIFO blocks forever. A missing
    file, or one ``dlopen`` refuses, is ``error`` in one line. A relative path is the file under
    the working directory (``dlopen`` would search the library path for a bare name)."""
    from .fsutil import check_library_file

    if not isinstance(path, (str, os.PathLike)):
        raise UsageError(f"{what} must be a path (str or os.PathLike), not {type(path).__name__}")
    shown = os.fspath(path)
    check_library_file(path, what, lambda why: error(f"cannot load {what} {shown}: {why}"))
    try:
        return ctypes.CDLL(os.path.abspath(path))
    except OSError as e:
        raise error(f"cannot load {what} {shown}: {e}") from None


class AbiError(BuildError, RuntimeError):
    """A library that cannot be used: not loadable, wrong prefix, or another ABI version (exit 5, as a
    build that failed; still a RuntimeError for the callers that catch one)."""


def config_label(dtype: str, kv_cache_dtype: str, head_size: int, block_size: int) -> str:
    """The build's name of one instantiation: ``'fp16/auto/128/16'``."""
    return f"{dtype}/{kv_cache_dtype}/{head_size}/{block_size}"


class LauncherLibrary:
    """One loaded library: its two launchers (ctypes functions with the exact prototypes)
    and what it says about itself. ``load(path, prefix)`` makes one.

    ``v1(*args)`` / ``v2(*args)`` take the arguments of :data:`V1_PARAMS` /
    :data:`V2_PARAMS` in order (pointers as ints or None) and return the launcher's
    code: 0, a ``cudaError_t``, or :data:`NOT_BUILT`.
    """

    def __init__(self, path: str | Path, prefix: str) -> None:
        self.path = Path(path)
        self.prefix = prefix
        self._lib = open_library(self.path, "the launcher library", AbiError)
        #: What ``<prefix>_abi_version()`` returned (equal to :data:`ABI_VERSION`).
        self.abi_version = int(self._fn("abi_version", [], ctypes.c_int)())
        if self.abi_version != ABI_VERSION:
            raise AbiError(
                f"{self.path} has launcher ABI {self.abi_version}, this kvpatch expects {ABI_VERSION}: rebuild it"
            )
        #: True when the release's kernels take k_scale/v_scale by value (vLLM 0.6.4).
        self.scale_by_value = bool(self._fn("scale_by_value", [], ctypes.c_int)())
        #: The configurations built: ``'dtype/kv_cache_dtype/head_size/block_size'``.
        raw = self._fn("configs", [], ctypes.c_char_p)() or b""
        self.configs: tuple[str, ...] = tuple(c for c in raw.decode().split(",") if c)
        self._error_string = self._fn("error_string", [ctypes.c_int], ctypes.c_char_p)
        self.v1 = self._fn("paged_attention_v1", argtypes(V1_PARAMS), ctypes.c_int)
        self.v2 = self._fn("paged_attention_v2", argtypes(V2_PARAMS), ctypes.c_int)
        #: ``grouped_launches()``: the grouped form's launches so far; None where the library has
        #: no grouped form (or was built by a kvpatch that did not count them).
        self.grouped_launches = (
            self._fn("grouped_launches", [], ctypes.c_longlong)
            if hasattr(self._lib, f"{prefix}_grouped_launches")
            else None
        )

    def __repr__(self) -> str:
        return f"LauncherLibrary({str(self.path)!r}, {self.prefix!r})"

    def _fn(self, name: str, types: list[Any], restype: Any) -> Any:
        try:
            fn = getattr(self._lib, f"{self.prefix}_{name}")
        except AttributeError:
            raise AbiError(f"{self.path} has no {self.prefix}_{name}: wrong prefix?") from None
        fn.argtypes = types
        fn.restype = restype
        return fn

    def error_string(self, code: int) -> str:
        """The library's text for a launcher's return code."""
        text = self._error_string(int(code))
        return text.decode(errors="replace") if text else f"error {code}"


def load(path: str | Path, prefix: str) -> LauncherLibrary:
    """Load a launcher library and check its ABI version (:class:`AbiError` otherwise)."""
    return LauncherLibrary(path, prefix)
