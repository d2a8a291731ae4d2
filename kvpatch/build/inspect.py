"""Reading what nvcc produced: ``ptxas -v`` logs (registers, spills) and the SASS
(``cuobjdump --dump-sass``: which kernels hold ``UBLKPF``), by demangled kernel name."""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping, Sequence

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
_SASS_OPCODE = re.compile(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)")


def scan_sass_kernels(lines: Iterable[str]) -> dict[tuple[str, str], tuple[bool, dict[str, int]]]:
    """``cuobjdump --dump-sass`` lines -> ``{(arch, symbol): (holds UBLKPF, {FP op: count})}``."""
    out: dict[tuple[str, str], tuple[bool, dict[str, int]]] = {}
    arch = ""
    current: tuple[str, str] | None = None
    has, ops = False, {}
    for line in lines:
        if m := _SASS_ARCH.match(line):
            arch = m.group(1)
        elif m := _SASS_FUNCTION.match(line):
            current, has, ops = (arch, m.group(1)), False, {}
            out[current] = (has, ops)
        elif current is not None:
            if PREFETCH_SASS in line and not has:
                has = True
                out[current] = (has, ops)
            if (op := _SASS_OPCODE.search(line)) and (fp := FP_OPS.match(op.group(1))):
                ops[fp.group(1)] = ops.get(fp.group(1), 0) + 1
    return out


def scan_sass(lines: Iterable[str]) -> dict[tuple[str, str], bool]:
    """``cuobjdump --dump-sass`` lines -> ``{(arch, symbol): holds UBLKPF}``."""
    return {k: has for k, (has, _) in scan_sass_kernels(lines).items()}


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
    sass: dict[tuple[str, str], tuple[bool, dict[str, int]]] = {}

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
    for (arch, sym), (has, ops) in sorted(sass.items()):
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
                                  fp_ops=tuple(sorted(ops.items())), split=split))  # fmt: skip
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


def dump_sass(tools: Inspector, library: Path, out: Path) -> dict[tuple[str, str], tuple[bool, dict[str, int]]]:
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
