"""Reading what nvcc produced: ``ptxas -v`` logs (registers, spills) and the SASS
(``cuobjdump --dump-sass``: which kernels hold ``UBLKPF``), by demangled kernel name."""

from __future__ import annotations

import gzip
import re
import shutil
import statistics
from dataclasses import replace
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

from ..dtypes import KV_CACHE_DTYPES, QUERY_DTYPES, by_demangled
from ..errors import BuildError
from ..arch import code_major
from .result import PREFETCH_SASS, KernelInfo, VariantResult
from .signatures import KERNELS, KernelSignature
from .toolchain import Inspector, first_error, run_text

if TYPE_CHECKING:
    from .plan import VariantPlan

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


#: The floating-point SASS instructions counted per kernel (tensor-core MMA excluded); the
#: ``issue=split`` check compares their FFMA (:meth:`~kvpatch.build.result.BuildResult.split_warnings`).
FP_OPS = re.compile(r"(FFMA|FADD|FMUL|HFMA2(?!\.MMA)|HADD2|HMUL2|FMNMX|MUFU|F2F|FSEL)\b")
#: One SASS instruction: its address (4 hex digits, more past 0xffff) and its text without the predicate.
_SASS_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([^;]*);")
_BRANCH = re.compile(r"^BRA(?:\.\w+)*\s+(?:`\(\S+\)\s*)?0x([0-9a-f]+)")
_LOAD = re.compile(r"^LDG(\S*)\s+R(\d+),")


class SassKernel(NamedTuple):
    """What :func:`scan_sass_kernels` reads of one kernel's SASS."""

    has_prefetch: bool
    fp_ops: dict[str, int]
    #: :func:`key_loop_load_use`, or None where it finds no such loop.
    load_use: float | None = None


def key_loop_load_use(instrs: Sequence[tuple[int, str]]) -> float | None:
    """How far ahead of their use the key loop issues its global loads: the median, over the
    loop's ``LDG``s, of the instructions between the load and the first instruction that reads
    a register it loaded (the loop's end where none does). ``instrs``: (address, text without
    predicate) in order. The key loop is the first loop (a backward branch's range; the
    innermost one starting there) holding at least 4 ``LDG`` and an ``LDS``: in vLLM's kernels the
    loop over KV blocks, which loads the keys and reads the query from shared memory.

    A heuristic about ptxas' schedule, not a timing: where it is short, each load's latency is
    exposed (benchmarks/results/ctas-probe)."""
    index = {addr: i for i, (addr, _) in enumerate(instrs)}
    loops = []
    for i, (_, text) in enumerate(instrs):
        if (m := _BRANCH.match(text)) and (target := index.get(int(m.group(1), 16))) is not None and target < i:
            loops.append((target, i))
    ops = [text.split(" ", 1)[0] for _, text in instrs]

    def holds(a: int, b: int) -> bool:
        body = ops[a : b + 1]
        return sum(o.startswith("LDG") for o in body) >= 4 and any(o.startswith("LDS") for o in body)

    candidates = sorted(x for x in loops if holds(*x))
    if not candidates:
        return None
    start, end = candidates[0]
    start, end = min(((a, b) for a, b in candidates if a >= start and b <= end), key=lambda x: x[1] - x[0])
    distances = []
    for i in range(start, end + 1):
        m = _LOAD.match(instrs[i][1])
        if not m:
            continue
        width = 4 if ".128" in m.group(1) else 2 if ".64" in m.group(1) else 1
        regs = re.compile(r"\bR(?:" + "|".join(str(int(m.group(2)) + k) for k in range(width)) + r")\b")
        use = next((j for j in range(i + 1, end + 1) if regs.search(instrs[j][1].partition(",")[2])), end + 1)
        distances.append(use - i)
    return float(statistics.median(distances)) if distances else None


def scan_sass_kernels(lines: Iterable[str]) -> dict[tuple[str, str], SassKernel]:
    """``cuobjdump --dump-sass`` lines -> ``{(arch, symbol): SassKernel}``: whether it holds
    UBLKPF, its floating-point op counts and its key loop's load-use distance."""
    out: dict[tuple[str, str], SassKernel] = {}
    arch = ""
    current: tuple[str, str] | None = None
    has, ops, instrs = False, {}, []  # type: ignore[var-annotated]

    def close() -> None:
        if current is not None:
            out[current] = SassKernel(has, ops, key_loop_load_use(instrs))

    for line in lines:
        if m := _SASS_ARCH.match(line):
            close()
            current, arch = None, m.group(1)
        elif m := _SASS_FUNCTION.match(line):
            close()
            current, has, ops, instrs = (arch, m.group(1)), False, {}, []
        elif current is not None:
            if PREFETCH_SASS in line:
                has = True
            if m := _SASS_INSTR.search(line):
                text = m.group(2).strip()
                instrs.append((int(m.group(1), 16), text))
                if fp := FP_OPS.match(text):
                    ops[fp.group(1)] = ops.get(fp.group(1), 0) + 1
    close()
    return out


