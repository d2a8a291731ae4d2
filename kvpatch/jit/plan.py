"""From a :class:`~kvpatch.jit.spec.BuildSpec` to one :class:`VariantPlan` per variant.

A plan holds every file the build writes (the variant's header with the tree files it
includes, stub torch headers, the generated launcher translation units), the nvcc
command lines and a content hash of all of it plus ``nvcc --version``; the cache
directory ``<cache>/builds/<hash>`` is derived from that hash. The launchers come from
``templates/build/launcher.cu.j2``, compiled with ``-Dvllm=kvpatch_<variant>`` so
every variant's kernels carry their own symbols; they export ``extern "C"`` launchers
``kvpatch_<variant>_paged_attention_v1`` (and ``_v2``) that mirror vLLM's
``paged_attention_v1.cu``/``v2.cu``. Planning reads the tree and writes nothing.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..abi import ABI_VERSION
from ..arch import Arch, is_hopper
from ..dtypes import KV_CACHE_DTYPES, QUERY_DTYPES
from ..fsutil.reading import read_regular
from ..templating import render
from .flags import vllm_nvcc_flags
from .layout import CacheLayout
from .result import KernelInfo, VariantResult
from .sass import (
    SassKernel,
    demangle,
    describe_kernel,
    dump_sass,
    extract_cubins,
    grouped_kernels,
    parse_ptxas_log,
    scan_sass_kernels,
)
from .signatures import KERNELS, KernelSignature, call_arguments, kernel_signatures, scale_by_value, template_arguments
from .spec import BuildSpec, KernelConfig, Variant
from .toolchain import Toolchain, toolchain

#: Bump when the generated code or the cache layout changes: every cache key changes.
BUILD_FORMAT = 5
#: Configurations per launcher translation unit: --all builds in parallel shards.
CONFIGS_PER_SHARD = 8
#: The table a weight-tail header declares (templates/inject/weight_tail_helper.cuh.j2).
WEIGHT_TAIL_SYMBOL = "kvpatch_weight_tail_window"
#: The grouped form a header with group > 1 holds (templates/inject/grouped.cuh.j2).
GROUPED_SYMBOL = "kvpatch_grouped_attention"
#: The torch headers vLLM's attention headers include; a build gets stand-ins (under stubs/).
TORCH_STUBS = ("torch/all.h", "ATen/cuda/CUDAContext.h", "c10/cuda/CUDAGuard.h")


_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)


def source_closure(csrc: Path, header_text: str, header_rel: str = "attention/attention_kernels.cuh") -> dict[str, str]:
    """The header and every tree file it reaches by ``#include "..."``, as ``{path under csrc: text}``.

    Includes resolve as nvcc resolves them with ``-I csrc``: beside the including file
    first, then under ``csrc``. Names found in neither (ROCm's headers) are skipped,
    whatever ``#if`` they sit under: copying an unused file costs nothing. Each file is read
    only as a regular file, all of them together at most
    :data:`~kvpatch.source.includes.MAX_BYTES`, and must be UTF-8: else a :class:`PatchError`
    naming it, never a read that blocks or never ends.
    """
    from ..errors import PatchError
    from ..fsutil import FileTooLargeError, NotRegularFileError, machine_problem, read_regular
    from ..source.includes import MAX_BYTES

    files: dict[str, str] = {header_rel: header_text}
    todo = [header_rel]
    root = csrc.resolve()
    left = MAX_BYTES
    while todo:
        rel = todo.pop()
        for name in _INCLUDE_RE.findall(files[rel]):
            for base in (root / Path(rel).parent, root):
                target = Path(os.path.normpath(base / name))
                try:
                    found = target.is_relative_to(root) and not target.is_dir() and target.exists()
                except (OSError, ValueError):
                    found = False
                if found:
                    key = target.relative_to(root).as_posix()
                    if key not in files:
                        why = f"{target} (included by {rel})"
                        try:
                            data = read_regular(target, limit=left)
                            files[key] = data.decode("utf-8")
                        except NotRegularFileError as e:
                            raise PatchError(f"{why} is {e.kind}, not a regular file: kvpatch reads only regular "
                                             "files") from None  # fmt: skip
                        except FileTooLargeError:
                            raise PatchError(f"{why} takes the header's includes over {MAX_BYTES} bytes: not "
                                             "vLLM's header") from None  # fmt: skip
                        except UnicodeDecodeError:
                            raise PatchError(f"{why} is not UTF-8: not vLLM's header") from None
                        except OSError as e:
                            raise machine_problem(e, target) or PatchError(f"cannot read {why}: "
                                                                           f"{e.strerror or e}") from None  # fmt: skip
                        left -= len(data)
                        todo.append(key)
                    break
    return dict(sorted(files.items()))


@dataclass(frozen=True)
class VariantPlan(CacheLayout):
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

    @property
    def name(self) -> str:
        return self.variant.name

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
    def library_name(self) -> str:
        return f"lib{self.variant.prefix}.so"

    def shard_source(self, i: int) -> str:
        return f"launcher_{i}.cu"

    def shard_object(self, i: int) -> str:
        return f"launcher_{i}.o"

    def shard_log(self, i: int) -> str:
        return f"launcher_{i}.ptxas.log"

    def inspect(self, tools: Any, step: Callable[[str, Callable[[], None]], None]) -> VariantResult:
        """Registers from the ptxas logs, the prefetch from the SASS (:mod:`kvpatch.jit.sass`)."""
        return inspect_variant(self, tools, step)

    def read_result(self, data: dict) -> VariantResult:
        """A finished build's ``result.json`` (paths stored relative to the build dir)."""
        from .sass import with_sass_counts

        r = VariantResult.from_dict(data, cached=True)

        def fix(path: Path) -> Path:
            return self.dir / path if not path.is_absolute() else path

        r = replace(r, dir=self.dir, library=fix(r.library), sass=fix(r.sass), cubins=tuple(fix(c) for c in r.cubins))
        # built by a kvpatch that did not read the load-use distance or the SASS digests, or record
        # the grouped form's kernels: read them from the kept SASS (one pass for all) and the ptxas
        # logs, once
        unread = any("load_use" not in k or "sass" not in k for k in data["kernels"])
        no_grouped = GROUPED_SYMBOL in self.variant.header and (
            "grouped" not in data or any("sass" not in g for g in data["grouped"])
        )
        if (unread or no_grouped) and r.sass.is_file():
            try:
                with gzip.open(r.sass, "rt", encoding="utf-8") as f:
                    found = scan_sass_kernels(f, self.variant.prefix)
                if unread:
                    r = with_sass_counts(r, found)
                if no_grouped:
                    r = replace(r, grouped=grouped_kernels(found, self.ptxas_usage(),
                                                           demangle(sorted({sym for _, sym in found})),
                                                           self.variant.config))  # fmt: skip
            except (OSError, EOFError, ValueError):
                return r
            from .library import save_result

            save_result(self, r)
        return r

    def ptxas_usage(self) -> dict[tuple[str, str], dict[str, int]]:
        """``{(arch, symbol): registers, spills, stack}`` from every shard's kept ptxas log."""
        usage: dict[tuple[str, str], dict[str, int]] = {}
        for i in range(self.shards):
            log = read_regular(self.dir / self.shard_log(i), limit=64 << 20)  # a FIFO there must not hang
            usage.update(parse_ptxas_log(log.decode("utf-8", "replace")))
        return usage

    def result_json(self, result: VariantResult) -> dict:
        d = result.to_dict()
        d["dir"] = "."
        for name in ("library", "sass"):
            d[name] = str(Path(d[name]).relative_to(self.dir))
        d["cubins"] = [str(Path(c).relative_to(self.dir)) for c in d["cubins"]]
        del d["cached"]
        return d


def compile_flags(variant: Variant, archs: Sequence[Arch], extra: Sequence[str] = ()) -> tuple[str, ...]:
    """nvcc flags for a launcher shard (run in the build dir), the same for every build.

    Exactly: :func:`~kvpatch.jit.flags.vllm_nvcc_flags` (vLLM's own flags for these
    kernels: C++17, RelWithDebInfo's ``-O2 -g -DNDEBUG``, ``--expt-relaxed-constexpr``,
    ``-DENABLE_FP8``; no ``--use_fast_math``), then what a shared library of one
    variant needs: ``-Xcompiler -fPIC``, ``-Xcompiler -fvisibility=hidden`` (only the
    launchers are exported), ``-Dvllm=<prefix>`` (each variant's kernels get their own
    symbols), the include dirs ``src/csrc`` and ``stubs``, one ``-gencode`` per arch,
    ``-Xptxas -v`` (registers and spills for the report), and ``extra``.
    """
    flags = [
        *vllm_nvcc_flags(),
        "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
        f"-Dvllm={variant.prefix}",
        "-Isrc/csrc", "-Istubs",
    ]  # fmt: skip
    for arch in archs:
        flags += arch.gencode_flags()
    flags += ["-Xptxas", "-v", *extra]
    return tuple(flags)


def launcher_sources(
    variant: Variant,
    sigs: Mapping[str, KernelSignature],
    configs: Sequence[KernelConfig],
    *,
    num_threads: int = 128,
    partition_size: int = 512,
) -> list[str]:
    """The launcher translation units of one variant: vLLM's form (shard 0 first: the API), then
    the grouped form's launchers of the same configurations where the header has it."""
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
        # the header's opt-in weight-tail table: the library exports its setter
        weight_tail=WEIGHT_TAIL_SYMBOL in variant.header,
        # group > 1 in some kernel's settings: the header's grouped form, launched where it applies
        grouped=GROUPED_SYMBOL in variant.header,
    )
    # vLLM's form, then (grouped header) the grouped form's launchers in units of their own
    roles = ("form", "grouped") if common["grouped"] else ("form",)
    per_shard = [[c.template_context() for c in configs[i::shards]] for i in range(shards)]
    return [render("build/launcher.cu.j2", role=r, shard=i, configs=per_shard[i], **common) + "\n"
            for r in roles for i in range(shards)]  # fmt: skip


