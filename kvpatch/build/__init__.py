"""Build a variant's PagedAttention kernels into a shared library and check the SASS.

The pieces, in the order :func:`build` runs them:

* :func:`parse_arch_list` reads vLLM's ``TORCH_CUDA_ARCH_LIST`` syntax into
  :class:`Arch` values; :func:`validate_archs` asks nvcc which ones it can target.
* :class:`BuildSpec` (FlashInfer's ``JitSpec`` in spirit) says what to build: the tree,
  one :class:`Variant` per header text, the archs and the kernel configurations.
* :func:`plan` turns a spec into one :class:`VariantPlan` per variant: every file the
  build writes (the variant's header with the tree's files it includes, stub torch
  headers, the generated launcher translation units), the nvcc command lines and a
  content hash of all of it plus ``nvcc --version``; the cache directory
  ``<cache>/builds/<hash>`` is derived from that hash.
* The launcher TUs come from ``templates/launcher.cu.j2``. They are compiled with
  ``-Dvllm=kvpatch_<variant>`` so every variant's kernels carry their own symbols,
  and export ``extern "C"`` launchers named ``kvpatch_<variant>_paged_attention_v1``
  (and ``_v2``) that mirror vLLM's ``paged_attention_v1.cu``/``v2.cu``. The kernels'
  template and call arguments are read from the header with libclang
  (:func:`kernel_signatures`) because they differ between releases.
* After compiling, :func:`build` reads registers/spills from ``ptxas -v`` and the SASS
  from ``cuobjdump --dump-sass`` (kept as ``kernels.sass.gz``; the cubins are extracted
  to ``cubin/``), and checks that the patched kernels for sm_90+ hold ``UBLKPF`` and
  nothing else does. :class:`BuildResult` carries it all (``table()``, ``to_dict()``).
* :func:`full_build_command` is ``kvpatch build --full``: vLLM's own editable install.

A build whose result is in the cache costs a libclang parse and a hash. Compiler flags
follow vLLM's CMake build (no ``--use_fast_math``: vLLM does not use it for these
kernels). Nothing here does I/O at import time.
"""

from __future__ import annotations

import concurrent.futures
import functools
import gzip
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping, Sequence

import clang.cindex as ci
import filelock
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..templating import render
from ..abi import ABI_VERSION
from ..errors import BuildError, UsageError
from ..source.releases import HEADER
from ..patch.parse import parse_header

if TYPE_CHECKING:
    from ..config import PatchConfig

#: Bump when the generated code or the cache layout changes: every cache key changes.
BUILD_FORMAT = 2
#: The launcher ABI :mod:`kvpatch.gpu.launch` codes against (``<prefix>_abi_version()``).
ABI_VERSION = 1
#: The prefetch instruction in SASS and in PTX source.
PREFETCH_SASS = "UBLKPF"
PREFETCH_SOURCE = "cp.async.bulk.prefetch"

#: Scalar dtypes: name -> (C++ type in the kernels, launcher code).
DTYPES: dict[str, tuple[str, int]] = {"fp16": ("uint16_t", 0), "bf16": ("__nv_bfloat16", 1), "fp32": ("float", 2)}
#: KV-cache dtypes: name -> (cache type or None for the scalar type, launcher code, enum).
KV_CACHE_DTYPES: dict[str, tuple[str | None, int, str]] = {
    "auto": (None, 0, "kAuto"),
    "fp8": ("uint8_t", 1, "kFp8E4M3"),
    "fp8_e5m2": ("uint8_t", 2, "kFp8E5M2"),
}
KV_CACHE_ALIASES = {"fp8_e4m3": "fp8"}

DEFAULT_DTYPES = ("fp16", "bf16")
DEFAULT_HEAD_SIZES = (128,)
DEFAULT_BLOCK_SIZES = (16,)
DEFAULT_KV_CACHE_DTYPES = ("auto",)
#: What vLLM 0.6.4-0.20 instantiate, used when the tree's launcher cannot be read.
VLLM_HEAD_SIZES = (32, 64, 80, 96, 112, 120, 128, 192, 256)
VLLM_BLOCK_SIZES = (8, 16, 32)
#: Configurations per launcher translation unit: --all builds in parallel shards.
CONFIGS_PER_SHARD = 8

KERNELS = {
    "v1": "paged_attention_v1_kernel",
    "v2": "paged_attention_v2_kernel",
    "reduce": "paged_attention_v2_reduce_kernel",
}

_TORCH_STUBS = ("torch/all.h", "ATen/cuda/CUDAContext.h", "c10/cuda/CUDAGuard.h")


# --------------------------------------------------------------------------- archs


_ARCH_RE = re.compile(r"(?P<major>\d+)\.(?P<minor>\d)(?P<suffix>[af]?)(?P<ptx>\+PTX)?", re.IGNORECASE)


@dataclass(frozen=True, order=True)
class Arch:
    """One entry of ``TORCH_CUDA_ARCH_LIST``: ``9.0a`` is ``Arch(9, 0, 'a')``."""

    major: int
    minor: int
    suffix: str = ""  # 'a' (arch-specific, sm_90a) or 'f' (family, CUDA >= 12.9) or ''
    ptx: bool = False  # '+PTX': embed PTX too, for JIT on newer GPUs

    @property
    def sm(self) -> str:
        """``'90a'``."""
        return f"{self.major}{self.minor}{self.suffix}"

    @property
    def code(self) -> str:
        """The SASS target: ``'sm_90a'`` (what cuobjdump and ptxas call it)."""
        return f"sm_{self.sm}"

    @property
    def compute(self) -> str:
        """The virtual architecture: ``'compute_90a'``."""
        return f"compute_{self.sm}"

    def gencode_flags(self) -> list[str]:
        """nvcc flags: ``['-gencode=arch=compute_90a,code=sm_90a']`` (+ PTX for ``+PTX``)."""
        flags = [f"-gencode=arch={self.compute},code={self.code}"]
        if self.ptx:
            flags.append(f"-gencode=arch={self.compute},code={self.compute}")
        return flags

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}" + ("+PTX" if self.ptx else "")


def parse_arch_list(text: str) -> list[Arch]:
    """Parse ``TORCH_CUDA_ARCH_LIST`` syntax: ``'8.0;9.0a'``, ``'8.0 9.0+PTX'``.

    Entries are separated by ``;``, spaces or commas; duplicates are dropped, order
    is kept. Raises :class:`UsageError` naming the first bad entry.
    """
    entries = [e for e in re.split(r"[;,\s]+", text.strip()) if e]
    if not entries:
        raise UsageError("empty arch list: give e.g. --arch 9.0a or --arch '8.0;9.0a'")
    archs: list[Arch] = []
    for entry in entries:
        m = _ARCH_RE.fullmatch(entry)
        if m is None:
            raise UsageError(f"invalid arch {entry!r}: use TORCH_CUDA_ARCH_LIST syntax such as 8.0, 9.0a or 9.0+PTX")
        arch = Arch(int(m["major"]), int(m["minor"]), m["suffix"].lower(), bool(m["ptx"]))
        if arch.suffix == "a" and arch.major < 9:
            raise UsageError(f"invalid arch {entry!r}: the 'a' suffix exists for 9.0 and newer")
        if arch.suffix == "f" and arch.major < 10:
            raise UsageError(f"invalid arch {entry!r}: the 'f' suffix exists for 10.0 and newer")
        if arch not in archs:
            archs.append(arch)
    return archs


