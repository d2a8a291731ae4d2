"""Stand in for the parts of vLLM that its kernel test imports, backed by a kvpatch library.

This file is copied (as ``kvpatch_upstream_shim.py``) into the directory where
``kvpatch validate --upstream`` runs vLLM's own ``test_paged_attention``; the root
``conftest.py`` there calls :func:`install`. It needs only torch (and, for the
library, ``kvpatch.gpu.launch`` on ``PYTHONPATH``). Environment:

* ``KVPATCH_UPSTREAM_LIB``: ``path.so:prefix`` of the library behind
  ``vllm._custom_ops.paged_attention_v1/v2`` (or ``python:module.Class:x``, an object
  with the same ``v1``/``v2`` methods: how the CPU tests drive it);
* ``KVPATCH_UPSTREAM_RECORD``: a directory; each op call appends one JSON line
  (test id, call number, sha256 of the output's bytes and of the small inputs) to
  ``record-<xdist worker>.jsonl``, so runs against different libraries can be
  compared bit for bit.

What it provides: ``vllm._custom_ops`` (``paged_attention_v1/v2`` through
``Kernels``, ``convert_fp8`` through torch's float8 types, the shared-memory query),
``vllm.platforms.current_platform`` (CUDA, ``seed_everything``),
``get_max_shared_memory_bytes`` under any ``vllm.utils*`` module, the release's own
KV-cache helpers (``create_kv_caches_with_random`` ..., extracted unchanged from its
tree into ``_vllm_helpers.py``), ``opcheck`` as a no-op (it checks torch.library
registration, which ctypes launchers do not have), and for every other name under
``vllm``/``xformers``/``tests.kernels.utils`` a placeholder that raises if used.
"""

from __future__ import annotations

import collections
import ctypes
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import random
import sys
import types
from typing import Any

ROOTS = ("vllm", "xformers")
EXACT = ("tests.kernels.utils",)
_calls: collections.Counter = collections.Counter()
_kernels: Any = None


class Missing:
    """A name the shim does not provide: fine to import, an error to use."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *a: Any, **k: Any) -> Any:
        raise RuntimeError(f"{self._name} is not provided by kvpatch's vLLM shim")

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)
        return Missing(f"{self._name}.{item}")

    def __repr__(self) -> str:
        return f"<missing {self._name}>"


# --------------------------------------------------------------------------- the library


def kernels() -> Any:
    global _kernels
    if _kernels is None:
        spec = os.environ.get("KVPATCH_UPSTREAM_LIB", "")
        path, _, prefix = spec.rpartition(":")
        if not path or not prefix:
            raise RuntimeError("KVPATCH_UPSTREAM_LIB must be path.so:prefix")
        if path.startswith("python:"):  # a Python stand-in, module.Class (the CPU tests use one)
            module, _, cls = path[len("python:") :].rpartition(".")
            _kernels = getattr(__import__(module, fromlist=[cls]), cls)()
        else:
            from kvpatch.gpu.launch import Kernels

            _kernels = Kernels(path, prefix)
    return _kernels


def _digest(*tensors: Any) -> str:
    import torch

    h = hashlib.sha256()
    for t in tensors:
        if t is None:
            h.update(b"none")
            continue
        if not isinstance(t, torch.Tensor):
            h.update(repr(t).encode())
            continue
        c = t.detach().to("cpu").contiguous()
        h.update(f"{c.dtype}{tuple(c.shape)}".encode())
        n = c.numel() * c.element_size()
        if n:
            h.update(bytes((ctypes.c_char * n).from_address(c.data_ptr())))
    return h.hexdigest()


def _sample(cache: Any) -> str:
    """A cheap fingerprint of a (large) KV cache: a strided sample of its bytes."""
    flat = cache.detach().reshape(-1).view(__import__("torch").uint8)
    return _digest(flat[:: max(1, flat.numel() // 65536)])


def _record(kind: str, out: Any, query: Any, key_cache: Any, value_cache: Any, block_tables: Any, seq_lens: Any,
            alibi_slopes: Any, scalars: tuple) -> None:  # fmt: skip
    where = os.environ.get("KVPATCH_UPSTREAM_RECORD")
    if not where:
        return
    import torch

    if out.is_cuda:
        torch.cuda.synchronize(out.device)
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
    _calls[test] += 1
    line = {
        "test": test,
        "call": _calls[test],
        "kind": kind,
        "dtype": str(out.dtype),
        "shape": list(out.shape),
        "out": _digest(out),
        "inputs": _digest(query, block_tables, seq_lens, alibi_slopes, scalars),
        "caches": _digest(_sample(key_cache), _sample(value_cache)),
    }
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, f"record-{worker}.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")


def _blocksparse(extra: tuple, kw: dict) -> None:
    # tp_rank, blocksparse_local_blocks, blocksparse_vert_stride, blocksparse_block_size, blocksparse_head_sliding_step
    vert = kw.get("blocksparse_vert_stride", extra[2] if len(extra) > 2 else 0)
    if vert and int(vert) > 1:
        raise RuntimeError("block-sparse attention is not built by kvpatch")


def paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size,
                       max_seq_len, alibi_slopes, kv_cache_dtype, k_scale, v_scale, *extra, **kw) -> None:  # fmt: skip
    _blocksparse(extra, kw)
    kernels().v1(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size,
                 max_seq_len, alibi_slopes, kv_cache_dtype, k_scale, v_scale)  # fmt: skip
    _record("v1", out, query, key_cache, value_cache, block_tables, seq_lens, alibi_slopes,
            (num_kv_heads, scale, block_size, max_seq_len, kv_cache_dtype))  # fmt: skip


def paged_attention_v2(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads, scale,
                       block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale,
                       v_scale, *extra, **kw) -> None:  # fmt: skip
    _blocksparse(extra, kw)
    kernels().v2(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads, scale,
                 block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale, v_scale)  # fmt: skip
    _record("v2", out, query, key_cache, value_cache, block_tables, seq_lens, alibi_slopes,
            (num_kv_heads, scale, block_size, max_seq_len, kv_cache_dtype))  # fmt: skip


#: Elements converted at a time by :func:`convert_fp8`: its float32 temporaries stay at 256 MiB
#: whatever the cache's size (vLLM's kernel converts in place; a whole-cache float copy is
#: several GiB per call, and test workers sharing one GPU ran out of memory on it).
CONVERT_CHUNK = 1 << 26


def convert_fp8(output, input, scale: float = 1.0, kv_dtype: str = "fp8", *, chunk: int = CONVERT_CHUNK) -> None:  # noqa: A002
    """vLLM's fp8 <-> 16/32-bit conversion (round to nearest even, as the CUDA intrinsics do)."""
    import torch

    f8 = torch.float8_e5m2 if kv_dtype == "fp8_e5m2" else torch.float8_e4m3fn
    if torch.uint8 not in (output.dtype, input.dtype):
        raise ValueError(f"convert_fp8: one side must be uint8 (got {output.dtype} and {input.dtype})")
    # vLLM's kernel converts element by element over the flat blocks (num_blocks x the
    # source's block stride), whatever shapes the two tensors are viewed with: vLLM's own
    # test passes a dequantised key cache shaped with the 16-bit x (8) for an fp8 cache (x 16).
    n = int(input.shape[0]) * int(input.stride(0))
    dst, src = output.reshape(-1)[:n], input.reshape(-1)[:n]
    for i in range(0, n, chunk):
        d, s = dst[i : i + chunk], src[i : i + chunk]
        if output.dtype == torch.uint8:
            d.copy_((s.float() / float(scale)).to(f8).view(torch.uint8))
        else:
            d.copy_((s.view(f8).float() * float(scale)).to(output.dtype))


