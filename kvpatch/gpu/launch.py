"""Call a library built by :mod:`kvpatch.jit` from Python, with torch tensors.

Also the harness's side of a launch: naming libraries (``NAME=path.so:prefix``),
loading them, the output buffers (NaN-poisoned) and a launch as vLLM's op makes it.

The library exports plain C launchers (``<prefix>_paged_attention_v1`` / ``_v2``) that
take raw device pointers; :class:`Kernels` loads it with ctypes and offers the same
arguments as vLLM's torch ops ``paged_attention_v1`` / ``paged_attention_v2``. torch
is imported inside the methods only, so this module imports (and a library loads)
without it.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from .. import abi
from .. import dtypes as D
from ..errors import UsageError
from .dispatch import check_kernel

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .inputs import AttentionInputs


class Kernels:
    """One variant's launchers: ``Kernels(result.library, result.prefix)``, over the one
    ctypes binding of a launcher library (:func:`kvpatch.abi.load`), with vLLM's op arguments
    (torch tensors) checked and turned into the launchers' raw ones."""

    def __init__(self, so_path: str | Path, prefix: str) -> None:
        self.path = Path(so_path)
        self.prefix = prefix
        self._lib = abi.load(self.path, prefix)  # abi.AbiError is a RuntimeError
        #: True when the release's kernels take k_scale/v_scale by value (vLLM 0.6.4).
        self.scale_by_value = self._lib.scale_by_value
        #: The configurations built: 'dtype/kv_cache_dtype/head_size/block_size'.
        self.configs: tuple[str, ...] = self._lib.configs
        self._v1, self._v2 = self._lib.v1, self._lib.v2

    def grouped_launches(self) -> int | None:
        """Launches that took the grouped form so far (``group`` > 1); None for a library
        without one, which always runs vLLM's form."""
        fn = self._lib.grouped_launches
        return None if fn is None else int(fn())

    @classmethod
    def from_build(cls, result: Any) -> Kernels:
        """From a :class:`kvpatch.jit.VariantResult`."""
        return cls(result.library, result.prefix)

    def __repr__(self) -> str:
        return f"Kernels({str(self.path)!r}, {self.prefix!r})"

    def error_string(self, code: int) -> str:
        return self._lib.error_string(code)

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

        qd = D.by_torch_name(str(query.dtype))
        if qd is None:
            names = ", ".join(d.torch for d in D.QUERY_DTYPES.values())
            raise ValueError(f"unsupported query dtype {query.dtype}: use one of {names}")
        dtype_name, dtype = qd.name, qd.code
        if out.dtype != query.dtype:
            raise ValueError(f"out is {out.dtype} but query is {query.dtype}")
        kv = D.kv_cache_dtype(kv_cache_dtype)  # ValueError naming the choices
        kv_name, kv_code = kv.name, kv.code
        for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens)):
            if t.dtype != torch.int32:
                raise ValueError(f"{name} must be int32, not {t.dtype}")
        num_seqs, num_heads, head_size = (int(s) for s in query.shape)
        device = query.device
        if self.scale_by_value and not isinstance(k_scale, torch.Tensor) and not isinstance(v_scale, torch.Tensor):
            # vLLM 0.6.4's kernels take the scales by value: host numbers need no device
            # tensor and no sync (the pointers are not read by those kernels).
            k_ptr, k_val, v_ptr, v_val = None, float(k_scale), None, float(v_scale)
        else:
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
            built = ", ".join(self.configs[:6]) + (
                f", ... ({len(self.configs)} in all)" if len(self.configs) > 6 else ""
            )
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
            raise ValueError(
                f"k_scale/v_scale must be a 1-element float32 tensor, not {scale.dtype} {tuple(scale.shape)}"
            )
        return scale


# --------------------------------------------------------------------------- naming and loading libraries


@dataclass(frozen=True)
class LibSpec:
    """A prebuilt library given as ``NAME=path.so:prefix`` (``kvpatch bench --lib``)."""

    name: str
    path: str
    prefix: str

    def __str__(self) -> str:
        return f"{self.name}={self.path}:{self.prefix}"