def prefetch_expected(arch: Arch) -> bool:
    """Whether kvpatch's guarded prefetch is compiled in for ``arch`` (sm_90 and newer)."""
    return arch.major >= 9


# --------------------------------------------------------------------------- toolchain


@dataclass(frozen=True)
class Toolchain:
    """The nvcc a build uses: its path, ``--version`` text and ``--list-gpu-arch``."""

    nvcc: Path
    version: str
    gpu_archs: tuple[str, ...]  # ('compute_75', 'compute_80', ...)

    @property
    def release(self) -> str:
        """``'13.0'`` from 'Cuda compilation tools, release 13.0, V13.0.88'."""
        m = re.search(r"release (\d+\.\d+)", self.version)
        return m.group(1) if m else "unknown"

    def supports(self, arch: Arch) -> bool:
        return f"compute_{arch.major}{arch.minor}" in self.gpu_archs

    def supported(self) -> list[str]:
        """The archs nvcc lists, in TORCH_CUDA_ARCH_LIST spelling: ``['7.5', '8.0', ...]``."""
        out = []
        for name in self.gpu_archs:
            digits = name.removeprefix("compute_")
            out.append(f"{digits[:-1]}.{digits[-1]}")
        return sorted(out, key=lambda s: tuple(int(p) for p in s.split(".")))


def find_nvcc() -> Path:
    """``$CUDA_HOME/bin/nvcc`` if that exists, else ``nvcc`` on PATH."""
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        candidate = Path(cuda_home) / "bin" / "nvcc"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("nvcc")
    if found is None:
        raise BuildError("nvcc not found on PATH (set CUDA_HOME or PATH)")
    return Path(found)


@functools.cache
def _toolchain(nvcc: str) -> Toolchain:
    version = _run_text([nvcc, "--version"])
    archs = _run_text([nvcc, "--list-gpu-arch"]).split()
    return Toolchain(Path(nvcc), version.strip(), tuple(a for a in archs if a.startswith("compute_")))


def toolchain() -> Toolchain:
    """The nvcc :func:`find_nvcc` finds; asked once per process."""
    return _toolchain(str(find_nvcc()))


def validate_archs(archs: Sequence[Arch], tc: Toolchain) -> None:
    """Raise :class:`BuildError` for an arch this nvcc cannot compile for."""
    bad = [a for a in archs if not tc.supports(a)]
    if bad:
        names = ", ".join(str(a) for a in bad)
        raise BuildError(
            f"nvcc {tc.release} cannot compile for {names}; it supports {' '.join(tc.supported())}"
        )


@dataclass(frozen=True)
class Inspector:
    """cuobjdump, and the nvdisasm it runs for ``--dump-sass``."""

    cuobjdump: Path
    nvdisasm: Path

    def env(self) -> dict[str, str]:
        """The environment to run cuobjdump in: nvdisasm's directory first on PATH."""
        path = os.environ.get("PATH", "")
        return {**os.environ, "PATH": f"{self.nvdisasm.parent}{os.pathsep}{path}"}


def find_cuda_tool(name: str, nvcc: Path | None = None) -> Path | None:
    """``name`` on PATH, beside nvcc, or in an NVIDIA wheel (``nvidia/*/bin/<name>``)."""
    found = shutil.which(name)
    if found:
        return Path(found)
    if nvcc is not None and (nvcc.parent / name).is_file():
        return nvcc.parent / name
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for candidate in sorted(Path(root).glob(f"*/bin/{name}")):
            if os.access(candidate, os.X_OK):
                return candidate
    return None


def find_inspector(nvcc: Path | None = None) -> Inspector:
    """Both SASS tools, or a :class:`BuildError` saying which wheels provide them."""
    cuobjdump = find_cuda_tool("cuobjdump", nvcc)
    nvdisasm = find_cuda_tool("nvdisasm", nvcc)
    missing = [f"nvidia-cuda-{n}" for n, p in (("cuobjdump", cuobjdump), ("nvdisasm", nvdisasm)) if p is None]
    if missing:
        names = " and ".join(n.removeprefix("nvidia-cuda-") for n in missing)
        raise BuildError(f"{names} not found (needed to check the SASS): pip install {' '.join(missing)}")
    assert cuobjdump is not None and nvdisasm is not None
    return Inspector(cuobjdump, nvdisasm)


