"""Reading what nvcc produced, the one place that parses it: ``ptxas -v`` logs (registers,
spills) and the SASS (``cuobjdump --dump-sass``): per kernel (which hold ``UBLKPF``, their
floating-point ops, the key loop's load-use distance) and per arch (the weight-prefetch
kernel's check, :func:`check_prefetch_library`)."""

from __future__ import annotations

import gzip
import hashlib
import re
import shutil
import statistics
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, NamedTuple, Sequence

from ..arch import Arch
from ..dtypes import KV_CACHE_DTYPES, by_demangled
from ..errors import BuildError
from .result import PREFETCH_SASS, GroupedKernel, KernelInfo, VariantResult
from .signatures import KERNELS, KernelSignature
from .toolchain import Inspector, first_error, run_text

if TYPE_CHECKING:
    from ..config import PatchConfig

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
#: ``issue=split`` check compares their FFMA (:meth:`~kvpatch.jit.result.BuildResult.split_warnings`).
FP_OPS = re.compile(r"(FFMA|FADD|FMUL|HFMA2(?!\.MMA)|HADD2|HMUL2|FMNMX|MUFU|F2F|FSEL)\b")
#: One SASS instruction: its address (4 hex digits, more past 0xffff) and its text without the predicate.
_SASS_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([^;]*);")
_BRANCH = re.compile(r"^BRA(?:\.\w+)*\s+(?:`\(\S+\)\s*)?0x([0-9a-f]+)")
_LOAD = re.compile(r"^LDG(\S*)\s+R(\d+),")


class SassKernel(NamedTuple):
    """What :func:`scan_sass_kernels` reads of one kernel's SASS."""

    has_prefetch: bool
    fp_ops: dict[str, int]
    #: :func:`key_loop_load_use`, or None where it finds no such loop.
    load_use: float | None = None
    #: :attr:`SassFunction.digest`: equal in two libraries where they hold the same code.
    digest: str = ""


class SassFunction(NamedTuple):
    """One function of a ``cuobjdump --dump-sass`` dump, as :func:`sass_functions` reads it."""

    arch: str
    #: Its mangled name; None for code outside a ``Function :`` block.
    symbol: str | None
    #: (address, instruction text without its predicate), in order.
    instrs: list[tuple[int, str]]
    #: sha256 (16 hex digits) of its instructions with their predicates, without addresses and
    #: encodings, the library's namespace written ``NS``: the same in two libraries whose
    #: functions hold the same code, whatever namespace (``kvpatch_<variant>``) each was built in.
    digest: str = ""


def key_loop_load_use(instrs: Sequence[tuple[int, str]]) -> float | None:
    """How far ahead of their use the key loop issues its global loads: the median, over the
    loop's ``LDG``s, of the instructions between the load and the first instruction that reads
    a register it loaded (the loop's end where none does). ``instrs``: (address, text without
    predicate) in order. The key loop is the first loop (a backward branch's range; the
    innermost one starting there) holding at least 4 ``LDG`` and an ``LDS``: in vLLM's kernels the
    loop over KV blocks, which loads the keys and reads the query from shared memory.

    A heuristic about ptxas' schedule, not a timing: where it is short, each load's latency is
    exposed (the ctas-probe run, benchmarks/ARCHIVE.md)."""
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


def sass_functions(lines: Iterable[str], namespace: str = "") -> Iterator[SassFunction]:
    """``cuobjdump --dump-sass`` lines -> one :class:`SassFunction` per function, in order.
    ``namespace``: the library's (``kvpatch_<variant>``, what ``-Dvllm=`` named vLLM's), which
    the digest writes as ``NS``."""
    names = namespace_pattern(namespace)
    arch, symbol, instrs, digest = "", None, [], hashlib.sha256()  # type: ignore[var-annotated]
    started = False
    for line in lines:
        if (m := _SASS_ARCH.match(line)) or (f := _SASS_FUNCTION.match(line)):
            if started:
                yield SassFunction(arch, symbol, instrs, digest.hexdigest()[:16])
            if m:
                arch, symbol = m.group(1), None
            else:
                symbol = f.group(1)
            instrs, started, digest = [], True, hashlib.sha256()
        elif started and (i := _SASS_INSTR.search(line)):
            text = i.group(3).strip()
            instrs.append((int(i.group(1), 16), text))
            whole = f"{(i.group(2) or '').strip()} {text}"
            if names is not None and namespace in whole:
                whole = names.sub("NS", whole)
            digest.update(whole.encode() + b"\n")
    if started:
        yield SassFunction(arch, symbol, instrs, digest.hexdigest()[:16])


