"""What the decode tests share: tiny model shapes, a PagedAttention written in torch from vLLM's
cache layouts, a stream API and a prefetch library that log what the controller does, and
:func:`cpu_bench`, which makes every CUDA-only call of the decode bench harmless on the CPU
(CUDA graphs replaced by the eager step, fake attention and prefetch libraries), so the real
code of kvpatch.decode runs end to end without a GPU. Needs torch (the callers skip without it)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from prefetch.prefetch_helpers import logging_controller as _logging_controller

from kvpatch.decode.models import ModelShape

MiB = 1 << 20

#: A model small enough for the CPU: 4 query heads over 2 KV heads of 16, MLP 96.
TINY = ModelShape("tiny", hidden=64, heads=4, kv_heads=2, head_size=16, intermediate=96)
#: Stand-ins under the real models' names (the bench and the sweep look models up by name).
TINY_MODELS = {
    "llama-3.1-8b": ModelShape("llama-3.1-8b", 64, 4, 2, 16, 128, 1e-5, "tiny stand-in"),
    "llama-3.2-1b": ModelShape("llama-3.2-1b", 32, 4, 2, 8, 64, 1e-5, "tiny stand-in"),
}


class ReferenceKernels:
    """PagedAttention in torch, reading vLLM's cache layouts (written from the layout
    description, not from kvpatch's writer): key [blocks, kv, head/x, block, x],
    value [blocks, kv, head, block]. ``calls`` lists the kernels launched."""

    configs = ("bf16/auto/16/16",)

    def __init__(self, log=None):
        self.calls, self.log = [], log

    def _attend(self, out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size):
        if self.log is not None:
            self.log.append(("attention",))
        nb, kv, hx, bs, x = key_cache.shape
        for s in range(query.shape[0]):
            n = int(seq_lens[s])
            blocks = block_tables[s, : -(-n // bs)].long()
            k = key_cache[blocks].permute(0, 3, 1, 2, 4).reshape(-1, kv, hx * x)[:n].float()
            v = value_cache[blocks].permute(0, 3, 1, 2).reshape(-1, kv, hx * x)[:n].float()
            for h in range(query.shape[1]):
                g = h // (query.shape[1] // num_kv_heads)
                p = torch.softmax((k[:, g] @ query[s, h].float()) * scale, dim=0)
                out[s, h] = (p @ v[:, g]).to(out.dtype)

    def v1(self, out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len,
           alibi, kv_dtype, k_scale, v_scale):  # fmt: skip
        self.calls.append("v1")
        self._attend(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size)

    def v2(self, out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads, scale, block_tables,
           seq_lens, block_size, max_seq_len, alibi, kv_dtype, k_scale, v_scale):  # fmt: skip
        self.calls.append("v2")
        self._attend(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size)


# --------------------------------------------------------------------------- a logging stream API


def logging_controller(**kw):
    """A PrefetchController on the CPU whose every stream call and launch lands in ``api.log``."""
    return _logging_controller("cpu", **kw)


# --------------------------------------------------------------------------- the decode bench on the CPU


class _Stream:
    cuda_stream = 0

    def __init__(self, name="side"):
        self.name = name

    def wait_event(self, event):
        pass

    def wait_stream(self, other):
        pass


class _Event:
    def record(self, stream=None):
        pass


class CpuAPI:
    """PrefetchController's stream/event adapter, on the CPU (streams and events do nothing;
    tables are real int64 tensors)."""

    def normalize(self, device):
        return "cpu"

    def capability(self, device):
        return (9, 0)

    def new_stream(self, device, priority):
        return _Stream()

    def new_event(self):
        return _Event()

    def current_stream(self, device):
        return _Stream("main")

    def handle(self, stream):
        return 0

    def make_table(self, ranges, device):
        return torch.tensor([list(r) for r in ranges], dtype=torch.int64).reshape(len(ranges), 2)

    @contextmanager
    def device_guard(self, device):
        yield


class PfLib:
    """The prefetch library: records launches (a prefetch changes no result)."""

    modes = ("prefetch", "demote")
    config = "chunk=4096,line=128,hint=evict_last,threads=32,demote"
    path = "fake-prefetch.so"

    def __init__(self):
        self.launches, self.runs = [], []

    def launch(self, table_ptr, rows, grid, stream, **options):
        assert rows > 0 and table_ptr
        self.launches.append((rows, grid, options.get("hint")))

    def run(self, table_ptr, rows, grid, stream, *, mode, **options):
        self.runs.append((mode, rows, grid))


class Attn:
    """An attention library: a deterministic function of q and the caches' first block."""

    def __init__(self, name):
        self.path, self.prefix = f"fake-{name}.so", f"kvpatch_{name}"
        self.configs = tuple(f"bf16/auto/{s.head_size}/16" for s in TINY_MODELS.values())
        self.scale_by_value = False

    def _out(self, out, q, kc, vc):
        out.copy_((q.float() * 0.5 + vc[0, 0, 0, 0].float()).to(out.dtype))

    def v1(self, out, q, kc, vc, *rest):
        self._out(out, q, kc, vc)

    def v2(self, out, exp_sums, max_logits, tmp_out, q, kc, vc, *rest):
        self._out(out, q, kc, vc)