def parse_lib_spec(spec: str) -> LibSpec:
    """``NAME=path.so:prefix`` -> a :class:`LibSpec`; the path may itself hold ':'."""
    name, eq, rest = spec.partition("=")
    path, colon, prefix = rest.rpartition(":")
    if not eq or not name.strip() or not colon or not path or not prefix.strip():
        raise UsageError(f"invalid library spec {spec!r}: expected NAME=path.so:prefix")
    check_lib_name(name.strip())
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", prefix.strip()):  # the library's symbols are PREFIX_...
        raise UsageError(f"invalid library spec {spec!r}: its prefix {prefix.strip()!r} is no C name "
                         "(letters, digits and '_', not first a digit)")  # fmt: skip
    return LibSpec(name.strip(), path, prefix.strip())


#: The A/A control's name: the baseline's kernels timed again as one more variant (``bench --aa``),
#: stock's decode step captured again (``bench-decode``). No library may take it.
AA = "stock-aa"


def check_lib_name(name: str) -> str:
    """A library's name is a table column, a JSON key and part of derived names
    (:data:`AA`, ``NAME+wpf``): letters, digits, ``_``, ``.`` and ``-``, first a letter
    or digit, and not :data:`AA` (:class:`~kvpatch.errors.UsageError` otherwise)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise UsageError(f"invalid library name {name!r}: use letters, digits, '_', '.' and '-'")
    if name == AA:
        raise UsageError(f"a library is named {AA!r}, the A/A control's name: rename it")
    return name


def parse_lib_specs(specs: Iterable[str]) -> list[LibSpec]:
    """Several specs (each may also be a comma-separated list); names must be unique. A spec given
    empty (``--lib ''``, an unset shell variable) is refused, not dropped: a command without
    libraries builds its own from the tree."""
    specs = list(specs)
    if any(not str(spec).replace(",", "").strip() for spec in specs):
        raise UsageError("--lib is empty (an unset shell variable?): give NAME=PATH.so:PREFIX")
    out = [parse_lib_spec(part.strip()) for spec in specs for part in spec.split(",") if part.strip()]
    names = [s.name for s in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"library name(s) given twice: {', '.join(dup)}")
    return out


def lib_info(path: str | os.PathLike[str], prefix: str) -> dict[str, Any]:
    """Provenance of one library for a report: path, prefix, size and sha256."""
    p = Path(path)
    info: dict[str, Any] = {"so": str(p), "prefix": prefix}
    try:
        data = p.read_bytes()
    except OSError as e:
        info["error"] = str(e)
        return info
    info["bytes"] = len(data)
    info["sha256"] = hashlib.sha256(data).hexdigest()
    return info


def load_libs(specs: Iterable[LibSpec]) -> dict[str, Kernels]:
    """Load the specs as :class:`Kernels`, in order."""
    return {s.name: Kernels(s.path, s.prefix) for s in specs}


def config_label(dtype: str, kv_cache_dtype: str, head_size: int, block_size: int) -> str:  # noqa: D103
    """The build's name of one instantiation: ``'fp16/auto/128/16'`` (KernelConfig.label)."""
    return f"{dtype}/{kv_cache_dtype}/{head_size}/{block_size}"


def is_built(lib: Any, label: str) -> bool | None:
    """True / False when the library lists its configurations, None when it does not."""
    cfgs = getattr(lib, "configs", None)
    return None if cfgs is None else label in tuple(cfgs)


def order_variants(names: Iterable[str], baseline: str = "stock") -> list[str]:
    """The baseline first (``stock``, else the first name), then the rest in given order."""
    names = list(names)
    if not names:
        raise UsageError("no libraries given")
    base = baseline if baseline in names else names[0]
    return [base] + [n for n in names if n != base]


# --------------------------------------------------------------------------- buffers and launches


