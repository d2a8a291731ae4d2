"""Print summary.md's tables from the JSONs beside this file (run from the repository root:
python benchmarks/results/releases-tune-7/summarize.py)."""

import gzip
import json
import math
import os
import sys

sys.path.insert(0, os.getcwd())
from kvpatch.config_io import config_from_marker  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RELEASES = ["0.6.4", "0.8.5", "0.9.2", "0.10.0", "0.10.2", "0.11.2"]


def load(*parts):
    with gzip.open(os.path.join(HERE, *parts)) as f:
        return json.load(f)


def cells(bench, variant="patched"):
    """Per (dtype, mode): all dispatched points, and the points where the variant's code differs from stock."""
    cfg = config_from_marker(bench["variant_info"]["patched"]["marker"])
    out = {}
    for dt in ("fp16", "bf16"):
        for mode in ("warm", "cold"):
            sel = [r for r in bench["results"] if r["dispatched"] and r["mode"] == mode and r["point"]["dtype"] == dt]
            rows = []
            for r in sel:
                p = r["point"]
                on = variant == "patched" and cfg.prefetches(dt, p["head_size"], p["block_size"], p["kv_cache_dtype"], r["kernel"])
                rows.append((r["variants"][variant]["speedup"], r["variants"][variant]["verdict"], on))
            out[(dt, mode)] = rows
    return out


def fmt(rows):
    geo = math.exp(sum(math.log(s) for s, _, _ in rows) / len(rows))
    n = {v: sum(1 for _, x, _ in rows if x == v) for v in ("faster", "noise", "slower")}
    on = [(s, v) for s, v, o in rows if o]
    on_n = "-".join(str(sum(1 for _, x in on if x == v)) for v in ("faster", "noise", "slower"))
    on_txt = f"; where the code differs: {len(on)} points, {on_n}, min {min(s for s, _ in on):.2f}" if on else ""
    return f"{geo:.2f} (min {min(s for s, _, _ in rows):.2f}), {n['faster']}-{n['noise']}-{n['slower']}{on_txt}"


print("| release | validate | fp16 warm | fp16 cold | bf16 warm | bf16 cold | rounds flagged |")
print("|---|---|---|---|---|---|---|")
for v in RELEASES:
    if v == "0.10.2":
        val = load(v, "validate-full.json.gz")
    else:
        val = load(v, "validate.json.gz")
    c = val["counts"]
    ident = val["identical"]["patched"]
    b = load(v, "bench-heldout.json.gz")
    cl = cells(b)
    flagged = f"{b['flagged_rounds']}/{len(b['rounds'])}" if "flagged_rounds" in b else "?"
    print(f"| {v} | {ident['identical']}/{ident['checked']} identical ({c['failed']} failed) | "
          + " | ".join(fmt(cl[(dt, m)]) for dt in ("fp16", "bf16") for m in ("warm", "cold")) + f" | {flagged} |")

for name, sub in (("de Bruijn order (0.10.2/)", ""), ("rotation (0.10.2/aa-rotation/)", "aa-rotation")):
    print(f"\nA/A control, {name}: stock-aa vs stock, held-out then headline")
    for setname in ("bench-heldout.json.gz", "bench-headline.json.gz"):
        b = load("0.10.2", *([sub] if sub else []), setname)
        cl = cells(b, "stock-aa")
        print(f"  {setname.split('.')[0]}: " + " | ".join(f"{dt} {m} {fmt(cl[(dt, m)])}" for dt in ("fp16", "bf16") for m in ("warm", "cold")))
