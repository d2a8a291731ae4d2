"""Stand-ins for what CPU torch and this machine cannot provide, shared by the tests.

* :func:`define_ops`: a ``_C``-like namespace (``torch.library.Library(ns, "DEF")``)
  with vLLM's op schemas and a CPU kernel standing in for vLLM's C++ CUDA kernel
  (it writes 1.0 into ``out``): there is no CUDA here and no built ``vllm._C``. Being
  a Python registration, it is taken out of ``torch.library._impls``, where torch
  tracks Python kernels (C++ ones are not there); torch before 2.6 refuses a Python
  override of a kernel listed there.
* :class:`FakeLauncher`: a launcher library's Python face (``configs``,
  ``scale_by_value``, ``v1``/``v2`` taking the raw C arguments): it records each
  call and writes 2.0 into ``out`` through the pointer, so a test sees which
  kernel ran. There is no GPU to run the real library's kernels on.
* :class:`CpuDevice`: the per-call device operations (stream, current device,
  capability) for CPU tensors.

The schema texts below are the ops' interface as vLLM's ``csrc/torch_bindings.cpp``
defines it (``TENSOR_SCALES``: 0.7 onwards; ``FLOAT_SCALES``: 0.6.4); the network
tests check them against the fetched releases' own text.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
from pathlib import Path
from typing import Any

import torch

from kvpatch.abi import ABI_VERSION, V1_PARAMS, V2_PARAMS
from kvpatch.vllm_plugin import KernelSet, Target, write_bundle
from kvpatch.vllm_plugin.schema import scales_by_value

_TAIL = ("Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, float scale, "
         "Tensor block_tables, Tensor seq_lens, int block_size, int max_seq_len, Tensor? alibi_slopes, "
         "str kv_cache_dtype, {s} k_scale, {s} v_scale, int tp_rank, int blocksparse_local_blocks, "
         "int blocksparse_vert_stride, int blocksparse_block_size, int blocksparse_head_sliding_step) -> ()")  # fmt: skip


def _schemas(scale_type: str) -> dict[str, str]:
    tail = _TAIL.format(s=scale_type)
    return {
        "paged_attention_v1": "paged_attention_v1(Tensor! out, " + tail,
        "paged_attention_v2": "paged_attention_v2(Tensor! out, Tensor! exp_sums, Tensor! max_logits, "
        "Tensor! tmp_out, " + tail,
    }


TENSOR_SCALES = _schemas("Tensor")
FLOAT_SCALES = _schemas("float")
STOCK, OURS = 1.0, 2.0
_counter = itertools.count()


def unique_namespace() -> str:
    """A fresh namespace per use: torch keeps one DEF library per namespace per process."""
    return f"kvpatch_test_C_{os.getpid()}_{next(_counter)}"


def define_ops(namespace: str, schemas: dict[str, str], calls: list | None = None) -> torch.library.Library:
    """Define the ops with ``schemas`` and register the stock stand-in on CPU (keep the
    returned Library alive)."""
    lib = torch.library.Library(namespace, "DEF")

    def stock(name: str):
        def kernel(out, *args):
            if calls is not None:
                calls.append((name, args))
            out.fill_(STOCK)

        return kernel

    for op, text in schemas.items():
        lib.define(text)
        lib.impl(op, stock(op), "CPU")
        # vLLM's kernel is registered from C++, which torch's Python side does not track:
        # untrack this one too, or torch < 2.6 refuses any Python override of it.
        getattr(torch.library, "_impls", set()).discard(f"{namespace}/{op}/CPU")
    return lib


def ops(namespace: str) -> Any:
    return getattr(torch.ops, namespace)


class FakeLauncher:
    """A library's Python face: records each launch, writes ``value`` (2.0) into ``out``."""

    def __init__(self, configs: list[str], scale_by_value: bool = False, rc: int = 0, value: float = OURS) -> None:
        self.value = value
        self.configs = tuple(configs)
        self.scale_by_value = scale_by_value
        self.abi_version = ABI_VERSION
        self.prefix = "fake"
        self.rc = rc
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def _record(self, kind: str, params, args) -> int:
        assert len(args) == len(params), (kind, len(args), len(params))
        named = {name: value for (name, _), value in zip(params, args)}
        self.calls.append((kind, named))
        if self.rc == 0:
            n = named["num_seqs"] * named["num_heads"] * named["head_size"]
            if named["dtype"] == 2:  # fp32
                (ctypes.c_float * n).from_address(named["out"])[:] = [self.value] * n
            else:  # fp16 / bf16: the value's 16 bits
                dtype = torch.float16 if named["dtype"] == 0 else torch.bfloat16
                bits = int(torch.tensor([self.value], dtype=dtype).view(torch.int16)[0]) & 0xFFFF
                (ctypes.c_uint16 * n).from_address(named["out"])[:] = [bits] * n
        return self.rc

    def v1(self, *args) -> int:
        return self._record("v1", V1_PARAMS, args)

    def v2(self, *args) -> int:
        return self._record("v2", V2_PARAMS, args)

    def error_string(self, code: int) -> str:
        return "configuration not built into this library" if code == -1 else f"fake error {code}"


