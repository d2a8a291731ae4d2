"""Build the part of a vLLM release's compiled ops (``vllm/_C.abi3.so``) that a dense
Llama-family model needs on vLLM's V0 engine with the XFORMERS backend, against the
torch the GPU machine has (torch 2.11, CUDA 13), here, with nvcc and no GPU.

    python scripts/vllm_ops.py --tree TREE --torch-include DIR --out DIR [--arch 9.0a] [--jobs N]
        [--extra-include DIR ...] [--python-include DIR]

vLLM's wheels pin an older torch; this is how its own Python runs against another one.
Every kernel is compiled from the release's own ``csrc/`` with vLLM's own nvcc flags
(:func:`kvpatch.jit.flags.vllm_nvcc_flags`); what is *not* vLLM's is listed below, in one
place, with why it is off the measured path:

* :data:`SOURCES`: the files compiled; everything else of ``csrc/`` (quantization,
  MoE, CUTLASS GEMMs, custom all-reduce, Mamba, ...) is left out, and its ops are not
  registered (a call to one raises AttributeError naming it).
* The ops registered: every op of the release's ``torch_bindings.cpp`` whose function the
  compiled sources define (read from their symbols), with that file's schema text (read by
  :func:`kvpatch.vllm_plugin.schemas_from_bindings`) and dispatch key.
* :data:`STANDINS`: vLLM asks at start-up whether CUTLASS FP8/FP4/sparse/grouped GEMMs are
  supported; these answer ``false`` (no CUTLASS is built), so it never picks them.
* :data:`CUB_SUM`: CUDA 13's CCCL dropped ``cub::Sum``, which ``layernorm_kernels.cu``
  uses as the block-reduce operator; a forced include defines it as ``cuda::std::plus<>``
  (the same addition).

Writes ``DIR/_C.abi3.so`` and ``DIR/ops.json`` (release, sources, ops, flags, sha256); keeps
the objects in ``DIR/build`` (a second run compiles only what changed).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's kvpatch

from kvpatch.arch import parse_arch_list  # noqa: E402
from kvpatch.jit.flags import vllm_nvcc_flags  # noqa: E402
from kvpatch.jit.toolchain import find_nvcc  # noqa: E402
from kvpatch.vllm_plugin import schemas_from_bindings  # noqa: E402

#: The csrc/ files a dense Llama on V0 + XFORMERS calls into (attention decode, the KV
#: cache writes and block copies, RMSNorm, SiLU-and-mul, rotary, the sampler's
#: repetition penalty, the device-attribute queries).
SOURCES = (
    "attention/paged_attention_v1.cu",
    "attention/paged_attention_v2.cu",
    "cache_kernels.cu",
    "layernorm_kernels.cu",
    "activation_kernels.cu",
    "pos_encoding_kernels.cu",
    "sampler.cu",
    "cuda_utils_kernels.cu",
)

#: Ops the header ops.h defines inline (so no compiled source defines them).
INLINE = ("weak_ref_tensor",)

#: The capability queries answered without CUTLASS (declared in the release's ops.h).
STANDINS = (
    "cutlass_scaled_mm_supports_fp8",
    "cutlass_scaled_mm_supports_block_fp8",
    "cutlass_scaled_mm_supports_fp4",
    "cutlass_group_gemm_supported",
    "cutlass_sparse_scaled_mm_supported",
)

CUB_SUM = """#pragma once
// CUDA 13's CCCL removed cub::Sum; vLLM 0.10.x's layernorm reduces with it.
#include <cub/cub.cuh>
#include <cuda/std/functional>
namespace cub {
using Sum = ::cuda::std::plus<>;
}
"""

_LIBRARY_NAMES = {
    "ops": "TORCH_EXTENSION_NAME",
    "cache_ops": "CONCAT(TORCH_EXTENSION_NAME, _cache_ops)",
    "cuda_utils": "CONCAT(TORCH_EXTENSION_NAME, _cuda_utils)",
}


def registrations(release_bindings: str) -> dict[str, tuple[str, str | None, str]]:
    """op -> (library variable, dispatch key or None, the function) for every
    ``lib.impl("op", [torch::kKEY,] &fn)`` of the release's bindings."""
    out = {}
    for lib in _LIBRARY_NAMES:
        at = 0
        needle = f"{lib}.impl("
        while (at := release_bindings.find(needle, at)) >= 0:
            if at and (release_bindings[at - 1].isalnum() or release_bindings[at - 1] == "_"):
                at += len(needle)
                continue
            close = release_bindings.find(")", at)
            args = [a.strip() for a in release_bindings[at + len(needle) : close].split(",")]
            at = close
            if len(args) not in (2, 3) or not args[0].startswith('"') or not args[-1].startswith("&"):
                continue
            key = args[1].removeprefix("torch::") if len(args) == 3 else None
            out[args[0].strip('"')] = (lib, key, args[-1][1:].strip())
    return out


