"""Print the summary tables (markdown) of a folder of release runs, from the JSONs the GPU runs wrote.

    python scripts/summarize_releases.py FOLDER [--table NAME]

FOLDER holds one subfolder per header revision: 0.10.2/ from ``scripts/gpu_run.sh LIBS
full,upstream,heldout`` (validate-full.json.gz, upstream.json, bench-heldout.json.gz) with
headline-aa/ from ``AA=1 scripts/gpu_run.sh LIBS headline``, the others from
``scripts/gpu_releases.sh`` (validate.json.gz, bench-heldout.json.gz); any release may have
validate-full.json.gz, upstream.json and headline-aa/. Per release: validate's identical count
(the column is left out when no release has a validate record), and per dtype and mode the
held-out geomean (min), faster-noise-slower, the same over the points whose kernel the table
compiles differently from stock, and, where the bench timed stock against itself (``--aa``),
the A/A twin's own counts; then the verdicts over all releases; then per kernel the table turns
on, the releases' points pooled; then each headline run's rows, and where it has the paper's
patch, patched against it point by point. ``scripts/summarize_evidence.py`` uses these functions
for the evidence folders."""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvpatch.config import config_from_marker  # noqa: E402
from kvpatch.gpu.stats import geomean, median  # noqa: E402

RELEASES = ["0.6.4", "0.8.5", "0.9.2", "0.10.0", "0.10.2", "0.11.2"]
CELLS = [(dt, m) for dt in ("fp16", "bf16") for m in ("warm", "cold")]
VERDICTS = ("faster", "noise", "slower")