def stub_headers() -> dict[str, str]:
    """Stand-ins for the torch headers the kernel header includes (paths under ``stubs/``).

    ``torch/all.h`` carries what the headers use of torch under ``-DENABLE_FP8``
    (c10's fp8 type for vLLM >= 0.11, ``TORCH_CHECK`` for >= 0.20); the others are empty.
    """
    stubs = {name: "#pragma once\n" for name in TORCH_STUBS}
    stubs["torch/all.h"] = render("build/launcher_torch_all.h.j2") + "\n"
    return stubs


def plan(spec: BuildSpec, *, cache: Path | None = None, tc: Toolchain | None = None) -> list[VariantPlan]:
    """Plan every variant of ``spec``: reads the tree and runs ``nvcc --version`` (once)."""
    from ..source.cache import cache_root

    tc = tc or toolchain()
    root = Path(cache) if cache is not None else cache_root()
    plans = []
    for variant in spec.variants:
        sigs = kernel_signatures(variant.header, spec.header_path)
        files: dict[str, str] = {}
        for rel, text in source_closure(spec.tree / "csrc", variant.header).items():
            files[f"src/csrc/{rel}"] = text
        for rel, text in stub_headers().items():
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
                compile_flags=compile_flags(variant, spec.archs, spec.extra_flags),
                nvcc_version=tc.version,
                cache=root,
                signatures=tuple(sorted(sigs.items())),
            )
        )
    return plans


