"""The held-out points of releases-tune-23 seen from tune-24 (tune-23 with fp16/256/16/auto/v2
off): per release and cell, the points whose kernel tune-24 compiles differently from stock, and
their measured speedups (those kernels' SASS is tune-23's, sass-vs-tune-23.txt). The points of
fp16/256/16/auto/v2 are left out: tune-24 runs stock's code there, which this run did not time.

    python benchmarks/results/releases-tune-23/tune24_view.py
"""
import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from kvpatch.config import make_config  # noqa: E402
from kvpatch.config_io import read_config_file  # noqa: E402

cfg = make_config(**read_config_file(HERE.parent / "tune-24" / "kvpatch.toml")[0])
print("| release | fp16 warm | fp16 cold | bf16 warm | bf16 cold |\n|---|---|---|---|---|")
for v in ["0.6.4", "0.8.5", "0.9.2", "0.10.0", "0.10.2", "0.11.2"]:
    bench = json.load(gzip.open(HERE / v / "bench-heldout.json.gz", "rt"))
    cells = {}
    for r in bench["results"]:
        p = r["point"]
        if not r["dispatched"] or not cfg.prefetches(p["dtype"], p["head_size"], p["block_size"], p["kv_cache_dtype"], r["kernel"]):
            continue
        s = r["variants"]["patched"]
        cells.setdefault((p["dtype"], r["mode"]), []).append((s["speedup"], s["verdict"]))
    row = []
    for c in [(d, m) for d in ("fp16", "bf16") for m in ("warm", "cold")]:
        xs = cells.get(c, [])
        n = {k: sum(1 for _, x in xs if x == k) for k in ("faster", "noise", "slower")}
        row.append(f"{len(xs)} pts, min {min(x for x, _ in xs):.2f}, {n['faster']}-{n['noise']}-{n['slower']}")
    print(f"| {v} | " + " | ".join(row) + " |")