def _run_text(argv: Sequence[str], **kw) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, check=False, **kw)
    except OSError as e:
        raise BuildError(f"cannot run {argv[0]}: {e}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise BuildError(f"{Path(argv[0]).name} failed (exit {done.returncode}): {tail[0]}")
    return done.stdout


# --------------------------------------------------------------------------- kernel signatures


@dataclass(frozen=True)
class Param:
    """One kernel parameter as libclang reads it: ``k_scale``, ``'const float *'``."""

    name: str
    type: str
    pointer: bool


@dataclass(frozen=True)
class KernelSignature:
    """A ``__global__`` function template's template parameters and parameters."""

    name: str
    template_params: tuple[str, ...]
    params: tuple[Param, ...]

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


def kernel_signatures(text: str, header_path: str | Path) -> dict[str, KernelSignature]:
    """The v1, v2 and reduce kernels' signatures in ``text``, keyed ``'v1'``, ``'v2'``, ``'reduce'``.

    ``header_path`` is where the text would live in its tree (its siblings are read
    from there). Raises :class:`BuildError` when a kernel is missing.
    """
    parsed = parse_header(text, str(header_path))
    found: dict[str, KernelSignature] = {}
    wanted = {name: kind for kind, name in KERNELS.items()}
    for node in parsed.tu.cursor.walk_preorder():
        if node.kind != ci.CursorKind.FUNCTION_TEMPLATE or node.spelling not in wanted:
            continue
        if node.location.file is None or node.location.file.name != parsed.path:
            continue
        kind = wanted[node.spelling]
        if kind in found and not node.is_definition():
            continue
        found[kind] = _signature(node)
    missing = [KERNELS[k] for k in KERNELS if k not in found]
    if missing:
        raise BuildError(f"{header_path}: no {', '.join(missing)} found; is this vLLM's attention_kernels.cuh?")
    return found


def _signature(node: ci.Cursor) -> KernelSignature:
    tparams: list[str] = []
    params: list[Param] = []
    for child in node.get_children():
        if child.kind in (ci.CursorKind.TEMPLATE_TYPE_PARAMETER, ci.CursorKind.TEMPLATE_NON_TYPE_PARAMETER):
            tparams.append(child.spelling)
        elif child.kind == ci.CursorKind.PARM_DECL:
            pointer = child.type.get_canonical().kind == ci.TypeKind.POINTER
            params.append(Param(child.spelling, child.type.spelling, pointer))
    return KernelSignature(node.spelling, tuple(tparams), tuple(params))


#: Template arguments of the kernels, by template parameter name, in launcher terms.
_TEMPLATE_ARGS = {
    "scalar_t": "T",
    "cache_t": "CACHE_T",
    "HEAD_SIZE": "HEAD_SIZE",
    "BLOCK_SIZE": "BLOCK_SIZE",
    "NUM_THREADS": "kNumThreads",
    "KV_DTYPE": "KV_DTYPE",
    "IS_BLOCK_SPARSE": "false",
    "PARTITION_SIZE": "kPartitionSize",
}

#: Call arguments by kernel parameter name; vLLM's launcher values with blocksparse off.
_CALL_ARGS = {
    "out": "reinterpret_cast<T*>(a.out)",
    "exp_sums": "a.exp_sums",
    "max_logits": "a.max_logits",
    "tmp_out": "reinterpret_cast<T*>(a.tmp_out)",
    "q": "reinterpret_cast<const T*>(a.query)",
    "k_cache": "reinterpret_cast<const CACHE_T*>(a.key_cache)",
    "v_cache": "reinterpret_cast<const CACHE_T*>(a.value_cache)",
    "num_kv_heads": "a.num_kv_heads",
    "scale": "a.scale",
    "block_tables": "a.block_tables",
    "seq_lens": "a.seq_lens",
    "max_num_blocks_per_seq": "a.max_num_blocks_per_seq",
    "alibi_slopes": "a.alibi_slopes",
    "q_stride": "a.q_stride",
    "kv_block_stride": "a.kv_block_stride",
    "kv_head_stride": "a.kv_head_stride",
    "tp_rank": "/* tp_rank */ 0",
    "blocksparse_local_blocks": "/* blocksparse_local_blocks */ 0",
    "blocksparse_vert_stride": "/* blocksparse_vert_stride */ 0",
    "blocksparse_block_size": "/* blocksparse_block_size */ 64",
    "blocksparse_head_sliding_step": "/* blocksparse_head_sliding_step */ 0",
    "max_num_partitions": "max_num_partitions",
}


def template_arguments(sig: KernelSignature) -> str:
    """``'T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, kNumThreads, KV_DTYPE, false'`` for v1."""
    unknown = [p for p in sig.template_params if p not in _TEMPLATE_ARGS]
    if unknown:
        raise BuildError(f"{sig.name} has template parameter(s) kvpatch cannot fill: {', '.join(unknown)}")
    return ", ".join(_TEMPLATE_ARGS[p] for p in sig.template_params)


def call_arguments(sig: KernelSignature) -> list[str]:
    """The launcher's arguments for ``sig``, in its order; scales by pointer or by value."""
    args = []
    for p in sig.params:
        if p.name in ("k_scale", "v_scale"):
            args.append(f"a.{p.name}_ptr" if p.pointer else f"a.{p.name}")
        elif p.name in _CALL_ARGS:
            args.append(_CALL_ARGS[p.name])
        else:
            raise BuildError(f"{sig.name} has a parameter kvpatch's launcher does not know: {p.type} {p.name}")
    return args


def scale_by_value(sigs: Mapping[str, KernelSignature]) -> bool:
    """True when the kernels take ``k_scale`` as a float (vLLM 0.6.4), not a pointer."""
    k_scale = sigs["v1"].param("k_scale")
    return k_scale is not None and not k_scale.pointer


# --------------------------------------------------------------------------- spec


_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Variant:
    """One header text to build, under a name that becomes its symbols' prefix."""

    name: str  # an identifier: 'stock', 'patched', 'control'
    header: str  # the full text of attention_kernels.cuh
    #: Whether its v1/v2 kernels must hold the prefetch on sm_90+; None = whether the
    #: header contains the prefetch instruction.
    expect_prefetch: bool | None = None
    #: Whether kernels with a quantized (fp8) cache are expected to prefetch too
    #: (False under the default ``quantized=skip``).
    quantized_prefetch: bool = True
    #: The configuration it was patched with: which instantiations a rule turns off.
    config: PatchConfig | None = None

    @classmethod
    def patched(cls, name: str, header: str, cfg: PatchConfig) -> Variant:
        """A header patched with ``cfg``, expecting the SASS that configuration gives."""
        return cls(name, header, expect_prefetch=True, quantized_prefetch=cfg.quantized == "prefetch", config=cfg)

    def expects_prefetch(self, dtype: str, kv_cache_dtype: str, head_size: int, block_size: int) -> bool:
        """Whether this instantiation's v1/v2 kernels must hold the prefetch (on sm_90+)."""
        if not self.has_prefetch or (kv_cache_dtype != "auto" and not self.quantized_prefetch):
            return False
        return self.config is None or not self.config.resolve(dtype, head_size, block_size, kv_cache_dtype).off

    @property
    def prefix(self) -> str:
        """Namespace of its kernels and prefix of its launchers: ``'kvpatch_stock'``."""
        return f"kvpatch_{self.name}"

    @property
    def has_prefetch(self) -> bool:
        if self.expect_prefetch is not None:
            return self.expect_prefetch
        return PREFETCH_SOURCE in self.header


@dataclass(frozen=True, order=True)
class KernelConfig:
    """One instantiation of the v1 and v2 kernels."""

    dtype: str  # 'fp16' | 'bf16' | 'fp32'
    kv_cache_dtype: str  # 'auto' | 'fp8' | 'fp8_e5m2'
    head_size: int
    block_size: int

    @property
    def label(self) -> str:
        return f"{self.dtype}/{self.kv_cache_dtype}/{self.head_size}/{self.block_size}"

    def template_context(self) -> dict[str, object]:
        scalar, dtype_code = DTYPES[self.dtype]
        cache, kv_code, kv_enum = KV_CACHE_DTYPES[self.kv_cache_dtype]
        return dict(
            dtype_code=dtype_code,
            kv_code=kv_code,
            kv_enum=kv_enum,
            scalar_type=scalar,
            cache_type=cache or scalar,
            head_size=self.head_size,
            block_size=self.block_size,
        )


@dataclass(frozen=True)
class BuildSpec:
    """Everything a build needs; outputs are derived from it (see :func:`plan`)."""

    tree: Path
    variants: tuple[Variant, ...]
    archs: tuple[Arch, ...]
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    head_sizes: tuple[int, ...] = DEFAULT_HEAD_SIZES
    block_sizes: tuple[int, ...] = DEFAULT_BLOCK_SIZES
    kv_cache_dtypes: tuple[str, ...] = DEFAULT_KV_CACHE_DTYPES
    num_threads: int = 128
    partition_size: int = 512
    extra_flags: tuple[str, ...] = ()

    @property
    def header_path(self) -> Path:
        return self.tree / HEADER

    @property
    def configs(self) -> tuple[KernelConfig, ...]:
        return tuple(
            KernelConfig(d, kv, h, b)
            for d in self.dtypes
            for kv in self.kv_cache_dtypes
            for h in self.head_sizes
            for b in self.block_sizes
        )

    @property
    def fp8(self) -> bool:
        return any(kv != "auto" for kv in self.kv_cache_dtypes)

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise UsageError(f"no variant {name!r} in this build")


def make_spec(
    tree: str | Path,
    variants: Iterable[Variant],
    archs: str | Sequence[Arch] = "9.0a",
    *,
    dtypes: Iterable[str] | None = None,
    head_sizes: Iterable[int] | None = None,
    block_sizes: Iterable[int] | None = None,
    kv_cache_dtypes: Iterable[str] | None = None,
    all_kernels: bool = False,
    extra_flags: Iterable[str] = (),
) -> BuildSpec:
    """Validate options into a :class:`BuildSpec` (``None`` = the default).

    The defaults build fp16 and bf16 at head size 128, block size 16, auto cache
    (about a minute). ``all_kernels`` fills every option not given with vLLM's full
    set, read from the tree's ``paged_attention_v1.cu``.
    """
    tree = Path(tree)
    if not (tree / HEADER).is_file():
        raise UsageError(f"{tree} is not a vLLM source tree: {HEADER} is missing")
    variants = tuple(variants)
    _check_variants(variants)
    arch_list = tuple(parse_arch_list(archs) if isinstance(archs, str) else archs)
    if not arch_list:
        raise UsageError("no arch given")
    if all_kernels:
        vllm_heads, vllm_blocks = vllm_kernel_set(tree)
        dtypes = dtypes if dtypes is not None else tuple(DTYPES)
        head_sizes = head_sizes if head_sizes is not None else vllm_heads
        block_sizes = block_sizes if block_sizes is not None else vllm_blocks
        kv_cache_dtypes = kv_cache_dtypes if kv_cache_dtypes is not None else tuple(KV_CACHE_DTYPES)
    return BuildSpec(
        tree=tree,
        variants=variants,
        archs=arch_list,
        dtypes=_choices("dtype", dtypes, DEFAULT_DTYPES, tuple(DTYPES)),
        head_sizes=_sizes("head size", head_sizes, DEFAULT_HEAD_SIZES),
        block_sizes=_sizes("block size", block_sizes, DEFAULT_BLOCK_SIZES),
        kv_cache_dtypes=_choices(
            "kv-cache dtype",
            None if kv_cache_dtypes is None else [KV_CACHE_ALIASES.get(k, k) for k in kv_cache_dtypes],
            DEFAULT_KV_CACHE_DTYPES,
            tuple(KV_CACHE_DTYPES),
        ),
        extra_flags=tuple(extra_flags),
    )


def _check_variants(variants: tuple[Variant, ...]) -> None:
    if not variants:
        raise UsageError("nothing to build: no variant given")
    names = [v.name for v in variants]
    for name in names:
        if not _NAME_RE.fullmatch(name):
            raise UsageError(f"invalid variant name {name!r}: use letters, digits and '_'")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"variant name(s) given twice: {', '.join(dup)}")