class CpuDevice:
    """Per-call device operations for CPU tensors (device index -1)."""

    def __init__(self, capability: tuple[int, int] = (9, 0), stream: int = 1234) -> None:
        self.cap = capability
        self.stream_value = stream
        self.asked: list[int] = []

    def stream(self, index: int) -> int:
        return self.stream_value

    def current(self) -> int:
        return -1

    def capability(self, index: int) -> tuple[int, int]:
        self.asked.append(index)
        return self.cap

    def use(self, index: int):
        return contextlib.nullcontext()


#: A small kernel set (the full one is 243 configurations): what the bundles below cover.
SMALL_SET = KernelSet(dtypes=("fp32", "fp16"), kv_cache_dtypes=("auto",), head_sizes=(32, 64), block_sizes=(16,))


def make_bundle(directory: Path, *, release: str = "0.10.2", schemas: dict[str, str] = TENSOR_SCALES,
                configs: list[str] | None = None, kernel_set: KernelSet = SMALL_SET, archs=("sm_90a",),
                library_bytes: bytes = b"\x7fELF stand-in library") -> Path:  # fmt: skip
    """A bundle whose 'library' is a small file (the launcher comes from the target)."""
    lib = directory.parent / f"{directory.name}-src.so"
    lib.write_bytes(library_bytes)
    write_bundle(
        lib, vllm_release=release, header_revision="815bd481", marker="test-marker", archs=archs, prefix="fake",
        configs=configs if configs is not None else kernel_set.labels(), kernel_set=kernel_set,
        schemas=schemas, scale_by_value=scales_by_value(schemas["paged_attention_v1"]), directory=directory,
    )  # fmt: skip
    return directory


def make_target(namespace: str, bundle: Path, launcher: Any, *, release: str = "0.10.2", device: Any = None,
                get_kernel: bool | None = None, import_ops=None) -> Target:  # fmt: skip
    return Target(
        namespace=namespace, dispatch_key="CPU", import_ops=import_ops or (lambda: None),
        vllm_version=lambda: release, load_library=lambda path, prefix: launcher,
        device=device or CpuDevice(), bundle=bundle, get_kernel=get_kernel,
    )  # fmt: skip


def make_args(kind: str = "v1", *, dtype=torch.float32, head_size: int = 32, block_size: int = 16,
              num_seqs: int = 2, num_heads: int = 4, num_kv_heads: int = 2, max_seq_len: int = 40,
              float_scales: bool = False, vert_stride: int = 0, alibi: bool = False, kv: str = "auto") -> list:  # fmt: skip
    """The op's arguments, laid out as vLLM lays them out (CPU tensors)."""
    x = 16 // torch.tensor([], dtype=dtype).element_size()
    blocks_per_seq = -(-max_seq_len // block_size)
    num_blocks = num_seqs * blocks_per_seq
    query = torch.randn(num_seqs, num_heads, head_size, dtype=dtype)
    kv_cache = torch.randn(2, num_blocks, block_size * num_kv_heads * head_size).to(dtype)
    key_cache = kv_cache[0].view(num_blocks, num_kv_heads, head_size // x, -1, x)
    value_cache = kv_cache[1].view(num_blocks, num_kv_heads, head_size, -1)
    block_tables = torch.arange(num_blocks, dtype=torch.int32).view(num_seqs, blocks_per_seq)
    seq_lens = torch.full((num_seqs,), max_seq_len, dtype=torch.int32)
    alibi_slopes = torch.rand(num_heads) if alibi else None
    scales = (1.0, 1.0) if float_scales else (torch.ones(1), torch.ones(1))
    out = torch.zeros_like(query)
    tail = [query, key_cache, value_cache, num_kv_heads, 0.125, block_tables, seq_lens, block_size, max_seq_len,
            alibi_slopes, kv, *scales, 0, 0, vert_stride, 64, 0]  # fmt: skip
    if kind == "v1":
        return [out, *tail]
    parts = -(-max_seq_len // 512)
    exp_sums = torch.zeros(num_seqs, num_heads, parts)
    return [out, exp_sums, torch.zeros_like(exp_sums), torch.zeros(num_seqs, num_heads, parts, head_size, dtype=dtype),
            *tail]  # fmt: skip
