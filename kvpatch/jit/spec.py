"""What to build: :class:`Variant` (one header text), :class:`KernelConfig` (one
instantiation) and :class:`BuildSpec` (FlashInfer's ``JitSpec`` in spirit), validated
from user options by :func:`make_spec`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from ..arch import Arch, parse_arch_list
from ..config.toml import check_variant_name
from ..dtypes import KV_CACHE_ALIASES, KV_CACHE_DTYPES, QUERY_DTYPES, VLLM_BLOCK_SIZES, VLLM_HEAD_SIZES
from ..errors import PatchError, UsageError
from ..fsutil import FileTooLargeError, NotRegularFileError, machine_problem, read_regular
from ..source.includes import MAX_BYTES
from ..source.releases import HEADER

if TYPE_CHECKING:
    from ..config import PatchConfig

#: The prefetch instruction in PTX source.
PREFETCH_SOURCE = "cp.async.bulk.prefetch"

DEFAULT_DTYPES = ("fp16", "bf16")
DEFAULT_HEAD_SIZES = (128,)
DEFAULT_BLOCK_SIZES = (16,)
DEFAULT_KV_CACHE_DTYPES = ("auto",)
#: The launcher file whose dispatch names the head and block sizes vLLM instantiates.
VLLM_LAUNCHER = "csrc/attention/paged_attention_v1.cu"


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

    def expects_prefetch(self, dtype: str, kv_cache_dtype: str, head_size: int, block_size: int,
                         kernel: str | None = None) -> bool:  # fmt: skip
        """Whether this instantiation's ``kernel`` (v1 or v2) must hold the prefetch (on sm_90+)."""
        if not self.has_prefetch or (kv_cache_dtype != "auto" and not self.quantized_prefetch):
            return False
        return self.config is None or self.config.prefetches(dtype, head_size, block_size, kv_cache_dtype, kernel)

    @property
    def marker(self) -> str:
        """The configuration's marker text (``stock`` for a header without one)."""
        return self.config.marker() if self.config is not None else "stock"

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

    dtype: str  # a kvpatch.dtypes.QUERY_DTYPES name: 'fp16' | 'bf16' | 'fp32'
    kv_cache_dtype: str  # a kvpatch.dtypes.KV_CACHE_DTYPES name: 'auto' | 'fp8' | 'fp8_e5m2'
    head_size: int
    block_size: int

    @property
    def label(self) -> str:
        return f"{self.dtype}/{self.kv_cache_dtype}/{self.head_size}/{self.block_size}"

    def template_context(self) -> dict[str, object]:
        q = QUERY_DTYPES[self.dtype]
        kv = KV_CACHE_DTYPES[self.kv_cache_dtype]
        return dict(
            dtype_code=q.code,
            kv_code=kv.code,
            kv_enum=kv.enum,
            scalar_type=q.c_type,
            cache_type=kv.c_type or q.c_type,
            head_size=self.head_size,
            block_size=self.block_size,
        )


@dataclass(frozen=True)
class BuildSpec:
    """Everything a build needs; outputs are derived from it (see :func:`kvpatch.jit.plan.plan`)."""

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


def check_vllm_tree(tree: str | os.PathLike[str]) -> Path:
    """``tree`` as a Path, if it holds vLLM's attention header: a tree a build can read (one line,
    exit 2, otherwise: before nvcc, torch or a GPU is looked for)."""
    tree = Path(tree)
    if not (tree / HEADER).is_file():
        raise UsageError(f"{tree} is not a vLLM source tree: {HEADER} is missing")
    return tree


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
    check_variants: bool = True,
) -> BuildSpec:
    """Validate options into a :class:`BuildSpec` (``None`` = the default).

    The defaults build fp16 and bf16 at head size 128, block size 16, auto cache
    (about a minute). ``all_kernels`` fills every option not given with vLLM's full
    set. Head and block sizes must be ones vLLM instantiates (read from the tree's
    ``paged_attention_v1.cu``, see :func:`vllm_kernel_set`): the kernels support no
    others, and nvcc would otherwise be the one to say so.
    """
    tree = check_vllm_tree(tree)
    variants = tuple(variants)
    if check_variants:  # False: the options checked first, the variants given later
        _check_variants(variants)
    arch_list = tuple(parse_arch_list(archs) if isinstance(archs, str) else archs)
    if not arch_list:
        raise UsageError("no arch given")
    vllm_heads, vllm_blocks = vllm_kernel_set(tree)
    if all_kernels:
        dtypes = dtypes if dtypes is not None else tuple(QUERY_DTYPES)
        head_sizes = head_sizes if head_sizes is not None else vllm_heads
        block_sizes = block_sizes if block_sizes is not None else vllm_blocks
        kv_cache_dtypes = kv_cache_dtypes if kv_cache_dtypes is not None else tuple(KV_CACHE_DTYPES)
    return BuildSpec(
        tree=tree,
        variants=variants,
        archs=arch_list,
        dtypes=_choices("dtype", dtypes, DEFAULT_DTYPES, tuple(QUERY_DTYPES)),
        head_sizes=_sizes("head size", head_sizes, DEFAULT_HEAD_SIZES, vllm_heads),
        block_sizes=_sizes("block size", block_sizes, DEFAULT_BLOCK_SIZES, vllm_blocks),
        kv_cache_dtypes=_choices(
            "kv-cache dtype",
            None if kv_cache_dtypes is None else [KV_CACHE_ALIASES.get(k, k) for k in kv_cache_dtypes],
            DEFAULT_KV_CACHE_DTYPES,
            tuple(KV_CACHE_DTYPES),
        ),
        extra_flags=tuple(extra_flags),
    )


