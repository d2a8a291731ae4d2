"""Parse vLLM's attention header with libclang (the PyPI wheel, no system LLVM).

The wheel ships libclang.so but none of clang's resource headers and kvpatch has no
CUDA or torch headers to offer, so the parse runs in CUDA *device* mode for sm_90
(``__CUDA_ARCH__`` defined, so code kvpatch guards for Hopper is visible) with
``-nocudainc`` and a small virtual include set handed to libclang as unsaved files:

* empty stand-ins for the torch headers the kernel file includes,
* minimal ``stddef.h``/``stdarg.h``/``float.h``/``limits.h`` (clang's resource headers),
* a prelude (``-include``) declaring the CUDA attributes, builtin variables, vector
  types and intrinsics the kernels use.

The tree's own files the header includes are read by kvpatch, not by libclang: each is
checked to be a regular file of bounded size and handed over as an unsaved file too
(:func:`kvpatch.source.includes.included_files`), so a FIFO or a device in the tree is a
one-line refusal, never a parse that blocks. Nothing is written to disk. What remains are a few dozen diagnostics from headers that
use types kvpatch does not model; the function template and its loops parse cleanly,
and callers compare diagnostics before and after an edit rather than demand zero.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import PurePosixPath

from ..dtypes import QUERY_DTYPES
from ..errors import UsageError, text_argument
from ..source.includes import included_files
from .libclang import ci

#: Virtual directory the stand-in headers live under (never created on disk).
VIRTUAL_ROOT = "/__kvpatch_virtual__"

_EMPTY_HEADERS = (
    "torch/all.h",
    "torch/extension.h",
    "ATen/cuda/CUDAContext.h",
    "c10/cuda/CUDAGuard.h",
    "cuda_fp16.h",
    "cuda_bf16.h",
    "cuda_fp8.h",
    "cuda_runtime.h",
    "assert.h",
)

_RESOURCE_HEADERS = {
    "stddef.h": """\
#ifndef KVPATCH_STDDEF_H
#define KVPATCH_STDDEF_H
typedef __SIZE_TYPE__ size_t;
typedef __PTRDIFF_TYPE__ ptrdiff_t;
typedef long double max_align_t;
#define NULL __null
#define offsetof(t, m) __builtin_offsetof(t, m)
#endif
""",
    "stdarg.h": """\
#ifndef KVPATCH_STDARG_H
#define KVPATCH_STDARG_H
typedef __builtin_va_list va_list;
typedef __builtin_va_list __gnuc_va_list;
#define va_start(ap, param) __builtin_va_start(ap, param)
#define va_end(ap) __builtin_va_end(ap)
#define va_arg(ap, type) __builtin_va_arg(ap, type)
#define va_copy(d, s) __builtin_va_copy(d, s)
#endif
""",
    "float.h": """\
#ifndef KVPATCH_FLOAT_H
#define KVPATCH_FLOAT_H
#define FLT_MAX __FLT_MAX__
#define FLT_MIN __FLT_MIN__
#define DBL_MAX __DBL_MAX__
#define DBL_MIN __DBL_MIN__
#define FLT_EPSILON __FLT_EPSILON__
#endif
""",
    "limits.h": """\