def namespace_pattern(namespace: str) -> re.Pattern[str] | None:
    """The namespace as SASS names it: in a mangled name, after its length (``10kvpatch_c4``), and
    demangled; None for none."""
    if not namespace:
        return None
    return re.compile(rf"{len(namespace)}{re.escape(namespace)}|\b{re.escape(namespace)}\b")


def scan_sass_kernels(lines: Iterable[str], namespace: str = "") -> dict[tuple[str, str], SassKernel]:
    """``cuobjdump --dump-sass`` lines -> ``{(arch, symbol): SassKernel}``: whether it holds
    UBLKPF, its floating-point op counts, its key loop's load-use distance and its digest
    (``namespace``: as :func:`sass_functions`)."""
    out: dict[tuple[str, str], SassKernel] = {}
    for arch, symbol, instrs, digest in sass_functions(lines, namespace):
        if symbol is None:
            continue
        ops: dict[str, int] = {}
        for _, text in instrs:
            if fp := FP_OPS.match(text):
                ops[fp.group(1)] = ops.get(fp.group(1), 0) + 1
        has = any(PREFETCH_SASS in text for _, text in instrs)
        out[(arch, symbol)] = SassKernel(has, ops, key_loop_load_use(instrs), digest)
    return out


#: The weight-prefetch kernel's per-line prefetch below sm_90 (``prefetch.global.L2[::evict_*]``).
LINE_PREFETCH_SASS = re.compile(r"\bCCTL\.E\.(PF2|PML2)\b")


def check_prefetch_library(lines: Iterable[str], archs: Sequence[Arch]) -> dict[str, dict[str, int]]:
    """The weight-prefetch library's SASS check: per arch the count of bulk prefetches
    (``UBLKPF``) and per-line ones (``CCTL.E.PF2/PML2``); :class:`BuildError` unless every
    sm_90+ arch has bulk prefetches only and every older one per-line prefetches only."""
    found: dict[str, list[str]] = {}
    for fn in sass_functions(lines):
        found.setdefault(fn.arch, []).extend(text for _, text in fn.instrs)
    report: dict[str, dict[str, int]] = {}
    for arch in archs:
        instrs = found.get(arch.code)
        if instrs is None and arch.suffix == "f":  # cuobjdump names family SASS by its SM: sm_100
            instrs = found.get(f"sm_{arch.major}{arch.minor}")
        if instrs is None:
            raise BuildError(f"prefetch library: no SASS for {arch.code} (found {', '.join(found) or 'none'})")
        bulk = sum(PREFETCH_SASS in i for i in instrs)
        line = sum(bool(LINE_PREFETCH_SASS.search(i)) for i in instrs)
        report[arch.code] = {"bulk": bulk, "line": line}
        if arch.major >= 9 and (bulk == 0 or line):
            raise BuildError(f"prefetch library: {arch.code} SASS has {bulk} {PREFETCH_SASS} and {line} CCTL prefetches; "
                             f"expected {PREFETCH_SASS} only")  # fmt: skip
        if arch.major < 9 and (line == 0 or bulk):
            raise BuildError(f"prefetch library: {arch.code} SASS has {line} CCTL.E.PF2/PML2 and {bulk} {PREFETCH_SASS}; "
                             "expected the per-line prefetch only")  # fmt: skip
    return report


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


#: A grouped-form kernel's name (templates/inject/grouped.cuh.j2): its form, and whether it is the
#: copy under launch bounds (``group-ctas-per-sm``), which takes one more template parameter.
_GROUPED_NAME = re.compile(r"::kvpatch_grouped_(v[12])(_global)?(_bounded)?_kernel<")
_GROUPED_PARAMS = ("scalar_t", "cache_t", "HEAD_SIZE", "BLOCK_SIZE", "NUM_THREADS", "HEADS", "LOOKAHEAD")
_BOUNDED_PARAMS = {"v1": (*_GROUPED_PARAMS, "CTAS_PER_SM"), "v2": (*_GROUPED_PARAMS, "PARTITION_SIZE", "CTAS_PER_SM")}