def _choices(what: str, given: Iterable[str] | None, default: tuple[str, ...], allowed: tuple[str, ...]) -> tuple[str, ...]:
    values = tuple(dict.fromkeys(given)) if given is not None else default
    for v in values:
        if v not in allowed:
            raise UsageError(f"invalid {what} {v!r}: choose from {', '.join(allowed)}")
    if not values:
        raise UsageError(f"no {what} given")
    return values


def _sizes(what: str, given: Iterable[int] | None, default: tuple[int, ...]) -> tuple[int, ...]:
    if given is None:
        return default
    values: list[int] = []
    for v in given:
        try:
            n = int(v)
        except (TypeError, ValueError):
            raise UsageError(f"invalid {what} {v!r}: expected a positive integer") from None
        if n <= 0 or isinstance(v, bool):
            raise UsageError(f"invalid {what} {v!r}: expected a positive integer")
        if n not in values:
            values.append(n)
    if not values:
        raise UsageError(f"no {what} given")
    return tuple(values)


def vllm_kernel_set(tree: Path) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The head sizes and block sizes the tree's own ``paged_attention_v1.cu`` instantiates."""
    launcher = tree / "csrc/attention/paged_attention_v1.cu"
    try:
        text = launcher.read_text(encoding="utf-8")
    except OSError:
        return VLLM_HEAD_SIZES, VLLM_BLOCK_SIZES
    heads = tuple(int(h) for h in dict.fromkeys(re.findall(r"LAUNCH_PAGED_ATTENTION_V1\((\d+)\)", text)))
    blocks = tuple(
        int(b) for b in dict.fromkeys(re.findall(r"CALL_V1_LAUNCHER_SPARSITY\(\s*T\s*,\s*CACHE_T\s*,\s*(\d+)", text))
    )
    return heads or VLLM_HEAD_SIZES, blocks or VLLM_BLOCK_SIZES


def patched_variants(stock: str, header_path: str, configs: Mapping[str, PatchConfig]) -> list[Variant]:
    """``stock`` as the variant 'stock', then ``stock`` patched with each named configuration."""
    from ..patch.plan import patch  # parsing work only when asked for

    out = [Variant("stock", stock, expect_prefetch=False)]
    out += [Variant.patched(name, patch(stock, header_path, cfg).patched, cfg) for name, cfg in configs.items()]
    return out


def stock_and_patched(
    tree: str | Path, cfg: PatchConfig, names: tuple[str, str] = ("stock", "patched")
) -> tuple[Variant, Variant]:
    """The tree's header without and with ``cfg`` (a :class:`kvpatch.config.PatchConfig`)."""
    from ..patch.plan import unpatch

    path = str(Path(tree) / HEADER)
    stock, _ = unpatch(Path(path).read_text(encoding="utf-8"), path)
    first, second = patched_variants(stock, path, {names[1]: cfg})
    return replace(first, name=names[0]), second


# --------------------------------------------------------------------------- planning


_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)


def source_closure(csrc: Path, header_text: str, header_rel: str = "attention/attention_kernels.cuh") -> dict[str, str]:
    """The header and every tree file it reaches by ``#include "..."``, as ``{path under csrc: text}``.

    Includes resolve as nvcc resolves them with ``-I csrc``: beside the including file
    first, then under ``csrc``. Names found in neither (ROCm's headers) are skipped,
    whatever ``#if`` they sit under: copying an unused file costs nothing.
    """
    files: dict[str, str] = {header_rel: header_text}
    todo = [header_rel]
    root = csrc.resolve()
    while todo:
        rel = todo.pop()
        for name in _INCLUDE_RE.findall(files[rel]):
            for base in (root / Path(rel).parent, root):
                target = Path(os.path.normpath(base / name))
                if target.is_relative_to(root) and target.is_file():
                    key = target.relative_to(root).as_posix()
                    if key not in files:
                        files[key] = target.read_text(encoding="utf-8")
                        todo.append(key)
                    break
    return dict(sorted(files.items()))


