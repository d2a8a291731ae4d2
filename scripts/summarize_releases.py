"""Print a releases-<table>/ folder's summary tables (markdown) from the JSONs the GPU runs wrote.

    python scripts/summarize_releases.py benchmarks/results/releases-tune-17 [--table tune-17]

The folder holds one subfolder per header revision: 0.10.2/ from ``scripts/gpu_run.sh LIBS
full,upstream,heldout`` (validate-full.json.gz, upstream.json, bench-heldout.json.gz) with
headline-aa/ from ``AA=1 scripts/gpu_run.sh LIBS headline``, the others from
``scripts/gpu_releases.sh`` (validate.json.gz, bench-heldout.json.gz); any release may have
validate-full.json.gz, upstream.json and headline-aa/. Per release: validate's identical count,
and per dtype and mode the held-out geomean (min), faster-noise-slower, the same over the points
whose kernel the table compiles differently from stock, and, where the bench timed stock against
itself (``--aa``), the A/A twin's own counts; then per kernel the table turns on, the releases'
points pooled; then each headline run's rows, and where it has the paper's patch, patched against
it point by point. (Replaces the summarize.py each
releases-tune-* folder had its own copy of.)"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvpatch.config_io import config_from_marker  # noqa: E402
from kvpatch.gpu.stats import geomean, median  # noqa: E402

RELEASES = ["0.6.4", "0.8.5", "0.9.2", "0.10.0", "0.10.2", "0.11.2"]
CELLS = [(dt, m) for dt in ("fp16", "bf16") for m in ("warm", "cold")]
VERDICTS = ("faster", "noise", "slower")


def load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def cells(bench: dict, cfg: Any = None, variant: str = "patched") -> dict:
    """(dtype, mode) -> [(speedup, verdict, whether patched's code differs from stock, kernel)] over
    dispatched points, of ``variant`` against stock; "differs" by ``cfg`` (a PatchConfig), by
    default the bench's recorded one for patched."""
    if cfg is None:
        cfg = config_from_marker(bench["variant_info"]["patched"]["marker"])
    out: dict = {c: [] for c in CELLS}
    for r in bench["results"]:
        p = r["point"]
        if not r["dispatched"] or (p["dtype"], r["mode"]) not in out:
            continue
        on = cfg.prefetches(p["dtype"], p["head_size"], p["block_size"], p["kv_cache_dtype"], r["kernel"])
        key = f"{p['dtype']}/{p['head_size']}/{p['block_size']}/{p['kv_cache_dtype']}/{r['kernel']}"
        v = r["variants"][variant]
        out[(p["dtype"], r["mode"])].append((v["speedup"], v["verdict"], on, key))
    return out


def counts(rows: list) -> str:
    return "-".join(str(sum(1 for r in rows if r[1] == v)) for v in VERDICTS)


def cell(rows: list, aa: list | None = None) -> str:
    """One table cell; ``aa``: the same points' A/A twin (stock against itself), whose own
    "slower" count is the bench's false-alarm floor."""
    on = [r for r in rows if r[2]]
    text = f"{geomean([r[0] for r in rows]):.2f} (min {min(r[0] for r in rows):.2f}), {counts(rows)}"
    if on:
        text += f"; code differs: {len(on)} pts, {counts(on)}, min {min(r[0] for r in on):.2f}"
    if aa:
        text += f"; A/A twin {counts(aa)}, min {min(r[0] for r in aa):.2f}"
    return text


def headline(release: str, h: dict, table: str) -> None:
    """The headline rows of one release's headline run, and where it has the paper's patch,
    patched against it point by point."""
    pts = [r for r in h["results"] if r["dispatched"]]
    print(f"\n## Headline ({release}, GQA 32/8, head 128, block 16, auto cache, seed 1; dispatched kernel): "
          "min / median / geomean\n")
    print("| variant | fp16 warm | fp16 cold | bf16 warm | bf16 cold |")
    print("|---|---|---|---|---|")
    for name in [n for n in h["variants"] if n != h["baseline"]]:
        row = []
        for dt, mode in CELLS:
            xs = sorted(r["variants"][name]["speedup"] for r in pts if r["mode"] == mode and r["point"]["dtype"] == dt)
            row.append(f"{xs[0]:.2f} / {median(xs):.2f} / {geomean(xs):.2f}")
        print(f"| {name} | " + " | ".join(row) + " |")
    both = {m: geomean([r["variants"]["patched"]["speedup"] for r in pts if r["mode"] == m]) for m in ("warm", "cold")}
    print(f"\n{table} on {release}, both dtypes (every dispatched point per mode): "
          f"geomean warm {both['warm']:.2f}, cold {both['cold']:.2f}")
    if "paper" in h["variants"]:
        print(f"\n## {table} against the paper's patch, per headline point (patched speedup / paper speedup)\n")
        print("| dtype | mode | min | geomean | max | points where the paper's interval lies wholly above |")
        print("|---|---|---|---|---|---|")
        for dt, mode in CELLS:
            rs = [r for r in pts if r["mode"] == mode and r["point"]["dtype"] == dt]
            q = [r["variants"]["patched"]["speedup"] / r["variants"]["paper"]["speedup"] for r in rs]
            ahead = [f"B{r['point']['batch']}/{r['point']['context']}" for r in rs
                     if r["variants"]["paper"]["speedup_lo"] > r["variants"]["patched"]["speedup_hi"]]
            print(f"| {dt} | {mode} | {min(q):.3f} | {geomean(q):.3f} | {max(q):.3f} | {len(ahead)} of {len(rs)}"
                  + (f": {' '.join(ahead)}" if ahead else "") + " |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--table", default="patched", help="the table's name in the headings")
    a = ap.parse_args(argv)
    root: Path = a.folder
    print(f"## {a.table}: held-out set per header revision (geomean (min), faster-noise-slower; where the run "
          "timed stock against itself too, the A/A twin's own counts)\n")
    print("| release | validate | fp16 warm | fp16 cold | bf16 warm | bf16 cold | rounds flagged |")
    print("|---|---|---|---|---|---|---|")
    pooled: dict = {}
    for v in RELEASES:
        d = root / v
        if not d.is_dir():
            print(f"| {v} | not run | | | | | |")
            continue
        vpath = next((d / n for n in ("validate-full.json.gz", "validate.json.gz") if (d / n).is_file()), None)
        if vpath is None:  # a run whose validate record did not come back: say so, never a pass
            vtext = "no record"
        else:
            val = load(vpath)
            ident = val["identical"]["patched"]
            vtext = f"{ident['identical']}/{ident['checked']} identical ({val['counts']['failed']} failed)"
        bench = load(d / "bench-heldout.json.gz")
        cl = cells(bench)
        aa = cells(bench, variant="stock-aa") if "stock-aa" in bench["variants"] else {}
        for c in CELLS:
            for s, _verdict, on, key in cl[c]:
                if on:
                    pooled.setdefault((key, c[1]), []).append(s)
        flagged = f"{bench['flagged_rounds']}/{len(bench['rounds'])}" if "flagged_rounds" in bench else "?"
        print(f"| {v} | {vtext} | "
              + " | ".join(cell(cl[c], aa.get(c)) for c in CELLS) + f" | {flagged} |")  # fmt: skip
    for v in RELEASES:  # validate --upstream (0.10.2/, or a release's full-upstream/ run), and --full there
        extra = root / v / "full-upstream"
        full = extra / "validate-full.json.gz"
        if full.is_file():
            val = load(full)
            ident = val["identical"]["patched"]
            print(f"\n{v} `validate --full` (every instantiation vLLM builds): {ident['identical']}/{ident['checked']} "
                  f"identical ({val['counts']['failed']} failed)")  # fmt: skip
        for up_path in (root / v / "upstream.json", extra / "upstream.json"):
            if up_path.is_file():
                up = load(up_path)["upstream"]
                runs = "; ".join(f"{r['name']} {r['passed']} passed, {r['failed']} failed" for r in up["runs"])
                print(f"\n{v} `validate --upstream`: {runs}; identical {json.dumps(up['identical'])}; notes: {up['notes']}")
    print(f"\n## Per kernel {a.table} turns on, the releases' held-out points pooled\n")
    print("| kernel | mode | n | min | geomean |")
    print("|---|---|---|---|---|")
    for (key, mode), xs in sorted(pooled.items()):
        print(f"| {key} | {mode} | {len(xs)} | {min(xs):.2f} | {geomean(xs):.2f} |")
    for v in RELEASES:  # every release with a headline run (headline-aa/)
        hp = root / v / "headline-aa" / "bench-headline.json.gz"
        if hp.is_file():
            headline(v, load(hp), a.table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