# --------------------------------------------------------------------------- inspecting a built variant


def inspect_variant(p: VariantPlan, tools: Any, step: Callable[[str, Callable[[], None]], None]) -> VariantResult:
    """Read registers from the ptxas logs and the prefetch from the SASS of a linked variant."""
    sass_path = p.dir / "kernels.sass.gz"
    sass: dict[tuple[str, str], SassKernel] = {}

    def dump() -> None:
        sass.update(dump_sass(tools, p.library, sass_path, p.variant.prefix))
        extract_cubins(tools, p.library, p.dir / "cubin")

    step("cuobjdump --dump-sass", dump)
    usage = p.ptxas_usage()
    sigs = dict(p.signatures)
    names = demangle(sorted({sym for _, sym in sass}))
    kernels = []
    for (arch, sym), (has, ops, load_use, digest) in sorted(sass.items()):
        desc = describe_kernel(names[sym], sigs)
        if desc is None:
            continue
        expect = (desc["kernel"] != "reduce" and is_hopper(arch)
                  and p.variant.expects_prefetch(desc["dtype"], desc["kv_cache_dtype"], desc["head_size"],
                                                desc["block_size"], desc["kernel"]))  # fmt: skip
        cfg = p.variant.config
        split = expect and cfg is not None and cfg.resolve(desc["dtype"], desc["head_size"], desc["block_size"],
                                                           desc["kv_cache_dtype"], desc["kernel"]).issue == "split"  # fmt: skip
        res = usage.get((arch, sym), {"registers": 0, "spill_stores": 0, "spill_loads": 0, "stack_bytes": 0})
        kernels.append(KernelInfo(arch=arch, **desc, **res, has_prefetch=has, expect_prefetch=expect, symbol=sym,
                                  fp_ops=tuple(sorted(ops.items())), split=split, load_use=load_use,
                                  sass=digest))  # fmt: skip
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
        compile_flags=p.compile_flags,
        nvcc=_release_line(p.nvcc_version),
        grouped=grouped_kernels(sass, usage, names, p.variant.config),
    )


def _release_line(version: str) -> str:
    """``'Cuda compilation tools, release 13.0, V13.0.88'`` out of ``nvcc --version``."""
    lines = version.strip().splitlines()
    return next((ln.strip() for ln in lines if "release" in ln), lines[-1].strip() if lines else "")


def _kernel_order(k: KernelInfo) -> tuple:
    """By arch (numerically), then v1, v2, reduce, then dtype, cache dtype, head and block size."""
    m = re.match(r"sm_(\d+)(\w*)", k.arch)
    arch = (int(m.group(1)), m.group(2)) if m else (0, k.arch)
    dtypes, kvs = list(QUERY_DTYPES), list(KV_CACHE_DTYPES)
    dtype = dtypes.index(k.dtype) if k.dtype in dtypes else len(dtypes)
    kv = kvs.index(k.kv_cache_dtype) if k.kv_cache_dtype in kvs else -1
    return (arch, list(KERNELS).index(k.kernel), dtype, kv, k.head_size, k.block_size)
