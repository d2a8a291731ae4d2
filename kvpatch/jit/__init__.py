"""The JIT layer: generated CUDA built into cached shared libraries, SASS checked.

The modules, in the order :func:`build` runs them:

* :mod:`kvpatch.arch` (outside this package, so the GPU machine's commands read an arch
  list without libclang) reads vLLM's ``TORCH_CUDA_ARCH_LIST`` syntax into :class:`Arch`;
  :mod:`.toolchain` finds nvcc (:func:`validate_archs` asks it which archs it targets)
  and the SASS tools.
* :mod:`.spec`: :func:`make_spec` validates options into a :class:`BuildSpec` (one
  :class:`Variant` per header text, the archs, the kernel configurations).
* :mod:`.plan` turns a spec into one :class:`VariantPlan` per variant (files, nvcc
  command lines, content-hash cache key); :mod:`.signatures` reads the kernels'
  template and call arguments from the header with libclang for the launchers;
  :mod:`.flags` is the one compile-flag set (vLLM's own, :func:`vllm_nvcc_flags`).
* :mod:`.library` is the one JIT path every library takes (cache by content, lock,
  parallel nvcc, link, inspect, ``result.json`` last); :mod:`.compile`'s :func:`build`
  runs it for a spec's variants, :mod:`.prefetch_plan` for the weight-prefetch kernel.
* :mod:`.sass` reads what nvcc produced (registers/spills from ``ptxas -v``, ``UBLKPF``
  and FP ops from the SASS) into a :class:`BuildResult` (:mod:`.result`, data only).
* :mod:`.full` is ``kvpatch build --full``: vLLM's own editable install.

A build whose result is in the cache costs a libclang parse and a hash. Nothing here
does I/O at import time.
"""

from __future__ import annotations

from ..arch import Arch, parse_arch_list
from ..source.releases import HEADER
from .compile import build
from .flags import vllm_nvcc_flags
from .full import full_build_command, run_full_build
from .library import build_libraries
from .plan import TORCH_STUBS, VariantPlan, compile_flags, launcher_sources, plan, source_closure, stub_headers
from .result import PREFETCH_SASS, BuildResult, KernelInfo, StepTime, VariantResult
from .sass import demangle, describe_kernel, parse_ptxas_log, scan_sass
from .signatures import (
    KERNELS,
    KernelSignature,
    Param,
    call_arguments,
    kernel_signatures,
    scale_by_value,
    template_arguments,
)
from .spec import (
    BuildSpec,
    KernelConfig,
    Variant,
    check_jobs,
    check_vllm_tree,
    make_spec,
    patched_variants,
    vllm_kernel_set,
)
from .toolchain import Inspector, Toolchain, find_cuda_tool, find_inspector, find_nvcc, toolchain, validate_archs

__all__ = [
    "Arch", "BuildResult", "BuildSpec", "HEADER", "Inspector", "KERNELS", "KernelConfig", "KernelInfo",
    "KernelSignature", "PREFETCH_SASS", "Param", "StepTime", "TORCH_STUBS", "Toolchain", "Variant",
    "VariantPlan", "VariantResult", "build", "build_libraries", "call_arguments", "check_jobs", "check_vllm_tree", "compile_flags", "demangle",
    "describe_kernel", "find_cuda_tool", "find_inspector", "find_nvcc", "full_build_command",
    "kernel_signatures", "launcher_sources", "make_spec", "parse_arch_list", "parse_ptxas_log",
    "patched_variants", "plan", "run_full_build", "scale_by_value", "scan_sass", "source_closure",
    "stub_headers", "template_arguments", "toolchain", "validate_archs", "vllm_kernel_set", "vllm_nvcc_flags",
]  # fmt: skip