class Tail:
    """A weight-tail library's table setter: records each table set."""

    def __init__(self):
        self.tables = []

    def set(self, rows, *, hint, chunk, stream):
        self.tables.append((list(rows), hint, chunk))

    def clear(self, stream=0):
        self.tables.append(([], None, None))


class Graph:
    """The eager step standing in for a captured graph."""

    def __init__(self, fn):
        self.fn = fn
        fn()

    def replay(self):
        self.fn()


class Flush:
    def __init__(self, device, l2_bytes, nbytes=None):
        self.calls = 0

    def __call__(self):
        self.calls += 1


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one CPU thread meanwhile: the step's tiny GEMMs run ten times faster than on
    threads that contend for a busy machine's cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def cpu_bench(monkeypatch):
    """Every CUDA-only call of the decode bench made harmless on the CPU; returns the attention
    libraries (stock, patched, tail, tail0), the prefetch library and the weight-tail setters."""
    from kvpatch.decode import bench as BENCH
    from kvpatch.decode import measure as MEASURE
    from kvpatch.decode import models as MODELS
    from kvpatch.gpu import flush as FL
    from kvpatch.prefetch import controller as CTL

    for name, shape in TINY_MODELS.items():
        monkeypatch.setitem(MODELS.MODELS, name, shape)
    pf = PfLib()
    tails = {"tail": Tail()}
    monkeypatch.setattr(BENCH, "cuda_device", lambda device: torch.device("cpu"))
    monkeypatch.setattr(BENCH, "prefetch_library_for", lambda lib, dev: pf)
    monkeypatch.setattr(BENCH, "weight_tails", lambda libs: {k: v for k, v in tails.items() if k in libs})
    monkeypatch.setattr(MEASURE, "capture", lambda fn, device: Graph(fn))
    monkeypatch.setattr(CTL, "TorchCudaAPI", CpuAPI)
    monkeypatch.setattr(FL, "L2Flush", Flush)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: _Stream("main"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a, **k: (1 << 40, 1 << 40))
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda d: type("P", (), {"clock_rate": 1_000_000})(), raising=False
    )
    libs = {"stock": Attn("stock"), "patched": Attn("patched"), "tail": Attn("tail"), "tail0": Attn("tail0")}
    return libs, pf, tails


# --------------------------------------------------------------------------- on a GPU


def prepared_libs(tmp_path_factory):
    """The attention libraries (``{name: Kernels}``, with ``tail0``) and the prefetch library
    (demote build) that ``bash scripts/gpu_decode.sh --prepare`` wrote into ``$KVPATCH_DECODE_LIBS``
    (``.gpu/decode`` by default); skips the caller's tests without that folder."""
    import os
    from pathlib import Path

    import pytest

    folder = Path(os.environ.get("KVPATCH_DECODE_LIBS", Path(__file__).resolve().parents[2] / ".gpu" / "decode"))
    if not (folder / "libs.txt").is_file():
        pytest.skip(f"no prepared libraries in {folder} (bash scripts/gpu_decode.sh --prepare)")
    from kvpatch.commands.decode import with_tail_copy
    from kvpatch.decode.prepare import PREFETCH_LIBRARY, unpack
    from kvpatch.gpu.launch import Kernels
    from kvpatch.prefetch.kernel import PrefetchLibrary

    files = unpack(folder, tmp_path_factory.mktemp("libs"))
    libs = {}
    for line in (folder / "libs.txt").read_text().split():
        name, _, rest = line.partition("=")
        file, _, prefix = rest.rpartition(":")
        libs[name] = Kernels(files[file], prefix)
    return with_tail_copy(libs, tmp_path_factory.mktemp("tail0")), PrefetchLibrary(files[PREFETCH_LIBRARY])