#ifndef KVPATCH_LIMITS_H
#define KVPATCH_LIMITS_H
#define CHAR_BIT __CHAR_BIT__
#define INT_MAX __INT_MAX__
#define INT_MIN (-__INT_MAX__ - 1)
#define LONG_MAX __LONG_MAX__
#define UINT_MAX (__INT_MAX__ * 2U + 1U)
#endif
""",
}

_PRELUDE_TEMPLATE = """\
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
#define assert(x) ((void)0)
struct kvpatch_uint3 { unsigned x, y, z; };
extern const __device__ kvpatch_uint3 threadIdx, blockIdx, blockDim, gridDim;
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct int2 { int x, y; };
struct int4 { int x, y, z, w; };
struct __half { unsigned short x; };
struct __half2 { __half x, y; };
struct BF16 { unsigned short x; };
struct BF162 { BF16 x, y; };
typedef struct CUstream_st* cudaStream_t;
template <class T> __device__ T __shfl_xor_sync(unsigned, T, int, int = 32);
template <class T> __device__ T __shfl_sync(unsigned, T, int, int = 32);
__device__ float fmaxf(float, float);
__device__ float expf(float);
__device__ float __expf(float);
__device__ float __fdividef(float, float);
__device__ void __trap();
__device__ float2 make_float2(float, float);
__device__ float4 make_float4(float, float, float, float);
"""

#: The bf16 type is a struct libclang must know (its name: the dtype table's).
_PRELUDE = _PRELUDE_TEMPLATE.replace("BF16", QUERY_DTYPES["bf16"].c_type)
_PRELUDE_PATH = f"{VIRTUAL_ROOT}/kvpatch_prelude.h"

#: libclang's CXTranslationUnit_KeepGoing (keep parsing after errors in other headers) and
#: DetailedPreprocessingRecord (macro definitions become cursors: what the header defines).
_PARSE_OPTIONS = 0x200 | 0x01


def _virtual_files() -> list[tuple[str, str]]:
    files = [(f"{VIRTUAL_ROOT}/stubs/{name}", "") for name in _EMPTY_HEADERS]
    files += [(f"{VIRTUAL_ROOT}/res/{n}", t) for n, t in _RESOURCE_HEADERS.items()]
    files.append((_PRELUDE_PATH, _PRELUDE))
    return files


def include_dirs(header_path: str) -> list[str]:
    """The tree's include roots vLLM uses for ``header_path``
    (``<tree>/csrc/attention/attention_kernels.cuh``): ``csrc``, then ``csrc/attention``."""
    attention_dir = PurePosixPath(header_path).parent
    return [str(attention_dir.parent), str(attention_dir)]


def clang_args(header_path: str) -> list[str]:
    """The command line libclang parses ``header_path`` with (the tree's include roots:
    :func:`include_dirs`)."""
    return [
        "-x", "cuda", "--cuda-device-only", "--cuda-gpu-arch=sm_90",
        "-nocudainc", "-nocudalib", "-std=c++17", "-ferror-limit=0",
        *(f"-I{d}" for d in include_dirs(header_path)),
        f"-I{VIRTUAL_ROOT}/stubs", "-isystem", f"{VIRTUAL_ROOT}/res",
        "-include", _PRELUDE_PATH,
    ]  # fmt: skip


@dataclass(frozen=True)
class Parsed:
    """A parsed header: the translation unit plus the bytes it was parsed from."""

    tu: ci.TranslationUnit
    path: str
    data: bytes

    def error_messages(self) -> list[str]:
        """Error diagnostics without positions: comparable across an edit that moves lines."""
        out = []
        for d in self.tu.diagnostics:
            if d.severity >= ci.Diagnostic.Error:
                where = str(d.location.file).rsplit("/", 1)[-1]
                out.append(f"{where}: {d.spelling}")
        return sorted(out)


def parse_header(text: str, header_path: str) -> Parsed:
    """Parse ``text`` as if it were the file at ``header_path``.

    The file's own siblings (``attention_dtypes.h``...) are read from the tree, checked, by
    :func:`~kvpatch.source.includes.included_files` and handed to libclang with ``text``,
    which itself never needs to be on disk. A path that is not UTF-8 is refused (libclang
    takes UTF-8 paths only).
    """
    text_argument(text, "the header")
    text_argument(header_path, "the header's path")
    try:
        header_path.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"the header's path {header_path!r} is not UTF-8: libclang reads UTF-8 paths only; "
                         "move the tree (or run kvpatch) under a UTF-8 path") from None  # fmt: skip
    if not os.path.basename(header_path) or "\0" in header_path or os.path.isdir(header_path):
        raise UsageError(f"the header's path {header_path!r} names no file")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate (text decoded with surrogateescape, or made so)
        raise UsageError(f"the header is not UTF-8 text: {e.reason} at character {e.start}") from None
    tree = [(os.fsencode(name), body) for name, body in included_files(header_path, data, include_dirs(header_path))]
    unsaved = [(header_path, text), *tree, *_virtual_files()]
    index = ci.Index.create()
    tu = index.parse(header_path, args=clang_args(header_path), unsaved_files=unsaved, options=_PARSE_OPTIONS)
    return Parsed(tu=tu, path=header_path, data=data)
