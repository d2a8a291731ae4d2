"""Print summary.md's tables from the JSONs beside this file (run from the repository root:
python benchmarks/results/releases-tune-12/summarize.py). On the headline shape (fp16/bf16 head
128 block 16) tune-12 compiles what tune-8 does (0.10.2/sass-vs-tune-8.txt); its own headline run
(0.10.2/headline-aa/) has stock, tune-12 and the A/A twin, not the paper's patch."""

import gzip
import json
import os
import sys

sys.path.insert(0, os.getcwd())
from kvpatch.config_io import config_from_marker  # noqa: E402
from kvpatch.gpu.stats import geomean as geo, median  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RELEASES = ["0.6.4", "0.8.5", "0.9.2", "0.10.0", "0.10.2", "0.11.2"]
CELLS = [(dt, m) for dt in ("fp16", "bf16") for m in ("warm", "cold")]


def load(*parts):
    with gzip.open(os.path.join(HERE, *parts)) as f:
        return json.load(f)


def cells(bench):
    """Per (dtype, mode): (speedup, verdict, whether patched's code differs from stock, kernel key) per dispatched point."""
    cfg = config_from_marker(bench["variant_info"]["patched"]["marker"])
    out = {}
    for dt, mode in CELLS:
        rows = []
        for r in bench["results"]:
            p = r["point"]
            if not r["dispatched"] or r["mode"] != mode or p["dtype"] != dt:
                continue
            on = cfg.prefetches(dt, p["head_size"], p["block_size"], p["kv_cache_dtype"], r["kernel"])
            key = f"{dt}/{p['head_size']}/{p['block_size']}/{p['kv_cache_dtype']}/{r['kernel']}"
            rows.append((r["variants"]["patched"]["speedup"], r["variants"]["patched"]["verdict"], on, key))
        out[(dt, mode)] = rows
    return out


def fmt(rows):
    n = {v: sum(1 for r in rows if r[1] == v) for v in ("faster", "noise", "slower")}
    on = [r for r in rows if r[2]]
    on_n = "-".join(str(sum(1 for r in on if r[1] == v)) for v in ("faster", "noise", "slower"))
    on_txt = f"; where the code differs: {len(on)} points, {on_n}, min {min(r[0] for r in on):.2f}" if on else ""
    return f"{geo([r[0] for r in rows]):.2f} (min {min(r[0] for r in rows):.2f}), {n['faster']}-{n['noise']}-{n['slower']}{on_txt}"


print("| release | validate | fp16 warm | fp16 cold | bf16 warm | bf16 cold | rounds flagged |")
print("|---|---|---|---|---|---|---|")
per_kernel = {}
for v in RELEASES:
    val = load(v, "validate-full.json.gz" if v == "0.10.2" else "validate.json.gz")
    ident = val["identical"]["patched"]
    b = load(v, "bench-heldout.json.gz")
    cl = cells(b)
    for c_ in CELLS:
        for s, verdict, on, key in cl[c_]:
            if on:
                per_kernel.setdefault((key, c_[1]), []).append(s)
    flagged = f"{b['flagged_rounds']}/{len(b['rounds'])}" if "flagged_rounds" in b else "?"
    print(f"| {v} | {ident['identical']}/{ident['checked']} identical ({val['counts']['failed']} failed) | "
          + " | ".join(fmt(cl[c_]) for c_ in CELLS) + f" | {flagged} |")

with open(os.path.join(HERE, "0.10.2", "upstream.json")) as f:
    up = json.load(f)["upstream"]
print("\n0.10.2 validate --upstream:", json.dumps({k: up[k] for k in up if k in ("test", "ok", "identical")}))

print("\nPer kernel the table turns on, all six releases' held-out points pooled: n, min, geomean")
for (key, mode), xs in sorted(per_kernel.items()):
    print(f"  {key:22s} {mode}: n {len(xs):3d}, min {min(xs):.2f}, geomean {geo(xs):.2f}")

h = load("0.10.2", "headline-aa", "bench-headline.json.gz")
print("\nHeadline (0.10.2, GQA 32/8, head 128, block 16, auto cache, seed 1; dispatched kernel): min / median / geomean")
print("| variant | fp16 warm | fp16 cold | bf16 warm | bf16 cold |")
print("|---|---|---|---|---|")
for name in [n for n in h["variants"] if n != h["baseline"]]:
    row = []
    for dt, mode in CELLS:
        xs = sorted(r["variants"][name]["speedup"] for r in h["results"]
                    if r["dispatched"] and r["mode"] == mode and r["point"]["dtype"] == dt)
        row.append(f"{xs[0]:.2f} / {median(xs):.2f} / {geo(xs):.2f}")
    print(f"| {name} | " + " | ".join(row) + " |")
both = {m: geo([r["variants"]["patched"]["speedup"] for r in h["results"] if r["dispatched"] and r["mode"] == m])
        for m in ("warm", "cold")}
print(f"\npatched, both dtypes (24 dispatched points per mode): geomean warm {both['warm']:.2f}, cold {both['cold']:.2f}")