def scan_sass(lines: Iterable[str]) -> dict[tuple[str, str], bool]:
    """``cuobjdump --dump-sass`` lines -> ``{(arch, symbol): holds UBLKPF}``."""
    return {k: v.has_prefetch for k, v in scan_sass_kernels(lines).items()}


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


_KV_BY_CODE = {str(kv.code): kv.name for kv in KV_CACHE_DTYPES.values()}


def describe_kernel(demangled: str, sigs: Mapping[str, KernelSignature]) -> dict[str, object] | None:
    """``{kernel, dtype, kv_cache_dtype, head_size, block_size}`` of a demangled kernel name."""
    for kind, name in KERNELS.items():
        marker = f"::{name}<"
        start = demangled.find(marker)
        if start < 0:
            continue
        args = dict(zip(sigs[kind].template_params, _template_args(demangled, start + len(marker))))
        kv = re.sub(r"^\(.*\)", "", args.get("KV_DTYPE", "0"))
        scalar = args.get("scalar_t", "?")
        dtype = by_demangled(scalar)
        return {
            "kernel": kind,
            "dtype": dtype.name if dtype else scalar,
            "kv_cache_dtype": _KV_BY_CODE.get(kv, kv) if kind != "reduce" else "",
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


def inspect_variant(p: VariantPlan, tools: Inspector, step: Callable[[str, Callable[[], None]], None]) -> VariantResult:
    """Read registers from the ptxas logs and the prefetch from the SASS of a linked variant."""
    sass_path = p.dir / "kernels.sass.gz"
    sass: dict[tuple[str, str], SassKernel] = {}

    def dump() -> None:
        sass.update(dump_sass(tools, p.library, sass_path))
        extract_cubins(tools, p.library, p.dir / "cubin")

    step("cuobjdump --dump-sass", dump)
    usage: dict[tuple[str, str], dict[str, int]] = {}
    for i in range(p.shards):
        usage.update(parse_ptxas_log((p.dir / p.shard_log(i)).read_text(encoding="utf-8")))
    sigs = dict(p.signatures)
    names = demangle(sorted({sym for _, sym in sass}))
    kernels = []
    for (arch, sym), (has, ops, load_use) in sorted(sass.items()):
        desc = describe_kernel(names[sym], sigs)
        if desc is None:
            continue
        expect = (desc["kernel"] != "reduce" and code_major(arch) >= 9
                  and p.variant.expects_prefetch(desc["dtype"], desc["kv_cache_dtype"], desc["head_size"],
                                                desc["block_size"], desc["kernel"]))  # fmt: skip
        cfg = p.variant.config
        split = expect and cfg is not None and cfg.resolve(desc["dtype"], desc["head_size"], desc["block_size"],
                                                           desc["kv_cache_dtype"], desc["kernel"]).issue == "split"  # fmt: skip
        res = usage.get((arch, sym), {"registers": 0, "spill_stores": 0, "spill_loads": 0, "stack_bytes": 0})
        kernels.append(KernelInfo(arch=arch, **desc, **res, has_prefetch=has, expect_prefetch=expect, symbol=sym,
                                  fp_ops=tuple(sorted(ops.items())), split=split, load_use=load_use))  # fmt: skip
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


def reread_sass(result: VariantResult) -> VariantResult:
    """``result`` with each kernel's floating-point op counts and :attr:`~KernelInfo.load_use`
    read again from its kept SASS (``kernels.sass.gz``): for builds made before kvpatch read
    the load-use distance, which also counted FP ops only up to address 0xffff."""
    with gzip.open(result.sass, "rt", encoding="utf-8") as f:
        found = scan_sass_kernels(f)

    def again(k: KernelInfo) -> KernelInfo:
        got = found.get((k.arch, k.symbol))
        return k if got is None else replace(k, fp_ops=tuple(sorted(got.fp_ops.items())), load_use=got.load_use)

    return replace(result, kernels=tuple(again(k) for k in result.kernels))


def dump_sass(tools: Inspector, library: Path, out: Path) -> dict[tuple[str, str], SassKernel]:
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

        found = scan_sass_kernels(tee())
        err = proc.stderr.read()
        if proc.wait() != 0:
            raise BuildError(f"cuobjdump --dump-sass {library.name} failed: {first_error(err)}")
    tmp.replace(out)
    return found


def extract_cubins(tools: Inspector, library: Path, dest: Path) -> None:
    """``cuobjdump --extract-elf all`` into ``dest`` (emptied of older cubins first)."""
    dest.mkdir(exist_ok=True)
    for old in dest.glob("*.cubin"):
        old.unlink()
    run_text([str(tools.cuobjdump), "--extract-elf", "all", str(library)], cwd=dest, env=tools.env())