def span(xs: list[float], fmt: str = ".2f") -> str:
    """``'0.92-1.61'``: the range of ``xs`` as formatted, one number where both ends read the same."""
    lo, hi = format(min(xs), fmt), format(max(xs), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


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
    return "-".join(str(n_verdict(rows, v)) for v in VERDICTS)


def n_verdict(rows: list, verdict: str) -> int:
    return sum(1 for r in rows if r[1] == verdict)


def cell(rows: list, aa: list | None = None) -> str:
    """One table cell; ``aa``: the same points' A/A twin (stock against itself), whose own
    "slower" count is the bench's false-alarm floor."""
    on = [r for r in rows if r[2]]
    text = f"{geomean([r[0] for r in rows]):.2f} (min {min(r[0] for r in rows):.3f}), {counts(rows)}"
    if on:
        text += f"; code differs: {len(on)} pts, {counts(on)}, min {min(r[0] for r in on):.3f}"
    if aa:
        text += f"; A/A twin {geomean([r[0] for r in aa]):.2f}, {counts(aa)}, min {min(r[0] for r in aa):.3f}"
    return text


def validate_text(d: Path) -> str | None:
    """validate's identical count for a release folder; None when it has no validate file."""
    vpath = next((d / n for n in ("validate-full.json.gz", "validate.json.gz") if (d / n).is_file()), None)
    if vpath is None:
        return None
    val = load(vpath)
    ident = val["identical"]["patched"]
    return f"{ident['identical']}/{ident['checked']} identical ({val['counts']['failed']} failed)"


def heldout(root: Path, table: str) -> tuple[list[str], dict]:
    """The held-out table, one row per release, and each release's cells (patched and A/A twin)."""
    dirs = {v: root / v for v in RELEASES if (root / v).is_dir()}
    with_validate = any(validate_text(d) is not None for d in dirs.values())
    lines = [f"## {table}: held-out set per header revision (geomean (min), faster-noise-slower; where the run "
             "timed stock against itself too, the A/A twin's own counts)", ""]  # fmt: skip
    head = ["release"] + (["validate"] if with_validate else []) + [f"{dt} {m}" for dt, m in CELLS] + ["rounds flagged"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    runs: dict = {}
    for v in RELEASES:
        d = root / v
        if v not in dirs:
            lines.append(f"| {v} | not run |" + " |" * (len(head) - 2))
            continue
        bench = load(d / "bench-heldout.json.gz")
        cl = cells(bench)
        aa = cells(bench, variant="stock-aa") if "stock-aa" in bench["variants"] else {}
        runs[v] = (cl, aa)
        flagged = f"{bench['flagged_rounds']}/{len(bench['rounds'])}" if "flagged_rounds" in bench else "?"
        vtext = (
            [validate_text(d) or "no record"] if with_validate else []
        )  # a run whose record did not come back: never a pass
        lines.append(f"| {v} | " + " | ".join(vtext + [cell(cl[c], aa.get(c)) for c in CELLS]) + f" | {flagged} |")
    return lines, runs


def verdicts(runs: dict) -> list[str]:
    """Over every release: the verdicts where the table's code differs from stock, where every
    "slower" verdict fell, and the A/A twin's own verdicts per cell."""
    rows = [r for cl, _aa in runs.values() for c in CELLS for r in cl[c]]
    if not rows:
        return []
    on = [r for r in rows if r[2]]
    slower = [r for r in rows if r[1] == "slower"]
    lines = ["", f"Over the releases run ({', '.join(runs)}):", ""]
    if on:
        noise = [sum(1 for c in CELLS for r in cl[c] if r[2] and r[1] == "noise") for cl, _aa in runs.values()]
        lines.append(f"* where the code differs from stock: {len(on)} points, {n_verdict(on, 'faster')} faster, "
                     f"{n_verdict(on, 'noise')} within noise ({min(noise)}-{max(noise)} per release), "
                     f"{n_verdict(on, 'slower')} slower; min {min(r[0] for r in on):.3f}")  # fmt: skip
    text = f'* "slower" verdicts: {len(slower)}, {sum(1 for r in slower if r[2])} of them where the code differs'
    if slower:
        low = min(slower)
        text += f"; {low[0]:.3f}-{max(r[0] for r in slower):.3f}, the lowest at {low[3]}"
    lines.append(text)
    aa = [aa[c] for _cl, aa in runs.values() if aa for c in CELLS]
    if aa:
        per = {v: [n_verdict(rs, v) for rs in aa] for v in VERDICTS}
        lo, hi = min(len(rs) for rs in aa), max(len(rs) for rs in aa)
        lines.append(f"* A/A twin (stock against itself), per cell of {lo if lo == hi else f'{lo}-{hi}'} "
                     f"points: faster {min(per['faster'])}-{max(per['faster'])}, slower {min(per['slower'])}-{max(per['slower'])}; "
                     f"lowest {min(r[0] for rs in aa for r in rs):.3f}, highest {max(r[0] for rs in aa for r in rs):.3f}")  # fmt: skip
    return lines


def pooled(runs: dict, table: str) -> list[str]:
    """Per kernel the table turns on, its held-out points over every release."""
    points: dict = {}
    for cl, _aa in runs.values():
        for c in CELLS:
            for s, _verdict, on, key in cl[c]:
                if on:
                    points.setdefault((key, c[1]), []).append(s)
    lines = ["", f"## Per kernel {table} turns on, the releases' held-out points pooled", "",
             "| kernel | mode | n | min | geomean |", "|---|---|---|---|---|"]  # fmt: skip
    for (key, mode), xs in sorted(points.items()):
        lines.append(f"| {key} | {mode} | {len(xs)} | {min(xs):.2f} | {geomean(xs):.2f} |")
    return lines


def upstream(root: Path) -> list[str]:
    """validate --upstream (0.10.2/, or a release's full-upstream/ run), and --full there."""
    lines = []
    for v in RELEASES:
        extra = root / v / "full-upstream"
        full = extra / "validate-full.json.gz"
        if full.is_file():
            val = load(full)
            ident = val["identical"]["patched"]
            lines += ["", f"{v} `validate --full` (every instantiation vLLM builds): {ident['identical']}/{ident['checked']} "
                          f"identical ({val['counts']['failed']} failed)"]  # fmt: skip
        for up_path in (root / v / "upstream.json", extra / "upstream.json"):
            if up_path.is_file():
                lines += ["", f"{v} `validate --upstream`: {upstream_text(load(up_path))}"]
    return lines


def upstream_text(data: dict) -> str:
    up = data["upstream"]
    runs = "; ".join(f"{r['name']} {r['passed']} passed, {r['failed']} failed" for r in up["runs"])
    return f"{runs}; identical {json.dumps(up['identical'])}; notes: {up['notes']}"


def headline(release: str, h: dict, table: str) -> list[str]:
    """The headline rows of one headline run (``release``: the run's name in the headings); the
    points where the table's code differs from stock; the A/A twin's verdicts where the run has
    one; where it has the paper's patch, patched against it point by point."""
    pts = [r for r in h["results"] if r["dispatched"]]
    lines = ["", f"## Headline ({release}, GQA 32/8, head 128, block 16, auto cache, seed 1; dispatched kernel): "
                 "min / median / geomean", "",
             "| variant | fp16 warm | fp16 cold | bf16 warm | bf16 cold |", "|---|---|---|---|---|"]  # fmt: skip
    for name in [n for n in h["variants"] if n != h["baseline"]]:
        row = []
        for dt, mode in CELLS:
            xs = sorted(r["variants"][name]["speedup"] for r in pts if r["mode"] == mode and r["point"]["dtype"] == dt)
            row.append(f"{xs[0]:.2f} / {median(xs):.2f} / {geomean(xs):.2f}")
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    both = {m: geomean([r["variants"]["patched"]["speedup"] for r in pts if r["mode"] == m]) for m in ("warm", "cold")}
    lines += ["", f"{table} on {release}, both dtypes (every dispatched point per mode): "
                  f"geomean warm {both['warm']:.2f}, cold {both['cold']:.2f}"]  # fmt: skip
    cl = cells(h)
    diff = [f"{dt} {mode} {len(on)} pts, {counts(on)}, min {min(r[0] for r in on):.2f}"
            for dt, mode in CELLS if (on := [r for r in cl[(dt, mode)] if r[2]])]  # fmt: skip
    if diff:
        lines += ["", f"Where {table}'s code differs from stock (faster-noise-slower): " + "; ".join(diff)]
    if "stock-aa" in h["variants"]:
        aa = cells(h, variant="stock-aa")
        lines += ["", "A/A twin (faster-noise-slower, min..max): " + "; ".join(
            f"{dt} {mode} {counts(aa[(dt, mode)])}, {min(r[0] for r in aa[(dt, mode)]):.3f}..{max(r[0] for r in aa[(dt, mode)]):.3f}"
            for dt, mode in CELLS)]  # fmt: skip
    if "paper" in h["variants"]:
        lines += ["", f"## {table} against the paper's patch, per headline point (patched speedup / paper speedup)", "",
                  "| dtype | mode | min | geomean | max | points where the paper's interval lies wholly above |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for dt, mode in CELLS:
            rs = [r for r in pts if r["mode"] == mode and r["point"]["dtype"] == dt]
            q = [r["variants"]["patched"]["speedup"] / r["variants"]["paper"]["speedup"] for r in rs]
            ahead = [
                f"B{r['point']['batch']}/{r['point']['context']}"
                for r in rs
                if r["variants"]["paper"]["speedup_lo"] > r["variants"]["patched"]["speedup_hi"]
            ]
            lines.append(f"| {dt} | {mode} | {min(q):.3f} | {geomean(q):.3f} | {max(q):.3f} | {len(ahead)} of {len(rs)}"
                         + (f": {' '.join(ahead)}" if ahead else "") + " |")  # fmt: skip
    return lines


def summary(root: Path, table: str) -> str:
    lines, runs = heldout(root, table)
    lines += verdicts(runs) + upstream(root) + pooled(runs, table)
    for v in RELEASES:  # every release with a headline run (headline-aa/)
        hp = root / v / "headline-aa" / "bench-headline.json.gz"
        if hp.is_file():
            lines += headline(v, load(hp), table)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--table", default="patched", help="the table's name in the headings")
    a = ap.parse_args(argv)
    sys.stdout.write(summary(a.folder, a.table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
