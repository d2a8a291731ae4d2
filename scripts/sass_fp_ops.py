"""Count the floating-point SASS instructions of every kernel, stock vs patched.

    kvpatch build --all --json > build.json
    python scripts/sass_fp_ops.py build.json fp_ops.json

Reads the ``kernels.sass.gz`` each variant's build kept and writes, per kernel, stock's and
patched's register counts and whether their FP-op counts (FFMA, FADD, FMUL, HFMA2 but not
HFMA2.MMA, HADD2, HMUL2, FMNMX, MUFU, F2F, FSEL) are the same. A difference is a warning, not
a proof of different results (docs/tuning.md: it found the bf16 ALiBi instantiations whose
loop nvcc stops unswitching; fp16 differs in count and is bit-identical).
"""

import gzip
import json
import sys

from kvpatch.jit.sass import scan_sass_kernels  # the FP ops counted: kvpatch.jit.sass.FP_OPS

if len(sys.argv) != 3:
    sys.exit("usage: python scripts/sass_fp_ops.py BUILD.json OUT.json")
d = json.load(open(sys.argv[1]))


def sigs(v):
    with gzip.open(v["sass"], "rt") as f:
        return {sym: k.fp_ops for (_, sym), k in scan_sass_kernels(f).items()}


vs = {v["name"]: v for v in d["variants"]}
S, P = sigs(vs["stock"]), sigs(vs["patched"])


def key(k):
    return (k["kernel"], k["dtype"], k["kv_cache_dtype"], k["head_size"], k["block_size"])


sk = {key(k): k for k in vs["stock"]["kernels"]}
rows = []
for k in vs["patched"]["kernels"]:
    s = sk[key(k)]
    rows.append(
        {
            "kernel": key(k),
            "regs": [s["registers"], k["registers"]],
            "fp_same": S[s["symbol"]] == P[k["symbol"]],
            "prefetch": k["has_prefetch"],
        }
    )
json.dump(rows, open(sys.argv[2], "w"), indent=0)
print(sum(not r["fp_same"] for r in rows), "of", len(rows), "kernels differ in FP ops from stock")
