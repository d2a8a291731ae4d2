"""Run a release's own Python (its source tree on sys.path) with the plugin, on CPU.

``python vllm_driver.py TREE ENTRY_POINTS_DIR``: vLLM's real ``load_general_plugins()``
finds the plugin through ``ENTRY_POINTS_DIR``'s ``*.dist-info/entry_points.txt`` and
calls ``kvpatch.vllm_plugin:register``; then ``vllm._custom_ops.paged_attention_v1/v2``
and ``PagedAttention.forward_decode`` are called with CPU tensors. Prints one
``REPORT {json}`` line. The bundle comes from ``$KVPATCH_PLUGIN_DIR``.

Stubbed, and why (everything else is the release's own code: ``vllm.plugins``,
``vllm.envs``, ``vllm.logger``, ``vllm.scalar_type``, ``vllm.triton_utils``,
``vllm._custom_ops``, ``vllm.attention.ops.paged_attn``, ``vllm/version.py``):

* ``vllm`` and ``vllm.attention`` / ``vllm.attention.ops``: package modules with the
  tree's ``__path__`` but without running their ``__init__``, which import the engine,
  model layers and attention backends (transformers, cachetools, zmq, ... are not
  installed here, and none of it is on the path under test);
* ``vllm.platforms``: ``current_platform`` says CUDA (``is_cuda()`` and ``is_cuda_alike()``
  true, every other ``is_*()`` false): the real module probes NVML / ROCm / TPU libraries and imports
  ``vllm.utils`` (cachetools, psutil, ...);
* ``vllm._C``: vLLM's compiled extension is not built here; a meta-path finder
  supplies it on first import, defining ``_C::paged_attention_v1/v2`` from the tree's
  own ``csrc/torch_bindings.cpp`` text with a CPU kernel writing 1.0 (vLLM's kernel),
  so the plugin's ``import vllm._C`` is what brings the ops in, as in vLLM;
* the plugin's target: the CPU dispatch key (CPU torch has no CUDA), a fake launcher
  library writing 2.0 (standin.FakeLauncher) and CPU device operations.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path

TREE, ENTRY_POINTS = Path(sys.argv[1]), sys.argv[2]
sys.path.insert(0, ENTRY_POINTS)
sys.path.append(str(TREE))

import standin as S  # noqa: E402
import torch  # noqa: E402

from kvpatch.vllm_plugin import schemas_from_bindings  # noqa: E402


def package(name: str, path: Path) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    mod.__file__ = str(path / "__init__.py")
    sys.modules[name] = mod
    return mod


vllm = package("vllm", TREE / "vllm")
package("vllm.attention", TREE / "vllm" / "attention")
package("vllm.attention.ops", TREE / "vllm" / "attention" / "ops")


class _Platform:
    def is_cuda(self) -> bool:
        return True

    def is_cuda_alike(self) -> bool:
        return True

    def __getattr__(self, name: str):
        if name.startswith("is_"):
            return lambda *a, **k: False
        raise AttributeError(name)


platforms = types.ModuleType("vllm.platforms")
platforms.current_platform = _Platform()
sys.modules["vllm.platforms"] = platforms

TEXTS = schemas_from_bindings((TREE / "csrc" / "torch_bindings.cpp").read_text(encoding="utf-8"))
STOCK_CALLS: list = []
_keep: list = []


class _ExtensionFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``vllm._C``: defines the ops (and vLLM's CPU stand-in kernel) when imported."""

    def find_spec(self, fullname, path, target=None):
        return importlib.machinery.ModuleSpec(fullname, self) if fullname == "vllm._C" else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        _keep.append(S.define_ops("_C", TEXTS, STOCK_CALLS))


sys.meta_path.insert(0, _ExtensionFinder())

from vllm.version import __version__  # noqa: E402  (the tree's own _version.py)

vllm.__version__ = __version__

from kvpatch.vllm_plugin import Target, plugin  # noqa: E402

FLOAT = TEXTS == S.FLOAT_SCALES
launcher = S.FakeLauncher(S.SMALL_SET.labels(), scale_by_value=FLOAT)
plugin.set_default_target(Target(dispatch_key="CPU", load_library=lambda path, prefix: launcher,
                                 device=S.CpuDevice()))  # fmt: skip
assert "vllm._C" not in sys.modules

from vllm.plugins import load_general_plugins  # noqa: E402

for _ in range(int(os.environ.get("LOADS", "1"))):
    load_general_plugins()

from vllm import _custom_ops as ops  # noqa: E402
from vllm.attention.ops.paged_attn import PagedAttention  # noqa: E402

results: dict[str, float] = {}
for kind, max_seq_len in (("v1", 40), ("v2", 1000)):
    args = S.make_args(kind, float_scales=FLOAT, max_seq_len=max_seq_len)
    getattr(ops, f"paged_attention_{kind}")(*args)
    results[f"custom_ops {kind}"] = float(args[0].flatten()[0])
    # forward_decode: 4 heads x 2 sequences, so max_seq_len 40 takes v1 and 1000 (2 partitions) v2
    query, key_cache, value_cache = args[-18], args[-17], args[-16]
    block_tables, seq_lens, alibi, kv, ks, vs = args[-13], args[-12], args[-9], args[-8], args[-7], args[-6]
    out = PagedAttention.forward_decode(query, key_cache, value_cache, block_tables, seq_lens, max_seq_len, kv,
                                        2, 0.125, alibi, ks, vs)  # fmt: skip
    results[f"forward_decode {kind}"] = float(out.flatten()[0])

d = plugin.decide()
print("REPORT " + json.dumps({
    "results": results, "launches": [k for k, _ in launcher.calls], "stock_calls": len(STOCK_CALLS),
    "decision": d.to_dict(), "version": vllm.__version__, "float_scales": FLOAT,
    "kernels": plugin.active_kernel("_C::paged_attention_v2", "CPU"),
    "cuda_initialized": torch.cuda.is_initialized(),
    "heavy": sorted(m for m in sys.modules if m.split(".")[0] in ("clang", "jinja2", "typer", "rich", "git")),
}))  # fmt: skip