@dataclass
class OutputBuffers:
    """``out`` for v1 and v2; the v2 scratch (exp_sums, max_logits, tmp_out) for v2.

    v2 scratch: exp_sums / max_logits float32 ``[num_seqs, num_heads, partitions]``,
    tmp_out ``[num_seqs, num_heads, partitions, head_size]`` in the query dtype."""

    out: "torch.Tensor"
    exp_sums: "torch.Tensor | None" = None
    max_logits: "torch.Tensor | None" = None
    tmp_out: "torch.Tensor | None" = None

    def tensors(self) -> list["torch.Tensor"]:
        return [t for t in (self.out, self.exp_sums, self.max_logits, self.tmp_out) if t is not None]


def make_buffers(inp: "AttentionInputs", kernel: str) -> OutputBuffers:
    """Output buffers for ``kernel``, already poisoned with NaN."""
    import torch

    check_kernel(kernel)
    q = inp.query
    bufs = OutputBuffers(out=torch.empty_like(q))
    if kernel == "v2":
        p = inp.max_num_partitions
        s, h, d = q.shape
        bufs.exp_sums = torch.empty((s, h, p), dtype=torch.float32, device=q.device)
        bufs.max_logits = torch.empty((s, h, p), dtype=torch.float32, device=q.device)
        bufs.tmp_out = torch.empty((s, h, p, d), dtype=q.dtype, device=q.device)
    poison(bufs)
    return bufs


def poison(bufs: OutputBuffers) -> None:
    """Fill every buffer with NaN, so an element the kernel skipped stays NaN."""
    for t in bufs.tensors():
        t.fill_(float("nan"))


def count_unwritten(t: "torch.Tensor") -> int:
    """Elements still NaN (poisoned, never written -- or computed NaN, equally wrong)."""
    import torch

    return int(torch.isnan(t).sum().item())


def all_written(t: "torch.Tensor") -> bool:
    return count_unwritten(t) == 0


def written_partitions_mask(seq_lens: list[int], num_heads: int, max_partitions: int, device: Any) -> "torch.Tensor":
    """bool ``[num_seqs, num_heads, max_partitions]``: the v2 partitions a sequence has
    (the kernel leaves the others alone)."""
    import torch

    from .dispatch import num_partitions

    parts = torch.tensor([num_partitions(L) for L in seq_lens], device=device)
    idx = torch.arange(max_partitions, device=device)
    m = idx[None, :] < parts[:, None]
    return m[:, None, :].expand(len(seq_lens), num_heads, max_partitions)


def launch(lib: Any, kernel: str, inp: "AttentionInputs", bufs: OutputBuffers) -> bool | None:
    """One v1 or v2 call through a :class:`Kernels`, as vLLM's op would make it; whether it took
    the grouped form (the library's launch counter; None: a library without one)."""
    before = grouped_launches(lib)
    make_launcher(lib, kernel, inp, bufs)()
    after = grouped_launches(lib)
    return None if before is None or after is None else after > before


def grouped_launches(lib: Any) -> int | None:
    """The library's count of grouped-form launches so far (None: it has no grouped form)."""
    count = getattr(lib, "grouped_launches", None)
    return None if count is None else count()


def make_launcher(lib: Any, kernel: str, inp: "AttentionInputs", bufs: OutputBuffers) -> Callable[[], None]:
    """A zero-argument closure doing :func:`launch` with its arguments bound (for timing loops)."""
    # Kernels that take the scales by value (vLLM 0.6.4) get the host numbers: reading a
    # device tensor's value would sync on every launch and time the sync, not the kernel.
    by_value = getattr(lib, "scale_by_value", False)
    k_scale, v_scale = (inp.k_scale_value, inp.v_scale_value) if by_value else (inp.k_scale, inp.v_scale)
    tail = (
        inp.query, inp.key_cache, inp.value_cache, inp.num_kv_heads, inp.scale, inp.block_tables, inp.seq_lens,
        inp.block_size, inp.max_seq_len, inp.alibi_slopes, inp.kv_cache_dtype, k_scale, v_scale,
    )  # fmt: skip
    if check_kernel(kernel) == "v1":
        fn, args = lib.v1, (bufs.out, *tail)
    else:
        fn, args = lib.v2, (bufs.out, bufs.exp_sums, bufs.max_logits, bufs.tmp_out, *tail)
    return lambda: fn(*args)


def synchronize(device: "torch.device | str") -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