def bindings_source(release_bindings: str, ops: dict[str, tuple[str, str | None, str]]) -> str:
    """The registration unit: ``ops`` with the release's own schema texts."""
    schemas = schemas_from_bindings(release_bindings, tuple(ops))
    lines = [
        "// The ops of vLLM's csrc/torch_bindings.cpp that scripts/vllm_ops.py builds, with its schemas.",
        '#include "cache.h"',
        '#include "cuda_utils.h"',
        '#include "ops.h"',
        '#include "core/registration.h"',
        "#include <torch/library.h>",
        "",
        "// No CUTLASS GEMM is built: every capability query answers false. (Here, not in a unit of",
        "// its own: ops.h defines weak_ref_tensor, so only one unit may include it.)",
        *(f"bool {fn}(int64_t) {{ return false; }}" for fn in STANDINS),
        "",
    ]
    for lib, name in _LIBRARY_NAMES.items():
        lines.append(f"TORCH_LIBRARY_EXPAND({name}, {lib}) {{")
        for op, (owner, key, fn) in ops.items():
            if owner != lib:
                continue
            lines.append(f"  {lib}.def({json.dumps(schemas[op])});")
            where = f"torch::{key}, " if key else ""
            lines.append(f'  {lib}.impl("{op}", {where}&{fn});')
        lines.append("}")
        lines.append("")
    lines.append("REGISTER_EXTENSION(TORCH_EXTENSION_NAME)")
    return "\n".join(lines) + "\n"


def defined_functions(objects: list[Path]) -> set[str]:
    """The global functions the objects define (names without namespace or arguments)."""
    text = subprocess.run(["nm", "-C", "--defined-only", "-g", *map(str, objects)], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    names = set()
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in ("T", "W") and "(" in parts[2]:
            names.add(parts[2].split("(", 1)[0])
    return names


def build_key(argv: list[str]) -> str:
    """What an object depends on: its command line and its source's bytes (the release's
    headers do not change under a cached release)."""
    source = Path(argv[argv.index("-c") + 1])
    return json.dumps({"argv": argv, "source": hashlib.sha256(source.read_bytes()).hexdigest()})


#: torch's libraries an extension links (what torch.utils.cpp_extension passes, less torch_python).
TORCH_LIBS = ("c10", "c10_cuda", "torch", "torch_cpu", "torch_cuda")


def _dynamic_symbols(path: Path, flag: str) -> set[str]:
    text = subprocess.run(["nm", "-D", flag, str(path)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in text.splitlines() if line.strip()}


def unresolved_symbols(so: Path, libs: list[Path]) -> list[str]:
    """The library's undefined symbols that neither the linked torch libraries define nor the
    system, CUDA runtime or Python provide (versioned glibc/libstdc++/cudart symbols, ``Py*``):
    what would fail at ``import vllm._C`` on the GPU machine."""
    defined: set[str] = set()
    for lib in libs:
        defined |= {s.split("@")[0] for s in _dynamic_symbols(lib, "--defined-only")}
    out = []
    for sym in sorted(_dynamic_symbols(so, "--undefined-only")):
        if "@" in sym or sym.startswith(("Py", "_Py", "__gmon_start__", "_ITM_", "__cxa_finalize")) or sym in defined:
            continue
        out.append(sym)
    return out


def compile_cached(argv: list[str], obj: Path, log: Path) -> bool:
    """Compile unless ``obj`` was made from this very command line and source; True when it compiled."""
    cmd = obj.with_suffix(".cmd")
    line = build_key(argv)
    if obj.exists() and cmd.exists() and cmd.read_text() == line:
        return False
    obj.unlink(missing_ok=True)
    _run(argv, log)
    cmd.write_text(line)
    return True


def _run(argv: list[str], log: Path) -> None:
    with open(log, "w") as f:
        proc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-20:]
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(argv[:3])} ... ; see {log}\n" + "\n".join(tail))


DEFINES = (
    "-DTORCH_EXTENSION_NAME=_C",
    "-D_GLIBCXX_USE_CXX11_ABI=1",
    "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE",
    "-DPy_LIMITED_API=0x03090000",
)


