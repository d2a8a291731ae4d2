"""The kernel call: the Python implementations registered for ``_C::paged_attention_v1/v2``.

:class:`Override` takes the op's exact arguments (vLLM 0.6.4's float ``k_scale`` /
``v_scale`` or later releases' 1-element tensors; ``tp_rank`` and the blocksparse
arguments), reads shapes, strides, dtypes and pointers (no device sync, no
allocation: vLLM passes v2's ``exp_sums`` / ``max_logits`` / ``tmp_out``) and calls
the library's launcher on the current CUDA stream, so a CUDA graph can capture it.

A call it cannot serve (blocksparse, a GPU arch the bundle lacks, a configuration
not in the library, a layout the launcher cannot take) goes to the kernel that was
registered before it, fetched with ``torch.library.get_kernel`` (torch >= 2.9); with
older torch that call raises ``RuntimeError`` naming why. What can be is cached:
the configuration lookup per (dtype, kv-cache dtype, head size, block size), the
arch verdict per device.
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import Any, Callable, Iterable, Sequence

from .. import dtypes as D
from ..abi import NOT_BUILT, config_label

logger = logging.getLogger("kvpatch.vllm_plugin")

_INT_MAX = 2**31 - 1
_FIX = "set KVPATCH_DISABLE=1 to run vLLM's own kernels"


def arch_serves(archs: Iterable[str], capability: tuple[int, int]) -> bool:
    """Whether code built for ``archs`` (``sm_90a``, ``sm_80``, ``compute_90``...) runs on a
    GPU of ``capability``: ``sm_XYa`` on X.Y only; ``sm_XY`` / ``sm_XYf`` on X.Z with
    Z >= Y; PTX (``compute_XY``) on anything from X.Y up (``compute_XYa``: X.Y only)."""
    major, minor = capability
    for arch in archs:
        m = re.fullmatch(r"(sm|compute)_(\d+)(\d)([af]?)", arch)
        if m is None:
            continue
        kind, a_major, a_minor, suffix = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        if suffix == "a":
            ok = (major, minor) == (a_major, a_minor)
        elif kind == "compute":
            ok = (major, minor) >= (a_major, a_minor)
        else:
            ok = major == a_major and minor >= a_minor
        if ok:
            return True
    return False


class CudaDevice:
    """The per-call device operations on CUDA (what a CPU test replaces)."""

    def __init__(self) -> None:
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        #: The current stream's ``cudaStream_t`` of a device index (what graph capture records).
        self.stream: Callable[[int], int] = raw if raw is not None else (
            lambda index: torch.cuda.current_stream(index).cuda_stream)  # fmt: skip
        self.current: Callable[[], int] = torch.cuda.current_device
        self.capability: Callable[[int], tuple[int, int]] = torch.cuda.get_device_capability
        self.use: Callable[[int], Any] = torch.cuda.device


class Override:
    """The two registered functions over one library (``v1`` / ``v2``; with
    ``fallbacks``, each takes the dispatch keyset first, ``with_keyset=True``)."""

    def __init__(
        self,
        launcher: Any,
        *,
        archs: Sequence[str],
        scale_by_value: bool,
        fallbacks: dict[str, Any] | None = None,
        device: Any = None,
        torch_version: str = "",
    ) -> None:
        import torch

        self.launcher = launcher
        self.archs = tuple(archs)
        self.scale_by_value = scale_by_value
        self.fallbacks = fallbacks
        self.device = device if device is not None else CudaDevice()
        self.torch_version = torch_version or torch.__version__
        self._built = frozenset(launcher.configs)
        self._launch_v1, self._launch_v2 = launcher.v1, launcher.v2
        self._int32 = torch.int32
        self._configs: dict[tuple[Any, str, int, int], Any] = {}  # -> (dtype code, kv code) | reason
        self._arch: dict[int, str | None] = {}  # device index -> reason | None
        self._told: set[tuple[str, str]] = set()

    # ------------------------------------------------------------------ registered functions

    def impl(self, kind: str) -> Callable[..., None]:
        """The function to register for ``paged_attention_<kind>``."""
        run = self._v1 if kind == "v1" else self._v2
        if self.fallbacks is not None:
            return lambda keyset, *args: run(keyset, args)
        return lambda *args: run(None, args)

    def _v1(self, keyset: Any, args: tuple) -> None:
        (out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size,
         max_seq_len, alibi_slopes, kv_cache_dtype, k_scale, v_scale, _tp_rank, _local, vert_stride,
         _sparse_block, _sliding) = args  # fmt: skip
        got = self._serve(query, key_cache, value_cache, block_tables, seq_lens, alibi_slopes, (out,),
                          kv_cache_dtype, block_size, vert_stride)  # fmt: skip
        if type(got) is str:
            return self._fallback("paged_attention_v1", got, keyset, args)
        self._launch("paged_attention_v1", self._launch_v1, (out.data_ptr(),), got, query, key_cache, value_cache,
                     num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len, alibi_slopes,
                     kv_cache_dtype, k_scale, v_scale, keyset, args)  # fmt: skip

    def _v2(self, keyset: Any, args: tuple) -> None:
        (out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads, scale, block_tables,
         seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale, v_scale, _tp_rank, _local,
         vert_stride, _sparse_block, _sliding) = args  # fmt: skip
        got = self._serve(query, key_cache, value_cache, block_tables, seq_lens, alibi_slopes,
                          (out, exp_sums, max_logits, tmp_out), kv_cache_dtype, block_size, vert_stride)  # fmt: skip
        if type(got) is str:
            return self._fallback("paged_attention_v2", got, keyset, args)
        outputs = (out.data_ptr(), exp_sums.data_ptr(), max_logits.data_ptr(), tmp_out.data_ptr())
        self._launch("paged_attention_v2", self._launch_v2, outputs, got, query, key_cache, value_cache,
                     num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len, alibi_slopes,
                     kv_cache_dtype, k_scale, v_scale, keyset, args)  # fmt: skip

    # ------------------------------------------------------------------ the launch

    def _launch(self, op, fn, outputs, codes, query, key_cache, value_cache, num_kv_heads, scale, block_tables,
                seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale, v_scale, keyset, args):  # fmt: skip
        if self.scale_by_value:  # vLLM 0.6.4: floats, read by value; the pointers are unused
            k_ptr, v_ptr, k_val, v_val = None, None, k_scale, v_scale
        else:  # 1-element float32 device tensors the kernels read
            k_ptr, v_ptr, k_val, v_val = k_scale.data_ptr(), v_scale.data_ptr(), 1.0, 1.0
        num_seqs, num_heads, head_size = query.shape
        ks = key_cache.stride()
        index = query.get_device()
        dev = self.device
        with dev.use(index) if index != dev.current() else contextlib.nullcontext():
            rc = fn(
                *outputs, query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
                num_seqs, num_heads, head_size, num_kv_heads, scale,
                block_tables.data_ptr(), block_tables.shape[1], seq_lens.data_ptr(),
                block_size, max_seq_len, alibi_slopes.data_ptr() if alibi_slopes is not None else None,
                query.stride(0), ks[0], ks[1], codes[0], codes[1],
                k_ptr, v_ptr, k_val, v_val, dev.stream(index),
            )  # fmt: skip
        if rc == 0:
            return None
        label = config_label(*self._label_parts(query, kv_cache_dtype, head_size, block_size))
        if rc == NOT_BUILT:  # the library disagrees with its own configs(): let the old kernel serve
            return self._fallback(op, f"{label} is not in the library", keyset, args)
        raise RuntimeError(f"kvpatch {op} failed for {label}: {self.launcher.error_string(rc)} (error {rc})")

    # ------------------------------------------------------------------ what it serves

    def _serve(self, query, key_cache, value_cache, block_tables, seq_lens, alibi_slopes, outs,
               kv_cache_dtype, block_size, vert_stride):  # fmt: skip
        """``(dtype code, kv-cache code)`` for a call the library serves, else why not (a str)."""
        if vert_stride > 1:
            return "blocksparse attention (blocksparse_vert_stride > 1)"
        why = _layout(query, key_cache, value_cache, block_tables, seq_lens, alibi_slopes, outs, self._int32)
        if why is not None:
            return why
        index = query.get_device()
        arch = self._arch.get(index, False)
        if arch is False:
            arch = self._arch[index] = self._arch_problem(index)
        if arch is not None:
            return arch
        key = (query.dtype, kv_cache_dtype, query.shape[2], block_size)
        got = self._configs.get(key)
        if got is None:
            got = self._configs[key] = self._config(*key)
        return got

    def _arch_problem(self, index: int) -> str | None:
        major, minor = self.device.capability(index)
        if arch_serves(self.archs, (major, minor)):
            return None
        return f"GPU {index} is sm_{major}{minor}; the bundle is built for {', '.join(self.archs) or 'no arch'}"

    def _config(self, dtype: Any, kv_cache_dtype: str, head_size: int, block_size: int) -> Any:
        qd = D.by_torch_name(str(dtype))
        if qd is None:
            return f"query dtype {dtype} is not one the kernels take"
        try:
            kv = D.kv_cache_dtype(kv_cache_dtype)
        except ValueError:
            return f"kv_cache_dtype {kv_cache_dtype!r} is not one the kernels take"
        label = config_label(qd.name, kv.name, head_size, block_size)
        if label not in self._built:
            return f"configuration {label} is not in the library"
        return (qd.code, kv.code)

    @staticmethod
    def _label_parts(query: Any, kv_cache_dtype: str, head_size: int, block_size: int) -> tuple:
        qd = D.by_torch_name(str(query.dtype))
        return (qd.name if qd else str(query.dtype), kv_cache_dtype, head_size, block_size)

    # ------------------------------------------------------------------ handing a call back

    def _fallback(self, op: str, why: str, keyset: Any, args: tuple) -> Any:
        kernel = None if self.fallbacks is None else self.fallbacks.get(op)
        if kernel is None:
            raise RuntimeError(
                f"kvpatch cannot serve this {op} call: {why}; torch {self.torch_version} cannot hand it to "
                f"vLLM's own kernel (torch.library.get_kernel needs torch 2.9 or later): {_FIX}, "
                "or rebuild and re-enable the bundle so that it covers this call"
            )
        if (op, why) not in self._told:
            self._told.add((op, why))
            logger.info("kvpatch: %s: %s; vLLM's own kernel serves such calls", op, why)
        return kernel.call_boxed(keyset, *args)


def _layout(query, key_cache, value_cache, block_tables, seq_lens, alibi_slopes, outs, int32) -> str | None:
    """Why the launcher cannot take these tensors' layout (None: it can). The kernels read
    the query by ``stride(0)`` and assume its heads and elements packed, the caches by
    the key cache's ``stride(0)`` / ``stride(1)`` and everything else dense."""
    if query.dim() != 3 or key_cache.dim() != 5 or value_cache.dim() != 4:
        return "the query, key cache or value cache does not have vLLM's number of dimensions"
    qs, ks, vs = query.stride(), key_cache.stride(), value_cache.stride()
    kz = key_cache.shape
    if qs[2] != 1 or qs[1] != query.shape[2]:
        return "the query's heads are not packed (stride(1) != head_size or stride(2) != 1)"
    if ks[4] != 1 or ks[3] != kz[4] or ks[2] != kz[3] * kz[4]:
        return "the key cache's blocks are not packed [head_size/x, block_size, x]"
    if vs[3] != 1 or vs[2] != value_cache.shape[3] or vs[0] != ks[0] or vs[1] != ks[1]:
        return "the value cache's strides are not the key cache's, packed [head_size, block_size]"
    if qs[0] > _INT_MAX or ks[0] > _INT_MAX or ks[1] > _INT_MAX:
        return "a stride does not fit the launcher's int"
    if block_tables.dtype != int32 or seq_lens.dtype != int32:
        return "block_tables or seq_lens is not int32"
    if not (block_tables.is_contiguous() and seq_lens.is_contiguous()):
        return "block_tables or seq_lens is not contiguous"
    if alibi_slopes is not None and not alibi_slopes.is_contiguous():
        return "alibi_slopes is not contiguous"
    for t in outs:
        if not t.is_contiguous():
            return "an output buffer is not contiguous"
    return None
