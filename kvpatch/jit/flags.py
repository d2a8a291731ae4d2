"""The one compile-flag set: vLLM's own nvcc flags for the paged-attention kernels.

vLLM's CMake build (``cmake/utils.cmake``, ``get_torch_gpu_compiler_flags``) compiles
``csrc/attention/paged_attention_v1.cu``/``v2.cu`` with torch's
``COMMON_NVCC_FLAGS`` minus the four ``__CUDA_NO_HALF*``/``__CUDA_NO_BFLOAT16*``
defines (CUDA >= 12.0), plus ``-DENABLE_FP8`` (CUDA >= 11.8), in C++17, under its
default build type RelWithDebInfo (``setup.py``), and without ``--use_fast_math``.
Every kvpatch build passes exactly these, whatever configurations it builds, so
``build``, ``validate``, ``bench`` and ``tune`` compile the same kernels the same way.
"""

from __future__ import annotations

#: torch.utils.cpp_extension.COMMON_NVCC_FLAGS (torch 2.x; the same list through 2.13).
TORCH_COMMON_NVCC_FLAGS = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
)
#: What vLLM removes from them (``list(REMOVE_ITEM GPU_FLAGS ...)`` for CUDA >= 12.0).
VLLM_REMOVED_TORCH_FLAGS = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
)
#: CMake's CUDA flags for RelWithDebInfo, vLLM's default build type. nvcc's ``-O`` and
#: ``-g`` apply to host code only: device code is optimized by ptxas (-O3) either way.
RELWITHDEBINFO_FLAGS = ("-O2", "-g", "-DNDEBUG")


def vllm_nvcc_flags() -> tuple[str, ...]:
    """vLLM's nvcc flags for these kernels, without the ``-gencode`` ones (see the module doc).

    ``('-std=c++17', '-O2', '-g', '-DNDEBUG', '--expt-relaxed-constexpr', '-DENABLE_FP8')``
    """
    torch_flags = tuple(f for f in TORCH_COMMON_NVCC_FLAGS if f not in VLLM_REMOVED_TORCH_FLAGS)
    return ("-std=c++17", *RELWITHDEBINFO_FLAGS, *torch_flags, "-DENABLE_FP8")