_CUDA_DEV_ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97


def get_max_shared_memory_per_block_device_attribute(gpu: int = 0) -> int:
    import torch

    props = torch.cuda.get_device_properties(gpu)
    v = getattr(props, "shared_memory_per_block_optin", None)
    if v:
        return int(v)
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
        try:
            rt = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        raise RuntimeError("cannot query the shared memory per block: no shared_memory_per_block_optin, no libcudart")
    value = ctypes.c_int()
    rc = rt.cudaDeviceGetAttribute(ctypes.byref(value), _CUDA_DEV_ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, gpu)
    if rc != 0:
        raise RuntimeError(f"cudaDeviceGetAttribute failed with {rc}")
    return int(value.value)


def get_max_shared_memory_bytes(gpu: int = 0) -> int:
    return get_max_shared_memory_per_block_device_attribute(gpu)


class _Platform:
    device_type = "cuda"
    device_name = "cuda"

    def is_rocm(self) -> bool:
        return False

    def is_navi(self) -> bool:
        return False

    def is_cuda(self) -> bool:
        return True

    def is_cpu(self) -> bool:
        return False

    def is_cuda_alike(self) -> bool:
        return True

    def seed_everything(self, seed: int | None = None) -> None:
        if seed is not None:
            import torch

            random.seed(seed)
            try:
                import numpy as np

                np.random.seed(seed)
            except ImportError:
                pass
            torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:  # vLLM 0.22's set_random_seed
        import torch

        torch.cuda.manual_seed_all(seed)

    def get_device_capability(self, device_id: int = 0) -> Any:
        import torch

        return torch.cuda.get_device_capability(device_id)


current_platform = _Platform()


def opcheck(*args: Any, **kwargs: Any) -> None:
    """No-op: opcheck tests torch.library registration; kvpatch's launchers are ctypes functions."""


def _ops_module() -> types.ModuleType:
    m = types.ModuleType("vllm._custom_ops")
    for name in ("paged_attention_v1", "paged_attention_v2", "convert_fp8",
                 "get_max_shared_memory_per_block_device_attribute"):  # fmt: skip
        setattr(m, name, globals()[name])
    m.__getattr__ = lambda item: _missing_attr("vllm._custom_ops", item)  # type: ignore[attr-defined]
    return m


KNOWN: dict[str, Any] = {}


def _missing_attr(module: str, item: str) -> Any:
    if item.startswith("__"):
        raise AttributeError(item)
    if item in KNOWN:
        return KNOWN[item]
    return Missing(f"{module}.{item}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname in EXACT or fullname.split(".")[0] in ROOTS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        if spec.name == "vllm._custom_ops":
            m = KNOWN["_custom_ops"]
        else:
            m = types.ModuleType(spec.name)
            m.__getattr__ = lambda item, _n=spec.name: _missing_attr(_n, item)  # type: ignore[attr-defined]
        m.__path__ = []  # type: ignore[attr-defined]
        return m

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install(helpers: str = "_vllm_helpers") -> None:
    """Serve ``vllm``/``xformers``/``tests.kernels.utils`` from this shim; idempotent."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    KNOWN.update(_custom_ops=_ops_module(), current_platform=current_platform, opcheck=opcheck,
                 get_max_shared_memory_bytes=get_max_shared_memory_bytes)  # fmt: skip
    sys.meta_path.insert(0, _Finder())
    try:
        mod = __import__(helpers)
    except ImportError:
        mod = None
    if mod is not None:
        KNOWN.update({k: v for k, v in vars(mod).items() if not k.startswith("__")})
    import torch

    for name in ("paged_attention_v1", "paged_attention_v2"):  # opcheck(torch.ops._C.<op>, ...) evaluates this first
        setattr(torch.ops._C, name, globals()[name])
