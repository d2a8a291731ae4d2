"""Call a library built by :mod:`kvpatch.build` from Python, with torch tensors.

The library exports plain C launchers (``<prefix>_paged_attention_v1`` / ``_v2``) that
take raw device pointers; :class:`Kernels` loads it with ctypes and offers the same
arguments as vLLM's torch ops ``paged_attention_v1`` / ``paged_attention_v2``. torch
is imported inside the methods only, so this module imports (and a library loads)
without it.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from ..abi import ABI_VERSION

#: torch dtype name -> (kvpatch.build's name, launcher code)
DTYPE_CODES = {"float16": ("fp16", 0), "bfloat16": ("bf16", 1), "float32": ("fp32", 2)}
#: vLLM's kv_cache_dtype -> (kvpatch.build's name, launcher code)
KV_CACHE_CODES = {"auto": ("auto", 0), "fp8": ("fp8", 1), "fp8_e4m3": ("fp8", 1), "fp8_e5m2": ("fp8_e5m2", 2)}

_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
#: The arguments both launchers share, after v1's ``out`` / v2's four output pointers.
_COMMON_ARGS = [
    _P, _P, _P,  # query, key_cache, value_cache
    _I, _I, _I, _I, _F,  # num_seqs, num_heads, head_size, num_kv_heads, scale
    _P, _I, _P,  # block_tables, max_num_blocks_per_seq, seq_lens
    _I, _I, _P,  # block_size, max_seq_len, alibi_slopes
    _I, _I, _I,  # q_stride, kv_block_stride, kv_head_stride
    _I, _I,  # dtype, kv_cache_dtype
    _P, _P, _F, _F,  # k_scale_ptr, v_scale_ptr, k_scale, v_scale
    _P,  # stream
]  # fmt: skip


class Kernels:
    """One variant's launchers: ``Kernels(result.library, result.prefix)``."""

    def __init__(self, so_path: str | Path, prefix: str) -> None:
        self.path = Path(so_path)
        self.prefix = prefix
        try:
            self._lib = ctypes.CDLL(str(self.path))
        except OSError as e:
            raise RuntimeError(f"cannot load {self.path}: {e}") from None
        version = self._fn("abi_version", [], _I)()
        if version != ABI_VERSION:
            raise RuntimeError(f"{self.path} has launcher ABI {version}, this kvpatch expects {ABI_VERSION}: rebuild it")
        #: True when the release's kernels take k_scale/v_scale by value (vLLM 0.6.4).
        self.scale_by_value = bool(self._fn("scale_by_value", [], _I)())
        #: The configurations built: 'dtype/kv_cache_dtype/head_size/block_size'.
        self.configs: tuple[str, ...] = tuple(self._fn("configs", [], ctypes.c_char_p)().decode().split(","))
        self._error_string = self._fn("error_string", [_I], ctypes.c_char_p)
        self._v1 = self._fn("paged_attention_v1", [_P, *_COMMON_ARGS], _I)
        self._v2 = self._fn("paged_attention_v2", [_P, _P, _P, _P, *_COMMON_ARGS], _I)

    @classmethod
    def from_build(cls, result: Any) -> Kernels:
        """From a :class:`kvpatch.build.VariantResult`."""
        return cls(result.library, result.prefix)

    def __repr__(self) -> str:
        return f"Kernels({str(self.path)!r}, {self.prefix!r})"

    def _fn(self, name: str, argtypes: list, restype: Any) -> Any:
        try:
            fn = getattr(self._lib, f"{self.prefix}_{name}")
        except AttributeError:
            raise RuntimeError(f"{self.path} has no {self.prefix}_{name}: wrong prefix?") from None
        fn.argtypes = argtypes
        fn.restype = restype
        return fn

    def error_string(self, code: int) -> str:
        return self._error_string(code).decode()

    # ----------------------------------------------------------------------- ops

    def v1(self, out, query, key_cache, value_cache, num_kv_heads: int, scale: float,
           block_tables, seq_lens, block_size: int, max_seq_len: int, alibi_slopes,
           kv_cache_dtype: str, k_scale, v_scale) -> None:  # fmt: skip
        """vLLM's ``paged_attention_v1``: one CTA per (head, sequence)."""
        self._call("v1", self._v1, [out.data_ptr()], out, query, key_cache, value_cache, num_kv_heads,
                   scale, block_tables, seq_lens, block_size, max_seq_len, alibi_slopes,
                   kv_cache_dtype, k_scale, v_scale)  # fmt: skip

    def v2(self, out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads: int,
           scale: float, block_tables, seq_lens, block_size: int, max_seq_len: int, alibi_slopes,
           kv_cache_dtype: str, k_scale, v_scale) -> None:  # fmt: skip
        """vLLM's ``paged_attention_v2``: partitions of 512 tokens, then the reduce kernel."""
        outputs = [out.data_ptr(), exp_sums.data_ptr(), max_logits.data_ptr(), tmp_out.data_ptr()]
        self._call("v2", self._v2, outputs, out, query, key_cache, value_cache, num_kv_heads,
                   scale, block_tables, seq_lens, block_size, max_seq_len, alibi_slopes,
                   kv_cache_dtype, k_scale, v_scale)  # fmt: skip

    def _call(self, kind, fn, outputs, out, query, key_cache, value_cache, num_kv_heads, scale,
              block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype,
              k_scale, v_scale) -> None:  # fmt: skip
        import torch

        dtype_name, dtype = DTYPE_CODES.get(str(query.dtype).removeprefix("torch."), ("", None))
        if dtype is None:
            raise ValueError(f"unsupported query dtype {query.dtype}: use float16, bfloat16 or float32")
        if out.dtype != query.dtype:
            raise ValueError(f"out is {out.dtype} but query is {query.dtype}")
        kv_name, kv_code = KV_CACHE_CODES.get(kv_cache_dtype, ("", None))
        if kv_code is None:
            raise ValueError(f"unsupported kv_cache_dtype {kv_cache_dtype!r}: use {', '.join(KV_CACHE_CODES)}")
        for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens)):
            if t.dtype != torch.int32:
                raise ValueError(f"{name} must be int32, not {t.dtype}")
        num_seqs, num_heads, head_size = (int(s) for s in query.shape)
        device = query.device
        k_scale = self._scale(k_scale, device)  # tensors now, alive until the launch
        v_scale = self._scale(v_scale, device)
        k_ptr, k_val = k_scale.data_ptr(), float(k_scale.item()) if self.scale_by_value else 1.0
        v_ptr, v_val = v_scale.data_ptr(), float(v_scale.item()) if self.scale_by_value else 1.0
        with torch.cuda.device(device):
            stream = torch.cuda.current_stream(device).cuda_stream
            rc = fn(
                *outputs,
                query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
                num_seqs, num_heads, head_size, int(num_kv_heads), float(scale),
                block_tables.data_ptr(), int(block_tables.size(1)), seq_lens.data_ptr(),
                int(block_size), int(max_seq_len),
                alibi_slopes.data_ptr() if alibi_slopes is not None else None,
                int(query.stride(0)), int(key_cache.stride(0)), int(key_cache.stride(1)),
                dtype, kv_code,
                k_ptr, v_ptr, k_val, v_val,
                stream,
            )  # fmt: skip
        if rc != 0:
            config = f"{dtype_name}/{kv_name}/{head_size}/{block_size}"
            built = ", ".join(self.configs[:6]) + (f", ... ({len(self.configs)} in all)" if len(self.configs) > 6 else "")
            raise RuntimeError(
                f"{self.prefix} paged_attention_{kind} failed for dtype/kv_cache_dtype/head_size/block_size "
                f"{config}: {self.error_string(rc)} (error {rc}; built: {built})"
            )

    def _scale(self, scale, device):
        """A k/v scale as the 1-element float32 device tensor vLLM passes (numbers allowed).

        Its host value is read (a device sync) only for kernels that take it by value.
        """
        import torch

        if not isinstance(scale, torch.Tensor):
            return torch.tensor([float(scale)], dtype=torch.float32, device=device)
        if scale.dtype != torch.float32 or scale.numel() != 1:
            raise ValueError(f"k_scale/v_scale must be a 1-element float32 tensor, not {scale.dtype} {tuple(scale.shape)}")
        return scale
