"""Print summary.md's tables from the JSONs beside this file (run from the repository root:
python benchmarks/results/releases-tune-8/summarize.py)."""

import gzip
import json
import math
import os
import sys

sys.path.insert(0, os.getcwd())
from kvpatch.config_io import config_from_marker  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RELEASES = ["0.6.4", "0.8.5", "0.9.2", "0.10.0", "0.10.2", "0.11.2"]
CELLS = [(dt, m) for dt in ("fp16", "bf16") for m in ("warm", "cold")]


def load(*parts):
    with gzip.open(os.path.join(HERE, *parts)) as f:
        return json.load(f)


def dispatched(bench, dt, mode):
    return [r for r in bench["results"] if r["dispatched"] and r["mode"] == mode and r["point"]["dtype"] == dt]


def cells(bench, variant="patched"):
    """Per (dtype, mode): (speedup, verdict, whether the variant's code differs from stock) per dispatched point."""
    cfg = config_from_marker(bench["variant_info"]["patched"]["marker"])
    out = {}
    for dt, mode in CELLS:
        rows = []
        for r in dispatched(bench, dt, mode):
            p = r["point"]
            on = variant == "patched" and cfg.prefetches(dt, p["head_size"], p["block_size"], p["kv_cache_dtype"], r["kernel"])
            rows.append((r["variants"][variant]["speedup"], r["variants"][variant]["verdict"], on))
        out[(dt, mode)] = rows
    return out


def geo(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def fmt(rows):
    n = {v: sum(1 for _, x, _ in rows if x == v) for v in ("faster", "noise", "slower")}
    on = [(s, v) for s, v, o in rows if o]
    on_n = "-".join(str(sum(1 for _, x in on if x == v)) for v in ("faster", "noise", "slower"))
    on_txt = f"; where the code differs: {len(on)} points, {on_n}, min {min(s for s, _ in on):.2f}" if on else ""
    return f"{geo([s for s, _, _ in rows]):.2f} (min {min(s for s, _, _ in rows):.2f}), {n['faster']}-{n['noise']}-{n['slower']}{on_txt}"


print("| release | validate | fp16 warm | fp16 cold | bf16 warm | bf16 cold | rounds flagged |")
print("|---|---|---|---|---|---|---|")
for v in RELEASES:
    val = load(v, "validate-full.json.gz" if v == "0.10.2" else "validate.json.gz")
    c = val["counts"]
    ident = val["identical"]["patched"]
    b = load(v, "bench-heldout.json.gz")
    cl = cells(b)
    flagged = f"{b['flagged_rounds']}/{len(b['rounds'])}" if "flagged_rounds" in b else "?"
    print(f"| {v} | {ident['identical']}/{ident['checked']} identical ({c['failed']} failed) | "
          + " | ".join(fmt(cl[c_]) for c_ in CELLS) + f" | {flagged} |")

with open(os.path.join(HERE, "0.10.2", "upstream.json")) as f:
    up = json.load(f)["upstream"]
print("\n0.10.2 validate --upstream:", json.dumps({k: up[k] for k in up if k in ("test", "ok", "identical")}))

h = load("0.10.2", "bench-headline.json.gz")
print("\nHeadline (0.10.2, GQA 32/8, head 128, block 16, auto cache, seed 1; dispatched kernel): min / median / geomean")
print("| variant | fp16 warm | fp16 cold | bf16 warm | bf16 cold |")
print("|---|---|---|---|---|")
for name in [n for n in h["variants"] if n != h["baseline"]]:
    row = []
    for dt, mode in CELLS:
        s = sorted(r["variants"][name]["speedup"] for r in dispatched(h, dt, mode))
        row.append(f"{s[0]:.2f} / {s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2:.2f} / {geo(s):.2f}")
    print(f"| {name} | " + " | ".join(row) + " |")
both = {m: geo([r["variants"]["patched"]["speedup"] for dt in ("fp16", "bf16") for r in dispatched(h, dt, m)])
        for m in ("warm", "cold")}
print(f"\npatched, both dtypes (24 dispatched points per mode): geomean warm {both['warm']:.2f}, cold {both['cold']:.2f}")
for mode in ("warm", "cold"):
    pts = dispatched(h, "bf16", mode)
    # the paper's interval entirely above patched's: patched behind the paper beyond noise
    behind = [r for r in pts if r["variants"]["paper"]["speedup_lo"] > r["variants"]["patched"]["speedup_hi"]]
    ratio = [r["variants"]["patched"]["speedup"] / r["variants"]["paper"]["speedup"] for r in pts]
    print(f"bf16 {mode}: patched / paper per point min {min(ratio):.3f}, geomean {geo(ratio):.3f}; "
          f"paper ahead beyond noise at {len(behind)} of {len(pts)}: " + ", ".join(r["name"] for r in behind))

print("\nA/A control (0.10.2/): stock-aa vs stock, held-out then headline")
for setname in ("bench-heldout.json.gz", "bench-headline.json.gz"):
    cl = cells(load("0.10.2", setname), "stock-aa")
    print(f"  {setname.split('.')[0]}: " + " | ".join(f"{dt} {m} {fmt(cl[(dt, m)])}" for dt, m in CELLS))

print("\nWhere tune-8 compiles stock's code (SASS-identical), patched vs A/A on 0.10.2's held-out set: geomean, min, slower")
b = load("0.10.2", "bench-heldout.json.gz")
pc, aa = cells(b), cells(b, "stock-aa")
for c_ in CELLS:
    off = [i for i, (_, _, on) in enumerate(pc[c_]) if not on]
    p = [pc[c_][i] for i in off]
    a = [aa[c_][i] for i in off]
    print(f"  {c_[0]} {c_[1]} ({len(off)} points): patched {geo([s for s, _, _ in p]):.4f}, min {min(s for s, _, _ in p):.2f}, "
          f"{sum(v == 'slower' for _, v, _ in p)} slower | stock-aa {geo([s for s, _, _ in a]):.4f}, "
          f"min {min(s for s, _, _ in a):.2f}, {sum(v == 'slower' for _, v, _ in a)} slower")
