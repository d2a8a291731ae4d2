"""What a build produced, as data: per kernel, per variant, per build. Rendering lives
in :mod:`kvpatch.render`; ``to_dict``/``from_dict`` are ``result.json``'s form."""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from ..arch import is_hopper
from ..config.selector import kernel_selector
from ..errors import BuildError

#: The prefetch instruction in SASS.
PREFETCH_SASS = "UBLKPF"
#: :meth:`BuildResult.schedule_warnings` warns below this fraction of stock's load-use distance.
#: In tune-15 and tune-16 (H200, 384 candidate kernels): all 31 under it were slower than stock
#: at some tuning point (worst 0.36-0.88; 26 of them by geomean), and every candidate that was
#: never slower had 0.9x stock's distance or more.
LOAD_USE_RATIO = 0.5
#: Spill stores (bytes a thread) a grouped kernel under launch bounds may take without a warning:
#: the bounds trade registers for CTAs on an SM, and on the H200 the shipped table's bounded
#: kernels that spill 4-8 bytes were faster than without bounds, those that spilled 164 bytes or
#: more slower (benchmarks/evidence/bounded-table). An unbounded kernel is warned of any spill.
BOUNDED_SPILL_BYTES = 64


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
    has_prefetch: bool  # observed: the SASS holds UBLKPF
    expect_prefetch: bool  # expected: the variant's configuration prefetches here
    symbol: str  # mangled
    #: Floating-point SASS instructions and their counts (:data:`kvpatch.jit.sass.FP_OPS`).
    fp_ops: tuple[tuple[str, int], ...] = ()
    #: Its configuration issues the prefetch with ``issue=split`` here.
    split: bool = False
    #: How many instructions ahead of their first use the key loop issues its global loads
    #: (median; :func:`kvpatch.jit.sass.key_loop_load_use`), None where not found.
    load_use: float | None = None
    #: Its SASS's digest (:attr:`kvpatch.jit.sass.SassFunction.digest`); empty where not read.
    sass: str = ""

    @property
    def ok(self) -> bool:
        return self.has_prefetch == self.expect_prefetch

    @property
    def config(self) -> str:
        """``'fp16/auto/128/16'`` (``'fp16/128'`` for reduce)."""
        if self.kernel == "reduce":
            return f"{self.dtype}/{self.head_size}"
        return f"{self.dtype}/{self.kv_cache_dtype}/{self.head_size}/{self.block_size}"

    @property
    def label(self) -> str:
        return f"{self.kernel} {self.config} {self.arch}"


@dataclass(frozen=True)
class GroupedKernel:
    """One kernel of the grouped form (``group`` > 1: templates/inject/grouped.cuh.j2) for one arch:
    what ptxas allocated, and whether its SASS prefetches where its lookahead says it should."""

    arch: str
    kernel: str  # 'v1' | 'v2': the form of that kernel
    dtype: str
    head_size: int
    block_size: int
    heads: int  # query heads per CTA
    lookahead: int  # 0: no prefetch
    registers: int
    spill_stores: int  # bytes
    spill_loads: int
    has_prefetch: bool
    symbol: str
    ctas_per_sm: int = 0  # its launch bounds' CTAs per SM (0: none)
    logits: str = "shared"  # v1: where it keeps its heads' logits, 'shared' or 'global' memory
    v_loads: str = "at-use"  # when it loads its V vectors (group-v-loads): 'at-use' or 'ahead'
    k_loads: str = "at-use"  # when it loads its K vectors (group-k-loads): 'at-use', 'ahead' or 'shared'
    sass: str = ""  # its SASS's digest (kvpatch.jit.sass.SassFunction.digest); empty where not read

    @property
    def expect_prefetch(self) -> bool:
        return self.lookahead > 0 and is_hopper(self.arch)

    @property
    def ok(self) -> bool:
        """The SASS check: the prefetch is there exactly where the lookahead asks for it."""
        return self.has_prefetch == self.expect_prefetch

    @property
    def bounds(self) -> str:
        """`` 4/SM`` under launch bounds of 4 CTAs per SM; empty without."""
        return f" {self.ctas_per_sm}/SM" if self.ctas_per_sm else ""

    @property
    def where(self) -> str:
        """`` global`` for a v1 kernel that keeps its logits in global memory; empty in shared memory."""
        return "" if self.logits == "shared" else f" {self.logits}"

    @property
    def ahead(self) -> str:
        """`` k-ahead`` (`` k-shared``), `` v-ahead`` (or both) for a kernel that loads its next block's K, V vectors
        ahead; empty at use."""
        k = {"ahead": " k-ahead", "shared": " k-shared"}.get(self.k_loads, "")
        return k + (" v-ahead" if self.v_loads == "ahead" else "")

    @property
    def label(self) -> str:
        shape = f"{self.dtype}/{self.head_size}/{self.block_size}"
        return f"grouped {self.kernel} {shape} x{self.heads}{self.bounds}{self.where}{self.ahead} {self.arch}"


