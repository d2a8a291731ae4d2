"""The one table of data types: every module that names a dtype reads it from here.

A *query dtype* is the type of the query, the output and (with an ``auto`` cache) the
KV cache: vLLM instantiates its kernels with ``scalar_t`` = the C++ type below. A
*KV-cache dtype* is how the cache is stored: ``auto`` (the query dtype) or fp8
(``uint8_t`` bytes decoded in the kernel).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QueryDtype:
    """One query dtype: its name everywhere in kvpatch and what each layer calls it."""

    name: str  # 'fp16': kvpatch's name (CLI, configs, reports)
    c_type: str  # 'uint16_t': vLLM's scalar_t for it
    code: int  # the launcher ABI's dtype argument
    torch: str  # 'float16': the torch.dtype attribute
    demangled: str  # 'unsigned short': how c++filt prints c_type in a kernel name
    size: int  # bytes per element


@dataclass(frozen=True)
class KvCacheDtype:
    """One KV-cache dtype as vLLM's ``kv_cache_dtype`` string names it."""

    name: str  # 'auto' | 'fp8' | 'fp8_e5m2'
    c_type: str | None  # the cache_t, or None: the query's scalar_t
    code: int  # the launcher ABI's kv_cache_dtype argument and Fp8KVCacheDataType's value
    enum: str  # vllm::Fp8KVCacheDataType enumerator
    size: int | None  # bytes per element; None: the query dtype's


QUERY_DTYPES: dict[str, QueryDtype] = {
    d.name: d
    for d in (
        QueryDtype("fp16", "uint16_t", 0, "float16", "unsigned short", 2),
        QueryDtype("bf16", "__nv_bfloat16", 1, "bfloat16", "__nv_bfloat16", 2),
        QueryDtype("fp32", "float", 2, "float32", "float", 4),
    )
}

KV_CACHE_DTYPES: dict[str, KvCacheDtype] = {
    d.name: d
    for d in (
        KvCacheDtype("auto", None, 0, "kAuto", None),
        KvCacheDtype("fp8", "uint8_t", 1, "kFp8E4M3", 1),
        KvCacheDtype("fp8_e5m2", "uint8_t", 2, "kFp8E5M2", 1),
    )
}

#: Other spellings vLLM accepts for a KV-cache dtype.
KV_CACHE_ALIASES = {"fp8_e4m3": "fp8"}


def query_dtype(name: str) -> QueryDtype:
    """The entry for ``name`` (``fp16``...), or ``ValueError`` naming the choices."""
    try:
        return QUERY_DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}: choose one of {', '.join(QUERY_DTYPES)}") from None


def kv_cache_dtype(name: str) -> KvCacheDtype:
    """The entry for ``name`` (aliases allowed), or ``ValueError`` naming the choices."""
    try:
        return KV_CACHE_DTYPES[KV_CACHE_ALIASES.get(name, name)]
    except KeyError:
        choices = ", ".join([*KV_CACHE_DTYPES, *KV_CACHE_ALIASES])
        raise ValueError(f"unknown kv-cache dtype {name!r}: choose one of {choices}") from None


def by_torch_name(torch_name: str) -> QueryDtype | None:
    """The entry whose torch dtype is ``torch_name`` (``'float16'``, ``'torch.float16'``)."""
    name = torch_name.removeprefix("torch.")
    return next((d for d in QUERY_DTYPES.values() if d.torch == name), None)


def by_demangled(text: str) -> QueryDtype | None:
    """The entry whose C++ type c++filt prints as ``text``."""
    return next((d for d in QUERY_DTYPES.values() if d.demangled == text), None)


def cache_elem_size(dtype: str, kv_cache: str) -> int:
    """Bytes per KV-cache element of a (query dtype, KV-cache dtype) pair."""
    kv = kv_cache_dtype(kv_cache)
    return kv.size if kv.size is not None else query_dtype(dtype).size


#: The head sizes and block sizes vLLM instantiates its kernels for (every release with the
#: header; a tree's own ``paged_attention_v1.cu`` is read where one is at hand).
VLLM_HEAD_SIZES = (32, 64, 80, 96, 112, 120, 128, 192, 256)
VLLM_BLOCK_SIZES = (8, 16, 32)