def plan(args: argparse.Namespace, work: Path) -> tuple[list[str], list[tuple[str, list[str], Path]]]:
    """The nvcc flags, and (source, command line, object) for each of :data:`SOURCES`."""
    csrc = args.tree.resolve() / "csrc"
    nvcc = str(find_nvcc())
    gencode = [f for a in parse_arch_list(args.arch) for f in a.gencode_flags()]
    inc = [csrc, args.torch_include, args.torch_include / "torch" / "csrc" / "api" / "include", *args.extra_include]
    common = [*DEFINES, *(f"-I{p.resolve()}" for p in inc), f"-I{args.python_include}"]
    cu_flags = [*vllm_nvcc_flags(), *gencode, "-Xcompiler", "-fPIC", *common]
    kernels = []
    for i, rel in enumerate(SOURCES):
        obj = work / f"{i:02d}-{Path(rel).stem}.o"
        extra = ["-include", str((work / "cub_sum.h").resolve())] if rel == "layernorm_kernels.cu" else []
        kernels.append((rel, [nvcc, *cu_flags, *extra, "-c", str(csrc / rel), "-o", str(obj)], obj))
    return cu_flags, kernels


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, required=True, help="the release's source tree (csrc/ inside)")
    ap.add_argument("--torch-include", type=Path, required=True, help="torch's include/ of the target torch")
    ap.add_argument(
        "--torch-lib",
        type=Path,
        required=True,
        help="the target torch's lib/ (libc10, libtorch*: linked by name, as vLLM's build links them)",
    )
    ap.add_argument("--extra-include", type=Path, action="append", default=[], help="e.g. cuBLAS/cuSOLVER headers")
    ap.add_argument("--python-include", type=Path, default=Path(sysconfig.get_paths()["include"]))
    ap.add_argument("--arch", default="9.0a")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    csrc = args.tree.resolve() / "csrc"
    release_bindings = (csrc / "torch_bindings.cpp").read_text(encoding="utf-8")
    work = args.out / "build"  # objects kept: a second run compiles only what changed
    work.mkdir(parents=True, exist_ok=True)
    (work / "cub_sum.h").write_text(CUB_SUM)
    cu_flags, kernels = plan(args, work)
    nvcc = kernels[0][1][0]
    gencode = [f for a in parse_arch_list(args.arch) for f in a.gencode_flags()]

    t0 = time.monotonic()

    def compile_all(jobs: list[tuple[str, list[str], Path]]) -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = {pool.submit(compile_cached, argv, obj, obj.with_suffix(".log")): rel for rel, argv, obj in jobs}
            for done in concurrent.futures.as_completed(futures):
                how = "compiled" if done.result() else "up to date:"
                print(f"[{time.monotonic() - t0:6.0f}s] {how} {futures[done]}", flush=True)

    compile_all(kernels)
    defined = defined_functions([obj for _, _, obj in kernels]) | set(INLINE) | set(STANDINS)
    ops = {op: r for op, r in registrations(release_bindings).items() if r[2] in defined}
    (work / "bindings.cpp").write_text(bindings_source(release_bindings, ops))
    units = [("bindings.cpp", [nvcc, *cu_flags, "-c", str(work / "bindings.cpp"), "-o", str(work / "bindings.o")],
              work / "bindings.o")]  # fmt: skip
    compile_all(units)
    objs = [str(obj) for _, _, obj in (*kernels, *units)]
    so = args.out / "_C.abi3.so"
    libs = [f"-L{args.torch_lib.resolve()}", *(f"-l{name}" for name in TORCH_LIBS), "-lcudart"]
    _run([nvcc, "-shared", *gencode, "-o", str(so), *objs, *libs], work / "link.log")
    # Host debug info only (-g of RelWithDebInfo): 51 MiB -> 13 MiB, as vLLM's wheels ship it.
    _run(["strip", "--strip-debug", str(so)], work / "strip.log")
    unresolved = unresolved_symbols(so, [args.torch_lib / f"lib{name}.so" for name in TORCH_LIBS])
    if unresolved:
        raise SystemExit(f"{so}: {len(unresolved)} symbols no linked library defines, e.g. {unresolved[:3]}")
    info = {
        "release_tree": str(args.tree),
        "sources": list(SOURCES),
        "ops": {
            op: {"library": lib, "dispatch": key or "catch-all", "function": fn} for op, (lib, key, fn) in ops.items()
        },
        "standins": list(STANDINS),
        "nvcc_flags": [*vllm_nvcc_flags(), *gencode],
        "defines": DEFINES,
        "sha256": hashlib.sha256(so.read_bytes()).hexdigest(),
        "seconds": round(time.monotonic() - t0, 1),
    }
    (args.out / "ops.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"{so} ({so.stat().st_size / 2**20:.1f} MiB, {len(ops)} ops, {info['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