@dataclass(frozen=True)
class VariantPlan:
    """One variant's build, fully determined: files to write, commands, cache key."""

    variant: Variant
    archs: tuple[Arch, ...]
    configs: tuple[KernelConfig, ...]
    files: tuple[tuple[str, str], ...]  # (path relative to the build dir, text)
    shards: int
    compile_flags: tuple[str, ...]  # nvcc flags shared by every shard, paths relative
    nvcc_version: str
    cache: Path
    signatures: tuple[tuple[str, KernelSignature], ...]

    @functools.cached_property
    def key(self) -> str:
        """sha256 over every input of the build, hex, 20 characters."""
        blob = json.dumps(
            {
                "format": BUILD_FORMAT,
                "variant": self.variant.name,
                "expect_prefetch": self.variant.has_prefetch,
                "files": self.files,
                "flags": self.compile_flags,
                "link": self.link_flags,
                "nvcc": self.nvcc_version,
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:20]

    @property
    def dir(self) -> Path:
        return self.cache / "builds" / self.key

    @property
    def lock_path(self) -> Path:
        return self.cache / "builds" / f"{self.key}.lock"

    @property
    def library(self) -> Path:
        return self.dir / f"lib{self.variant.prefix}.so"

    @property
    def result_path(self) -> Path:
        return self.dir / "result.json"

    @property
    def link_flags(self) -> tuple[str, ...]:
        return ("-shared", "-Xcompiler", "-fPIC")

    def shard_source(self, i: int) -> str:
        return f"launcher_{i}.cu"

    def shard_object(self, i: int) -> str:
        return f"launcher_{i}.o"

    def shard_log(self, i: int) -> str:
        return f"launcher_{i}.ptxas.log"

    def compile_argv(self, nvcc: Path, i: int, threads: int = 1) -> list[str]:
        argv = [str(nvcc), "-c", self.shard_source(i), "-o", self.shard_object(i) + ".tmp", *self.compile_flags]
        if threads > 1:
            argv.append(f"--threads={threads}")
        return argv

    def link_argv(self, nvcc: Path) -> list[str]:
        objects = [self.shard_object(i) for i in range(self.shards)]
        return [str(nvcc), *self.link_flags, "-o", self.library.name + ".tmp", *objects]


def compile_flags(variant: Variant, archs: Sequence[Arch], fp8: bool, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """nvcc flags for a launcher shard (run in the build dir).

    vLLM's own flags for these kernels (CMake RelWithDebInfo + torch's
    ``--expt-relaxed-constexpr``; vLLM removes torch's ``__CUDA_NO_HALF*`` defines
    and does not use ``--use_fast_math``), plus ``-Dvllm=<prefix>`` for distinct
    symbols, hidden visibility for everything but the launchers, and ``ptxas -v``.
    """
    flags = [
        "-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr",
        "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
        f"-Dvllm={variant.prefix}",
    ]  # fmt: skip
    if fp8:
        flags.append("-DENABLE_FP8")
    flags += ["-Isrc/csrc", "-Istubs"]
    for arch in archs:
        flags += arch.gencode_flags()
    flags += ["-Xptxas", "-v", *extra]
    return tuple(flags)


def launcher_sources(
    variant: Variant, sigs: Mapping[str, KernelSignature], configs: Sequence[KernelConfig], *, num_threads: int = 128, partition_size: int = 512
) -> list[str]:
    """The launcher translation units of one variant (shard 0 first; it holds the API)."""
    shards = max(1, -(-len(configs) // CONFIGS_PER_SHARD))
    common = dict(
        variant=variant.name,
        prefix=variant.prefix,
        shards=shards,
        num_threads=num_threads,
        partition_size=partition_size,
        abi_version=ABI_VERSION,
        scale_by_value=scale_by_value(sigs),
        all_configs=",".join(c.label for c in configs),
        v1_targs=template_arguments(sigs["v1"]),
        v1_args=call_arguments(sigs["v1"]),
        v2_targs=template_arguments(sigs["v2"]),
        v2_args=call_arguments(sigs["v2"]),
        reduce_targs=template_arguments(sigs["reduce"]),
        reduce_args=call_arguments(sigs["reduce"]),
    )
    return [
        render("build/launcher.cu.j2", shard=i, configs=[c.template_context() for c in configs[i::shards]], **common) + "\n"
        for i in range(shards)
    ]


def stub_headers(fp8: bool) -> dict[str, str]:
    """Stand-ins for the torch headers the kernel header includes (paths under ``stubs/``)."""
    stubs = {name: "#pragma once\n" for name in _TORCH_STUBS}
    stubs["torch/all.h"] = render("build/launcher_torch_all.h.j2", fp8=fp8) + "\n"
    return stubs


def plan(spec: BuildSpec, *, cache: Path | None = None, tc: Toolchain | None = None) -> list[VariantPlan]:
    """Plan every variant of ``spec``: reads the tree and runs ``nvcc --version`` (once)."""
    from ..source.fetch import cache_root

    tc = tc or toolchain()
    root = Path(cache) if cache is not None else cache_root()
    plans = []
    for variant in spec.variants:
        sigs = kernel_signatures(variant.header, spec.header_path)
        files: dict[str, str] = {}
        for rel, text in source_closure(spec.tree / "csrc", variant.header).items():
            files[f"src/csrc/{rel}"] = text
        for rel, text in stub_headers(spec.fp8).items():
            files[f"stubs/{rel}"] = text
        sources = launcher_sources(
            variant, sigs, spec.configs, num_threads=spec.num_threads, partition_size=spec.partition_size
        )
        for i, text in enumerate(sources):
            files[f"launcher_{i}.cu"] = text
        plans.append(
            VariantPlan(
                variant=variant,
                archs=spec.archs,
                configs=spec.configs,
                files=tuple(sorted(files.items())),
                shards=len(sources),
                compile_flags=compile_flags(variant, spec.archs, spec.fp8, spec.extra_flags),
                nvcc_version=tc.version,
                cache=root,
                signatures=tuple(sorted(sigs.items())),
            )
        )
    return plans


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class KernelInfo:
    """One kernel for one arch: what ptxas allocated and whether the SASS prefetches."""

    arch: str  # 'sm_90a'
    kernel: str  # 'v1' | 'v2' | 'reduce'
    dtype: str  # 'fp16' ...
    kv_cache_dtype: str  # 'auto' ... ('' for reduce)
    head_size: int
    block_size: int  # 0 for reduce
    registers: int
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    stack_bytes: int
    has_prefetch: bool
    expect_prefetch: bool
    symbol: str  # mangled

    @property
    def ok(self) -> bool:
        return self.has_prefetch == self.expect_prefetch

    @property
    def label(self) -> str:
        cfg = f"{self.dtype}/{self.kv_cache_dtype}/{self.head_size}/{self.block_size}"
        return f"{self.kernel} {cfg if self.kernel != 'reduce' else f'{self.dtype}/{self.head_size}'} {self.arch}"


@dataclass(frozen=True)
class StepTime:
    name: str
    seconds: float


@dataclass(frozen=True)
class VariantResult:
    """A built variant: where its files are and what its kernels look like."""

    name: str
    prefix: str
    key: str
    dir: Path
    library: Path
    cubins: tuple[Path, ...]
    sass: Path  # kernels.sass.gz: see read_sass()
    archs: tuple[str, ...]
    configs: tuple[str, ...]
    kernels: tuple[KernelInfo, ...]
    steps: tuple[StepTime, ...]
    expect_prefetch: bool
    cached: bool = False

    def read_sass(self) -> str:
        """The whole ``cuobjdump --dump-sass`` text of the library (kept gzip-compressed)."""
        with gzip.open(self.sass, "rt", encoding="utf-8") as f:
            return f.read()

    @property
    def compile_seconds(self) -> float:
        return sum(s.seconds for s in self.steps)

    def problems(self) -> list[str]:
        """What the SASS check found wrong, one line each (empty: all good)."""
        out = []
        for k in self.kernels:
            if not k.ok:
                what = "lacks" if k.expect_prefetch else "unexpectedly has"
                out.append(f"{self.name}: {k.label} {what} {PREFETCH_SASS} in its SASS")
        # v1 and v2 per configuration, one reduce kernel per (dtype, head size), per arch
        reduce = {(d, h) for d, _, h, _ in (c.split("/") for c in self.configs)}
        expected = len(self.archs) * (2 * len(self.configs) + len(reduce))
        found = len(self.kernels)
        if found != expected:
            out.append(f"{self.name}: found {found} kernels in the SASS, expected {expected}")
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("dir", "library", "sass"):
            d[name] = str(d[name])
        d["cubins"] = [str(p) for p in self.cubins]
        return d

    @classmethod
    def from_dict(cls, d: Mapping, *, cached: bool = False) -> VariantResult:
        return cls(
            name=d["name"],
            prefix=d["prefix"],
            key=d["key"],
            dir=Path(d["dir"]),
            library=Path(d["library"]),
            cubins=tuple(Path(p) for p in d["cubins"]),
            sass=Path(d["sass"]),
            archs=tuple(d["archs"]),
            configs=tuple(d["configs"]),
            kernels=tuple(KernelInfo(**k) for k in d["kernels"]),
            steps=tuple(StepTime(**s) for s in d["steps"]),
            expect_prefetch=d["expect_prefetch"],
            cached=cached,
        )


@dataclass(frozen=True)
class BuildResult:
    variants: tuple[VariantResult, ...]
    elapsed: float

    def variant(self, name: str) -> VariantResult:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)

    def problems(self) -> list[str]:
        return [p for v in self.variants for p in v.problems()]

    def to_dict(self) -> dict:
        return {"elapsed": self.elapsed, "variants": [v.to_dict() for v in self.variants]}

    def table(self) -> Table:
        """Registers, spills and the prefetch check per kernel, for the CLI to print."""
        table = Table(title=f"kvpatch build ({self.elapsed:.1f} s)")
        for name, justify in (("variant", "left"), ("arch", "left"), ("kernel", "left"), ("config", "left"),
                              ("regs", "right"), ("spill st/ld", "right"), ("stack", "right"),
                              ("UBLKPF", "center"), ("check", "center")):  # fmt: skip
            table.add_column(name, justify=justify)
        for v in self.variants:
            for k in v.kernels:
                config = f"{k.dtype}/{k.head_size}" if k.kernel == "reduce" else f"{k.dtype}/{k.kv_cache_dtype}/{k.head_size}/{k.block_size}"
                table.add_row(
                    v.name, k.arch, k.kernel, config, str(k.registers), f"{k.spill_stores}/{k.spill_loads}",
                    str(k.stack_bytes), "yes" if k.has_prefetch else "-", "[green]ok[/]" if k.ok else "[red]FAIL[/]",
                )  # fmt: skip
        return table


# --------------------------------------------------------------------------- output parsing


_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


def parse_ptxas_log(text: str) -> dict[tuple[str, str], dict[str, int]]:
    """``ptxas -v`` output -> ``{(arch, symbol): {registers, spill_stores, spill_loads, stack_bytes}}``."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    current: tuple[str, str] | None = None
    for line in text.splitlines():
        if m := _PTXAS_ENTRY.search(line):
            current = (m.group(2), m.group(1))
            out[current] = {"registers": 0, "spill_stores": 0, "spill_loads": 0, "stack_bytes": 0}
        elif current is None:
            continue
        elif m := _PTXAS_FRAME.search(line):
            stack, stores, loads = (int(g) for g in m.groups())
            out[current].update(stack_bytes=stack, spill_stores=stores, spill_loads=loads)
        elif m := _PTXAS_REGS.search(line):
            out[current]["registers"] = int(m.group(1))
    return out


_SASS_ARCH = re.compile(r"^\s*code for (sm_\w+)")
_SASS_FUNCTION = re.compile(r"^\s*Function : (\S+)")


def scan_sass(lines: Iterable[str]) -> dict[tuple[str, str], bool]:
    """``cuobjdump --dump-sass`` lines -> ``{(arch, symbol): holds UBLKPF}``."""
    out: dict[tuple[str, str], bool] = {}
    arch = ""
    current: tuple[str, str] | None = None
    for line in lines:
        if m := _SASS_ARCH.match(line):
            arch = m.group(1)
        elif m := _SASS_FUNCTION.match(line):
            current = (arch, m.group(1))
            out[current] = False
        elif current is not None and PREFETCH_SASS in line:
            out[current] = True
    return out


def demangle(symbols: Sequence[str]) -> dict[str, str]:
    """Demangle with ``c++filt`` when there is one; otherwise names map to themselves."""
    tool = shutil.which("c++filt")
    if not tool or not symbols:
        return {s: s for s in symbols}
    done = subprocess.run([tool], input="\n".join(symbols), capture_output=True, text=True, check=False)
    names = done.stdout.splitlines()
    if done.returncode != 0 or len(names) != len(symbols):
        return {s: s for s in symbols}
    return dict(zip(symbols, names))


_SCALAR_NAMES = {"unsigned short": "fp16", "__nv_bfloat16": "bf16", "float": "fp32"}
_KV_NAMES = {"0": "auto", "1": "fp8", "2": "fp8_e5m2"}


def describe_kernel(demangled: str, sigs: Mapping[str, KernelSignature]) -> dict[str, object] | None:
    """``{kernel, dtype, kv_cache_dtype, head_size, block_size}`` of a demangled kernel name."""
    for kind, name in KERNELS.items():
        marker = f"::{name}<"
        start = demangled.find(marker)
        if start < 0:
            continue
        args = dict(zip(sigs[kind].template_params, _template_args(demangled, start + len(marker))))
        kv = re.sub(r"^\(.*\)", "", args.get("KV_DTYPE", "0"))
        return {
            "kernel": kind,
            "dtype": _SCALAR_NAMES.get(args.get("scalar_t", ""), args.get("scalar_t", "?")),
            "kv_cache_dtype": _KV_NAMES.get(kv, kv) if kind != "reduce" else "",
            "head_size": int(args.get("HEAD_SIZE", 0)),
            "block_size": int(args.get("BLOCK_SIZE", 0)),
        }
    return None


def _template_args(text: str, start: int) -> list[str]:
    args, depth, current = [], 0, ""
    for ch in text[start:]:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            args.append(current.strip())
            current = ""
        else:
            current += ch
    args.append(current.strip())
    return args


# --------------------------------------------------------------------------- building


def write_if_different(path: Path, text: str) -> bool:
    """Write ``text`` unless the file already holds it (keeps mtimes of unchanged inputs)."""
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return True


def build(
    spec: BuildSpec,
    *,
    jobs: int | None = None,
    cache: Path | None = None,
    console: Console | None = None,
    check: bool = True,
) -> BuildResult:
    """Build every variant of ``spec`` (or take it from the cache) and check its SASS.

    Compiles run ``jobs`` at a time (default: the CPU count), with a progress line
    per step. Raises :class:`BuildError` when nvcc fails, a tool is missing, or
    (``check``) a kernel's SASS does not hold the prefetch it should.
    """
    start = time.perf_counter()
    console = console if console is not None else Console(stderr=True)
    tc = toolchain()
    validate_archs(spec.archs, tc)
    tools = find_inspector(tc.nvcc)
    plans = plan(spec, cache=cache, tc=tc)
    jobs = max(1, jobs or os.cpu_count() or 1)
    results: dict[str, VariantResult] = {}
    with ExitStack() as stack:
        for p in sorted(plans, key=lambda p: p.key):
            p.lock_path.parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(filelock.FileLock(str(p.lock_path)))
        todo = []
        for p in plans:
            cached = _load_result(p)
            if cached is not None:
                results[p.variant.name] = cached
                console.print(f"[green]✓[/] {escape(p.variant.name)}: cached ({p.dir})")
            else:
                todo.append(p)
        if todo:
            for p in todo:
                _write_inputs(p)
            built = _compile_all(todo, tc, tools, jobs, console)
            results.update(built)
    result = BuildResult(tuple(results[v.name] for v in spec.variants), time.perf_counter() - start)
    if check:
        problems = result.problems()
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise BuildError(problems[0] + more)
    return result


def _load_result(p: VariantPlan) -> VariantResult | None:
    try:
        data = json.loads(p.result_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not p.library.is_file():
        return None
    try:
        return _relocate(VariantResult.from_dict(data, cached=True), p.dir)
    except (KeyError, TypeError):
        return None


def _relocate(r: VariantResult, new_dir: Path) -> VariantResult:
    """Paths in result.json are stored relative to the build dir; make them absolute."""

    def fix(path: Path) -> Path:
        return new_dir / path if not path.is_absolute() else path

    return replace(r, dir=new_dir, library=fix(r.library), sass=fix(r.sass), cubins=tuple(fix(c) for c in r.cubins))


def _write_inputs(p: VariantPlan) -> None:
    p.dir.mkdir(parents=True, exist_ok=True)
    for rel, text in p.files:
        write_if_different(p.dir / rel, text)


def _compile_all(
    plans: list[VariantPlan], tc: Toolchain, tools: Inspector, jobs: int, console: Console
) -> dict[str, VariantResult]:
    """Compile every shard of every plan in parallel, then link and inspect each."""
    tasks = [(p, i) for p in plans for i in range(p.shards) if not _shard_done(p, i)]
    threads = max(1, min(len(plans[0].archs), jobs // max(1, len(tasks))))
    steps: dict[str, list[StepTime]] = {p.variant.name: [] for p in plans}
    columns = (SpinnerColumn(finished_text="[green]✓[/]"), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress, concurrent.futures.ThreadPoolExecutor(jobs) as pool:

        def step(p: VariantPlan, name: str, fn: Callable[[], None]) -> None:
            label = f"{p.variant.name}: {name}"
            task = progress.add_task(escape(label), total=1)
            t0 = time.perf_counter()
            fn()
            seconds = time.perf_counter() - t0
            steps[p.variant.name].append(StepTime(name, round(seconds, 2)))
            progress.update(task, completed=1, description=escape(f"{label} ({seconds:.1f} s)"))

        def compile_shard(p: VariantPlan, i: int) -> None:
            archs = " ".join(a.code for a in p.archs)
            what = f"compile {p.shard_source(i)} for {archs}" if p.shards > 1 else f"compile for {archs}"
            step(p, what, lambda: _compile_shard(p, i, tc, threads))

        _wait(pool.submit(compile_shard, p, i) for p, i in tasks)
        _wait(pool.submit(step, p, "link", functools.partial(_link, p, tc)) for p in plans)
        inspected = {p.variant.name: pool.submit(_inspect, p, tools, functools.partial(step, p)) for p in plans}
        _wait(inspected.values())
    results = {}
    for p in plans:
        result = replace(inspected[p.variant.name].result(), steps=tuple(steps[p.variant.name]))
        _save_result(p, result)
        results[p.variant.name] = result
    return results


def _save_result(p: VariantPlan, result: VariantResult) -> None:
    """Write result.json last, with paths relative to the build dir: it marks the build complete."""
    d = result.to_dict()
    d["dir"] = "."
    for name in ("library", "sass"):
        d[name] = str(Path(d[name]).relative_to(p.dir))
    d["cubins"] = [str(Path(c).relative_to(p.dir)) for c in d["cubins"]]
    tmp = p.result_path.with_name("result.json.tmp")
    tmp.write_text(json.dumps(d, indent=1) + "\n", encoding="utf-8")
    tmp.replace(p.result_path)


def _wait(futures: Iterable[concurrent.futures.Future]) -> None:
    """Wait for all; on the first failure cancel what has not started and re-raise it."""
    futures = list(futures)
    done, pending = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
    failed = [f for f in futures if f in done and f.exception() is not None]
    if failed:
        for f in pending:
            f.cancel()
        concurrent.futures.wait(pending)
        raise failed[0].exception()


def _shard_done(p: VariantPlan, i: int) -> bool:
    """An object and its ptxas log from an interrupted build of the same inputs."""
    return (p.dir / p.shard_object(i)).is_file() and (p.dir / p.shard_log(i)).is_file()


def _compile_shard(p: VariantPlan, i: int, tc: Toolchain, threads: int) -> None:
    argv = p.compile_argv(tc.nvcc, i, threads)
    done = subprocess.run(argv, cwd=p.dir, capture_output=True, text=True, check=False)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        (p.dir / f"launcher_{i}.error.log").write_text(log, encoding="utf-8")
        raise BuildError(f"nvcc failed for variant {p.variant.name!r}: {_first_error(log)} (log: {p.dir}/launcher_{i}.error.log)")
    (p.dir / (p.shard_object(i) + ".tmp")).replace(p.dir / p.shard_object(i))
    write_if_different(p.dir / p.shard_log(i), log)
    (p.dir / f"launcher_{i}.error.log").unlink(missing_ok=True)


def _first_error(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln.lower():
            return ln
    return lines[-1] if lines else "(no output)"


def _link(p: VariantPlan, tc: Toolchain) -> None:
    done = subprocess.run(p.link_argv(tc.nvcc), cwd=p.dir, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError(f"linking {p.library.name} failed: {_first_error(done.stdout + done.stderr)}")
    (p.dir / (p.library.name + ".tmp")).replace(p.library)


def _inspect(p: VariantPlan, tools: Inspector, step: Callable[[str, Callable[[], None]], None]) -> VariantResult:
    """Read registers from the ptxas logs and the prefetch from the SASS; save result.json."""
    sass_path = p.dir / "kernels.sass.gz"
    sass: dict[tuple[str, str], bool] = {}

    def dump() -> None:
        sass.update(_dump_sass(tools, p.library, sass_path))
        _extract_cubins(tools, p.library, p.dir / "cubin")

    step("cuobjdump --dump-sass", dump)
    usage: dict[tuple[str, str], dict[str, int]] = {}
    for i in range(p.shards):
        usage.update(parse_ptxas_log((p.dir / p.shard_log(i)).read_text(encoding="utf-8")))
    sigs = dict(p.signatures)
    names = demangle(sorted({sym for _, sym in sass}))
    kernels = []
    for (arch, sym), has in sorted(sass.items()):
        desc = describe_kernel(names[sym], sigs)
        if desc is None:
            continue
        expect = (desc["kernel"] != "reduce" and _arch_major(arch) >= 9
                  and p.variant.expects_prefetch(desc["dtype"], desc["kv_cache_dtype"], desc["head_size"], desc["block_size"]))  # fmt: skip
        res = usage.get((arch, sym), {"registers": 0, "spill_stores": 0, "spill_loads": 0, "stack_bytes": 0})
        kernels.append(KernelInfo(arch=arch, **desc, **res, has_prefetch=has, expect_prefetch=expect, symbol=sym))
    kernels.sort(key=_kernel_order)
    return VariantResult(
        name=p.variant.name,
        prefix=p.variant.prefix,
        key=p.key,
        dir=p.dir,
        library=p.library,
        cubins=tuple(sorted(c for a in p.archs for c in (p.dir / "cubin").glob(f"*.{a.code}.cubin"))),
        sass=sass_path,
        archs=tuple(a.code for a in p.archs),
        configs=tuple(c.label for c in p.configs),
        kernels=tuple(kernels),
        steps=(),
        expect_prefetch=p.variant.has_prefetch,
    )


def _kernel_order(k: KernelInfo) -> tuple:
    """By arch (numerically), then v1, v2, reduce, then dtype, cache dtype, head and block size."""
    m = re.match(r"sm_(\d+)(\w*)", k.arch)
    arch = (int(m.group(1)), m.group(2)) if m else (0, k.arch)
    dtype = list(DTYPES).index(k.dtype) if k.dtype in DTYPES else len(DTYPES)
    kv = list(KV_CACHE_DTYPES).index(k.kv_cache_dtype) if k.kv_cache_dtype in KV_CACHE_DTYPES else -1
    return (arch, list(KERNELS).index(k.kernel), dtype, kv, k.head_size, k.block_size)


def _arch_major(code: str) -> int:
    digits = re.match(r"sm_(\d+)", code)
    return int(digits.group(1)[:-1]) if digits else 0


def _dump_sass(tools: Inspector, library: Path, out: Path) -> dict[tuple[str, str], bool]:
    """Stream ``cuobjdump --dump-sass`` into ``out`` (gzip: --all's SASS is ~300 MB) and scan it."""
    tmp = out.with_name(out.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=3) as f:
        proc = subprocess.Popen(
            [str(tools.cuobjdump), "--dump-sass", str(library)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=tools.env(),
        )  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None

        def tee() -> Iterator[str]:
            for line in proc.stdout:
                f.write(line)
                yield line

        found = scan_sass(tee())
        err = proc.stderr.read()
        if proc.wait() != 0:
            raise BuildError(f"cuobjdump --dump-sass {library.name} failed: {_first_error(err)}")
    tmp.replace(out)
    return found


def _extract_cubins(tools: Inspector, library: Path, dest: Path) -> None:
    dest.mkdir(exist_ok=True)
    for old in dest.glob("*.cubin"):
        old.unlink()
    _run_text([str(tools.cuobjdump), "--extract-elf", "all", str(library)], cwd=dest, env=tools.env())


# --------------------------------------------------------------------------- kvpatch build --full


def full_build_command(
    tree: str | Path,
    archs: Sequence[Arch],
    jobs: int,
    *,
    python: str | None = None,
    base_env: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """vLLM's own editable install of ``tree``: ``pip install -e <tree> --no-build-isolation``.

    Returns the argv and the whole environment to run it with (``base_env``, default
    ``os.environ``, plus ``TORCH_CUDA_ARCH_LIST`` and ``MAX_JOBS``). ``-v`` makes pip
    show the compiler's progress instead of a spinner for half an hour.
    """
    if not archs:
        raise UsageError("no arch given")
    if jobs < 1:
        raise UsageError(f"invalid jobs {jobs}: must be >= 1")
    argv = [python or sys.executable, "-m", "pip", "install", "-v", "-e", str(Path(tree).resolve()), "--no-build-isolation"]
    env = dict(os.environ if base_env is None else base_env)
    env["TORCH_CUDA_ARCH_LIST"] = ";".join(str(a) for a in archs)
    env["MAX_JOBS"] = str(jobs)
    env["VLLM_TARGET_DEVICE"] = "cuda"
    return argv, env


def run_full_build(tree: str | Path, archs: Sequence[Arch], jobs: int, *, console: Console | None = None) -> float:
    """Run :func:`full_build_command`, streaming its output; returns the seconds it took."""
    console = console if console is not None else Console(stderr=True)
    find_nvcc()
    argv, env = full_build_command(tree, archs, jobs)
    console.print(f"[bold]$ {escape(' '.join(argv))}[/]  (TORCH_CUDA_ARCH_LIST={env['TORCH_CUDA_ARCH_LIST']}, MAX_JOBS={jobs})")
    start = time.perf_counter()
    tail: list[str] = []
    try:
        proc = subprocess.Popen(argv, env=env, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as e:
        raise BuildError(f"cannot run {argv[0]}: {e}") from None
    assert proc.stdout is not None
    for line in proc.stdout:
        console.out(line.rstrip("\n"), highlight=False)
        tail = (tail + [line.rstrip()])[-20:]
    rc = proc.wait()
    if rc != 0:
        raise BuildError(f"vLLM's build failed (exit {rc}): {_first_error(chr(10).join(tail))}")
    return time.perf_counter() - start
