"""kvpatch's kernels inside an installed vLLM, through a vLLM plugin (no vLLM rebuild).

For vLLM's V0 engine, releases 0.6.4 through 0.10.x (``VLLM_USE_V1=0
VLLM_ATTENTION_BACKEND=XFORMERS``): there the decode step's only CUDA caller of
``torch.ops._C.paged_attention_v1/v2`` is ``PagedAttention.forward_decode``.

* :mod:`.bundle`: what ``kvpatch plugin enable`` installs (the library and ``bundle.json``).
* :mod:`.schema`: the ops' schema texts, read from ``torch_bindings.cpp``, compared live.
* :mod:`.checks`: every check, as a :class:`Decision` (what ``kvpatch plugin status`` prints).
* :mod:`.plugin`: :func:`register`, the ``vllm.general_plugins`` entry point.
* :mod:`.kernel`: the registered functions, calling the library's launchers.
``kvpatch plugin check`` (bit-identity and timing on a GPU) is :mod:`kvpatch.gpu.plugin_check`.

``KVPATCH_DISABLE=1`` keeps vLLM's own kernels. Importing this package imports the
standard library and kvpatch's ``abi``, ``dtypes`` and ``errors`` only: no torch,
no CUDA.
"""

from .bundle import (
    BundleError,
    KernelSet,
    Manifest,
    bundle_dir,
    missing_configs,
    read_bundle,
    remove_bundle,
    write_bundle,
)
from .checks import ENV_DISABLE, Decision, Target, kernels_logged
from .plugin import decide, register, registration, reset, set_default_target, unregister
from .schema import OPS, schema_mismatch, schemas_from_bindings

__all__ = [
    "BundleError", "Decision", "ENV_DISABLE", "KernelSet", "Manifest", "OPS", "Target", "bundle_dir", "decide",
    "kernels_logged",
    "missing_configs", "read_bundle", "register", "registration", "remove_bundle", "reset", "schema_mismatch",
    "schemas_from_bindings", "set_default_target", "unregister", "write_bundle",
]  # fmt: skip