@dataclass(frozen=True)
class StepTime:
    name: str
    seconds: float


@dataclass(frozen=True)
class VariantResult:
    """A built variant: where its files are, how they were compiled, what its kernels look like."""

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
    #: The nvcc flags of every launcher shard (paths relative to ``dir``).
    compile_flags: tuple[str, ...] = ()
    #: ``nvcc --version``'s last line.
    nvcc: str = ""
    #: Size and sha256 of ``library`` when it was built: a cached library must match both.
    library_bytes: int = 0
    library_sha256: str = ""
    cached: bool = False
    #: The grouped form's kernels (none unless some kernel's settings say group > 1).
    grouped: tuple[GroupedKernel, ...] = ()

    def code(self) -> dict[str, str]:
        """Which code a launch of each kernel runs, as digests of its SASS (every arch built):
        ``{'fp16/128/16/auto/v1': digest}`` for vLLM's form of that kernel (v2's with its reduce
        kernel, which every v2 launch runs after it) and ``{'fp16/128/16/auto/v1 grouped': digest}``
        for every grouped-form kernel of it (the full group and half of it, each place for the
        logits, under launch bounds or not: which of them a launch takes, the launcher's rules
        decide). Two libraries with the same digest for a kernel ran the same SASS in a launch of
        the same form. A kernel whose SASS digest was not read has no entry."""
        reduce = {(k.arch, k.dtype, k.head_size): k.sass for k in self.kernels if k.kernel == "reduce"}
        parts: dict[str, list[str]] = {}

        def add(key: str, k: KernelInfo | GroupedKernel, shape: str) -> None:
            """One kernel's part of ``key``: its shape and digest (v2: with its reduce kernel's); empty
            where a digest is missing, which leaves ``key`` out."""
            with_reduce = reduce.get((k.arch, k.dtype, k.head_size), "") if k.kernel == "v2" else "-"
            parts.setdefault(key, []).append(f"{shape} {k.sass} {with_reduce}" if k.sass and with_reduce else "")

        for k in self.kernels:
            if k.kernel != "reduce":
                add(kernel_selector(k.dtype, k.head_size, k.block_size, k.kv_cache_dtype, k.kernel), k, k.arch)
        for g in self.grouped:
            add(kernel_selector(g.dtype, g.head_size, g.block_size, "auto", g.kernel) + " grouped", g,
                f"{g.arch} x{g.heads} {g.logits} {g.ctas_per_sm} {g.lookahead}")  # fmt: skip
        return {sel: hashlib.sha256("\n".join(sorted(ps)).encode()).hexdigest()[:16]
                for sel, ps in sorted(parts.items()) if all(ps)}  # fmt: skip

    def read_sass(self) -> str:
        """The whole ``cuobjdump --dump-sass`` text of the library (kept gzip-compressed)."""
        with gzip.open(self.sass, "rt", encoding="utf-8") as f:
            return f.read()

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
        for g in self.grouped:
            if not g.ok:
                what = "lacks" if g.expect_prefetch else "unexpectedly has"
                out.append(f"{self.name}: {g.label} {what} {PREFETCH_SASS} in its SASS")
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
            kernels=tuple(
                KernelInfo(**{**k, "fp_ops": tuple(tuple(x) for x in k.get("fp_ops", ()))}) for k in d["kernels"]
            ),  # fmt: skip
            steps=tuple(StepTime(**s) for s in d["steps"]),
            expect_prefetch=d["expect_prefetch"],
            compile_flags=tuple(d["compile_flags"]),
            nvcc=d["nvcc"],
            library_bytes=d["library_bytes"],
            library_sha256=d["library_sha256"],
            cached=cached,
            grouped=tuple(GroupedKernel(**g) for g in d.get("grouped", ())),
        )