def describe_grouped(demangled: str) -> dict[str, object] | None:
    """``{kernel, dtype, head_size, block_size, heads, lookahead, ctas_per_sm, logits}`` of a
    grouped-form kernel's demangled name (``ctas_per_sm`` 0: no launch bounds; ``logits``: where it
    keeps them, ``shared`` or ``global``), None for any other."""
    found = _GROUPED_NAME.search(demangled)
    if found is None:
        return None
    form, in_global, bounded = found.groups()
    params = _BOUNDED_PARAMS[form] if bounded else _GROUPED_PARAMS
    args = dict(zip(params, _template_args(demangled, found.end())))
    dtype = by_demangled(args.get("scalar_t", "?"))
    return {"kernel": form, "dtype": dtype.name if dtype else args.get("scalar_t", "?"),
            "head_size": int(args["HEAD_SIZE"]), "block_size": int(args["BLOCK_SIZE"]),
            "heads": int(args["HEADS"]), "lookahead": int(args["LOOKAHEAD"]),
            "ctas_per_sm": int(args.get("CTAS_PER_SM", 0)), "logits": "global" if in_global else "shared"}  # fmt: skip


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


def grouped_kernels(sass: Mapping[tuple[str, str], SassKernel], usage: Mapping[tuple[str, str], Mapping[str, int]],
                    names: Mapping[str, str], config: PatchConfig | None = None) -> tuple[GroupedKernel, ...]:  # fmt: skip
    """The grouped form's kernels among a library's SASS functions, with what ptxas allocated and
    (from the variant's ``config``) when each loads its K and V vectors, which its name does not say."""
    out = []
    for (arch, sym), found in sass.items():
        form = describe_grouped(names.get(sym, sym))
        if form is not None:
            res = usage.get((arch, sym), {})
            own = config.resolve(str(form["dtype"]), int(form["head_size"]), int(form["block_size"]), "auto",
                                 str(form["kernel"])) if config is not None else None  # fmt: skip
            out.append(GroupedKernel(arch=arch, **form, registers=res.get("registers", 0),
                                     spill_stores=res.get("spill_stores", 0), spill_loads=res.get("spill_loads", 0),
                                     has_prefetch=found.has_prefetch, symbol=sym, sass=found.digest,
                                     v_loads=own.group_v_loads if own is not None else "at-use",
                                     k_loads=own.group_k_loads if own is not None else "at-use"))  # fmt: skip
    return tuple(sorted(out, key=lambda g: (g.arch, g.kernel, g.dtype, g.head_size, g.block_size)))


def with_sass_counts(result: VariantResult, found: Mapping[tuple[str, str], SassKernel]) -> VariantResult:
    """``result`` with each kernel's floating-point op counts, :attr:`~KernelInfo.load_use` and
    :attr:`~KernelInfo.sass` taken from ``found`` (:func:`scan_sass_kernels` of its kept
    ``kernels.sass.gz``, in its namespace): for builds made before kvpatch read the load-use
    distance (which also counted FP ops only up to address 0xffff) or the digest."""

    def again(k: KernelInfo) -> KernelInfo:
        got = found.get((k.arch, k.symbol))
        if got is None:
            return k
        return replace(k, fp_ops=tuple(sorted(got.fp_ops.items())), load_use=got.load_use, sass=got.digest)

    return replace(result, kernels=tuple(again(k) for k in result.kernels))


def kernel_count(configs: Sequence[Any], archs: int = 1) -> int:
    """How many of the kernels this module reads a variant's SASS holds: per arch, v1 and v2 for
    each configuration, and v2's reduce kernel once per dtype and head size (it reads no KV cache,
    so the block size and the cache dtype do not instantiate it again)."""
    return max(1, archs) * (2 * len(configs) + len({(c.dtype, c.head_size) for c in configs}))


def dump_sass(tools: Inspector, library: Path, out: Path, namespace: str = "") -> dict[tuple[str, str], SassKernel]:
    """Stream ``cuobjdump --dump-sass`` into ``out`` (gzip: --all's SASS is ~300 MB) and scan it
    (``namespace``: the library's, as :func:`sass_functions`)."""
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

        found = scan_sass_kernels(tee(), namespace)
        err = proc.stderr.read()
        if proc.wait() != 0:
            raise BuildError(f"cuobjdump --dump-sass {library.name} failed: {first_error(err)}")
    tmp.replace(out)
    return found


def dump_sass_text(tools: Inspector, library: Path, out: Path) -> str:
    """``cuobjdump --dump-sass`` of a small library: its text, also written to ``out``."""
    from ..fsutil import write_own

    text = run_text([str(tools.cuobjdump), "--dump-sass", str(library)], env=tools.env())
    write_own(out, text)
    return text


def extract_cubins(tools: Inspector, library: Path, dest: Path) -> None:
    """``cuobjdump --extract-elf all`` into ``dest`` (emptied of older cubins first)."""
    dest.mkdir(exist_ok=True)
    for old in dest.glob("*.cubin"):
        old.unlink()
    run_text([str(tools.cuobjdump), "--extract-elf", "all", str(library)], cwd=dest, env=tools.env())