def check_jobs(jobs: int | None) -> int | None:
    """``None`` (one job per CPU) or a positive count; :class:`UsageError` otherwise."""
    if jobs is None:
        return None
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise UsageError(f"invalid jobs {jobs!r}: must be >= 1")
    return jobs


def _check_variants(variants: tuple[Variant, ...]) -> None:
    if not variants:
        raise UsageError("nothing to build: no variant given")
    names = [v.name for v in variants]
    for name in names:
        check_variant_name(name)
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"variant name(s) given twice: {', '.join(dup)}")


def _choices(
    what: str, given: Iterable[str] | None, default: tuple[str, ...], allowed: tuple[str, ...]
) -> tuple[str, ...]:
    values = tuple(dict.fromkeys(given)) if given is not None else default
    for v in values:
        if v not in allowed:
            raise UsageError(f"invalid {what} {v!r}: choose from {', '.join(allowed)}")
    if not values:
        raise UsageError(f"no {what} given")
    return values


def _sizes(
    what: str, given: Iterable[int] | None, default: tuple[int, ...], allowed: tuple[int, ...]
) -> tuple[int, ...]:
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
        if n not in allowed:
            choices = ", ".join(str(a) for a in allowed)
            raise UsageError(f"invalid {what} {n}: vLLM's kernels are instantiated for {choices}")
        if n not in values:
            values.append(n)
    if not values:
        raise UsageError(f"no {what} given")
    return tuple(values)


def vllm_kernel_set(tree: Path) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The head sizes and block sizes the tree's own ``paged_attention_v1.cu`` instantiates.

    Falls back to :data:`VLLM_HEAD_SIZES` / :data:`VLLM_BLOCK_SIZES` for a tree
    without that file (or one in which neither dispatch is found). The file is read only as a
    regular file of bounded size: a FIFO, a device, a directory or a file larger than
    :data:`~kvpatch.source.includes.MAX_BYTES` there is a :class:`PatchError`, never a read
    that blocks or never ends.
    """
    path = Path(tree) / VLLM_LAUNCHER
    try:
        text = read_regular(path, limit=MAX_BYTES).decode("utf-8")
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
        return VLLM_HEAD_SIZES, VLLM_BLOCK_SIZES
    except NotRegularFileError as e:
        raise PatchError(f"{path} is {e.kind}, not a regular file: kvpatch reads only regular files") from None
    except FileTooLargeError as e:
        raise PatchError(f"{path} is {e.size} bytes: not vLLM's (kvpatch reads at most {MAX_BYTES})") from None
    except OSError as e:
        raise machine_problem(e, path) or PatchError(f"cannot read {path}: {e.strerror or e}") from None
    heads = tuple(int(h) for h in dict.fromkeys(re.findall(r"LAUNCH_PAGED_ATTENTION_V1\(\s*(\d+)\s*\)", text)))
    blocks = tuple(
        int(b) for b in dict.fromkeys(re.findall(r"CALL_V1_LAUNCHER_SPARSITY\(\s*T\s*,\s*CACHE_T\s*,\s*(\d+)", text))
    )
    return heads or VLLM_HEAD_SIZES, blocks or VLLM_BLOCK_SIZES


def patched_variants(stock: str, header_path: str, configs: Mapping[str, PatchConfig]) -> list[Variant]:
    """``stock`` as the variant 'stock', then ``stock`` patched with each named configuration."""
    from ..patch import patch_header, read_header  # parsing work only when asked for

    header = read_header(stock, header_path)
    out = [Variant("stock", stock, expect_prefetch=False)]
    out += [Variant.patched(name, patch_header(header, cfg).patched, cfg) for name, cfg in configs.items()]
    return out
