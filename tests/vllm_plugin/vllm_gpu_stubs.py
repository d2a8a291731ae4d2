"""A release's own Python on a GPU machine that has no vLLM wheel, for the plugin's GPU test.

:func:`install` (run by ``sitecustomize`` for the ``kvpatch plugin`` commands, and by the
root ``conftest.py`` of vLLM's kernel test) makes ``import vllm`` the release's source
tree: ``vllm._custom_ops``, ``vllm.envs``, ``vllm.logger``, ``vllm.plugins``,
``vllm.scalar_type``, ``vllm.triton_utils``, ``vllm.version`` and
``vllm.attention.ops.paged_attn`` are the tree's own files, unchanged. Stubbed, and why:

* the ``vllm``, ``vllm.attention``, ``vllm.attention.ops`` package ``__init__``s are not
  run (they import the engine and model layers: transformers, zmq, ... are not
  installed, and torch 2.11 is not the release's torch);
* ``vllm.platforms``: CUDA (the real module probes NVML and imports ``vllm.utils``);
* ``vllm._C``: vLLM's compiled extension is not built. On import it defines
  ``_C::paged_attention_v1/v2`` and ``_C_cache_ops::convert_fp8`` from the tree's own
  ``csrc/torch_bindings.cpp`` text; the CUDA kernel behind the paged-attention ops is
  kvpatch's *stock* twin (the release's header without kvpatch's edits, built by
  kvpatch: ``$KVPATCH_TEST_STOCK_LIB``, ``path.so:prefix``), behind convert_fp8 torch's
  float8 conversion;
* for vLLM's test only: ``vllm.utils`` (the release's KV-cache helpers, extracted
  unchanged, and the shared-memory query), ``vllm.attention.layer``,
  ``vllm.attention.backends.xformers`` and ``xformers`` (names the test module imports
  for its other tests), and ``tests.kernels.utils.opcheck`` (a no-op: it exercises
  torch.library's fake-tensor machinery, which these stand-in registrations lack).

The release's tree is ``$KVPATCH_TEST_VLLM_TREE``. Nothing happens without it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from pathlib import Path

_KEEP: list = []


def _package(name: str, path: Path) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    mod.__file__ = str(path / "__init__.py")
    sys.modules[name] = mod
    return mod


def _placeholders(name: str) -> types.ModuleType:
    from kvpatch.gpu.upstream_shim import Missing

    def missing(item: str) -> Missing:
        if item.startswith("__"):
            raise AttributeError(item)
        return Missing(f"{name}.{item}")

    mod = types.ModuleType(name)
    mod.__path__ = []
    mod.__getattr__ = missing
    sys.modules[name] = mod
    return mod


class _Capability(tuple):
    """vLLM's DeviceCapability: (major, minor) with ``to_int()`` (9.0 -> 90)."""

    def __new__(cls, major: int, minor: int):
        return super().__new__(cls, (major, minor))

    def to_int(self) -> int:
        return self[0] * 10 + self[1]


class _Platform:
    """vLLM's ``current_platform`` on CUDA: the upstream shim's, every other ``is_*`` False."""

    def __init__(self) -> None:
        from kvpatch.gpu.upstream_shim import current_platform

        self._base = current_platform

    def get_device_capability(self, device_id: int = 0):
        import torch

        major, minor = torch.cuda.get_device_capability(device_id)
        return _Capability(major, minor)

    def has_device_capability(self, capability, device_id: int = 0) -> bool:
        current = self.get_device_capability(device_id)
        return current >= tuple(capability) if isinstance(capability, tuple) else current.to_int() >= capability

    def fp8_dtype(self):
        import torch

        return torch.float8_e4m3fn

    def __getattr__(self, name: str):
        if hasattr(self._base, name):
            return getattr(self._base, name)
        if name.startswith("is_"):
            return lambda *a, **k: False
        raise AttributeError(name)


def _define_extension(tree: Path) -> None:
    """``vllm._C``: the ops from the tree's bindings text, the stock twin on CUDA."""
    import torch

    from kvpatch import abi
    from kvpatch.gpu.upstream_shim import convert_fp8
    from kvpatch.vllm_plugin import schemas_from_bindings
    from kvpatch.vllm_plugin.kernel import Override
    from kvpatch.vllm_plugin.schema import scales_by_value

    text = (tree / "csrc" / "torch_bindings.cpp").read_text(encoding="utf-8")
    schemas = schemas_from_bindings(text)
    path, _, prefix = os.environ["KVPATCH_TEST_STOCK_LIB"].rpartition(":")
    stock = Override(
        abi.load(path, prefix), archs=("sm_90a",), scale_by_value=scales_by_value(schemas["paged_attention_v1"])
    )
    lib = torch.library.Library("_C", "DEF")
    for op, schema in schemas.items():
        lib.define(schema)
        lib.impl(op, stock.impl(op[-2:]), "CUDA")
        # vLLM's kernels are registered from C++, which torch's Python side does not track
        getattr(torch.library, "_impls", set()).discard(f"_C/{op}/CUDA")
    cache = torch.library.Library("_C_cache_ops", "DEF")
    (fp8,) = schemas_from_bindings(text, ("convert_fp8",)).values()
    cache.define(fp8)
    cache.impl("convert_fp8", convert_fp8, "CUDA")
    _KEEP.extend([lib, cache, stock])


class _Extension(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, tree: Path) -> None:
        self.tree = tree

    def find_spec(self, fullname, path, target=None):
        return importlib.machinery.ModuleSpec(fullname, self) if fullname == "vllm._C" else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        _define_extension(self.tree)


def install(*, for_test: bool = False) -> bool:
    """Serve ``vllm`` from ``$KVPATCH_TEST_VLLM_TREE`` (see the module docstring); False
    without it. Idempotent."""
    tree = os.environ.get("KVPATCH_TEST_VLLM_TREE")
    if not tree:
        return False
    tree = Path(tree)
    if "vllm" not in sys.modules:
        vllm = _package("vllm", tree / "vllm")
        _package("vllm.attention", tree / "vllm" / "attention")
        _package("vllm.attention.ops", tree / "vllm" / "attention" / "ops")
        platforms = types.ModuleType("vllm.platforms")
        platforms.current_platform = _Platform()
        sys.modules["vllm.platforms"] = platforms
        sys.meta_path.insert(0, _Extension(tree))
        from vllm.version import __version__

        vllm.__version__ = __version__
    if for_test and "vllm.utils" not in sys.modules:
        from kvpatch.gpu.upstream_shim import get_max_shared_memory_bytes, opcheck
        from kvpatch.gpu.upstream_test import helper_source

        utils = types.ModuleType("vllm.utils")
        utils.get_max_shared_memory_bytes = get_max_shared_memory_bytes
        exec(compile(helper_source(tree), f"{tree}/vllm/utils (helpers)", "exec"), utils.__dict__)  # noqa: S102
        sys.modules["vllm.utils"] = utils
        for name in ("vllm.attention.layer", "vllm.attention.backends", "vllm.attention.backends.xformers",
                     "xformers", "xformers.ops", "xformers.ops.fmha", "xformers.ops.fmha.attn_bias"):  # fmt: skip
            _placeholders(name)
        import tests.kernels  # noqa: F401  (the tree's own package, from the run directory)

        kernel_utils = types.ModuleType("tests.kernels.utils")
        kernel_utils.opcheck = opcheck
        sys.modules["tests.kernels.utils"] = kernel_utils
    return True