@dataclass(frozen=True)
class BuildResult:
    """Every variant of one build, the seconds it took, and the compile-flag set it used."""

    variants: tuple[VariantResult, ...]
    elapsed: float
    #: :func:`kvpatch.jit.flags.vllm_nvcc_flags`: vLLM's flags, shared by every variant.
    vllm_flags: tuple[str, ...] = ()

    def variant(self, name: str) -> VariantResult:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)

    def problems(self) -> list[str]:
        return [p for v in self.variants for p in v.problems()]

    def check(self) -> None:
        """:class:`BuildError` (one line: the first problem and how many more) unless the SASS
        check passed everywhere."""
        problems = self.problems()
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            raise BuildError(f"SASS check failed: {problems[0]}{more}")

    def split_warnings(self) -> list[str]:
        """``issue=split`` kernels with another FFMA count than the 'stock' variant's same
        kernel: there nvcc did not compile the two copies as stock's loop (stock's loop is not
        unswitched on the ALiBi slope there, e.g. bf16 head 128 block 32: 121 FFMA, split 242),
        and ALiBi outputs differ from stock's. Only FFMA is compared: the ALiBi term is one,
        while FADD and FMNMX counts move with scheduling elsewhere (bf16 256/16 with
        ``scope=kv-head``: FADD 170 against stock's 202, identical on an H200). Empty when the
        build has no 'stock' variant or no counts (a cached build of an older kvpatch)."""

        def ffma(k: KernelInfo) -> int | None:
            return dict(k.fp_ops).get("FFMA", 0) if k.fp_ops else None

        out = []
        for v, k, ref in self._against_stock(ffma):
            if k.split and ref is not None and ffma(k) is not None and ffma(k) != ref:
                out.append(f"{v.name}: {k.label}: issue=split, but {ffma(k)} FFMA in its SASS against stock's {ref}: "
                           f"expect outputs with ALiBi to differ (check with 'kvpatch validate')")  # fmt: skip
        return out

    def grouped_warnings(self) -> list[str]:
        """Kernels of the grouped form that spill: ptxas ran out of registers for that many heads'
        accumulators (a smaller ``group`` holds fewer; ``group-k-loads = at-use`` and ``group-v-loads =
        at-use`` each hold one block's K or V vectors fewer), or, over :data:`BOUNDED_SPILL_BYTES`, for the CTAs per SM its launch bounds
        ask for (a smaller ``group-ctas-per-sm`` leaves more)."""

        def spills(g: Any) -> bool:
            if g.ctas_per_sm:
                return g.spill_stores > BOUNDED_SPILL_BYTES or g.spill_loads > BOUNDED_SPILL_BYTES
            return bool(g.spill_stores or g.spill_loads)

        return [f"{v.name}: {g.label}: {g.spill_stores} bytes spilled ({g.registers} registers): "
                + ("group-k-loads = at-use (one block's K vectors fewer), " if g.k_loads == "ahead" else "")
                + ("group-v-loads = at-use (one block's V vectors fewer), " if g.v_loads == "ahead" else "")
                + "a smaller " + ("group-ctas-per-sm or group" if g.ctas_per_sm else "group") + " may be faster there"
                for v in self.variants for g in v.grouped if spills(g)]  # fmt: skip

    def schedule_warnings(self, ratio: float = LOAD_USE_RATIO) -> list[str]:
        """Prefetching kernels whose key loop issues its loads less than ``ratio`` times as far
        ahead of their use as the 'stock' variant's same kernel (:attr:`KernelInfo.load_use`):
        ptxas scheduled each load next to its use, so its latency is exposed. On the H200
        every tuned candidate like that was slower than stock somewhere (:data:`LOAD_USE_RATIO`,
        the ctas-probe run, benchmarks/ARCHIVE.md).
        Empty without a 'stock' variant or without the numbers (a cached build of an older
        kvpatch)."""
        out = []
        for v, k, ref in self._against_stock(lambda k: k.load_use):
            if k.has_prefetch and ref and k.load_use is not None and k.load_use < ratio * ref:
                out.append(f"{v.name}: {k.label}: its key loop uses each load {k.load_use:g} instructions after "
                           f"issuing it (median; stock's: {ref:g}): expect it slower than stock (measure with 'kvpatch bench')")  # fmt: skip
        return out

    def _against_stock(self, value: Callable[[KernelInfo], Any]) -> Iterator[tuple[VariantResult, KernelInfo, Any]]:
        """Every variant's every kernel with ``value`` of the 'stock' variant's same kernel
        (same arch, kernel and configuration; None where there is none)."""
        stock = {(k.arch, k.kernel, k.config): value(k) for v in self.variants if v.name == "stock" for k in v.kernels}
        for v in self.variants:
            for k in v.kernels:
                yield v, k, stock.get((k.arch, k.kernel, k.config))

    def to_dict(self) -> dict:
        return {
            "elapsed": self.elapsed,
            "vllm_flags": list(self.vllm_flags),
            "variants": [v.to_dict() for v in self.variants],
        }
