"""The held-out points of releases-tune-23 seen from tune-24 (tune-23 with fp16/256/16/auto/v2
off): per release and cell, the points whose kernel tune-24 compiles differently from stock, and
their measured speedups (those kernels' SASS is tune-23's, 0.10.2/sass-tune-24-vs-tune-23.txt). The points of
fp16/256/16/auto/v2 are left out: tune-24 runs stock's code there, which this run did not time.

    python benchmarks/results/releases-tune-23/tune24_view.py
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from summarize_releases import CELLS, RELEASES, cells, counts, load  # noqa: E402

from kvpatch.config import make_config  # noqa: E402
from kvpatch.config_io import read_config_file  # noqa: E402

cfg = make_config(**read_config_file(HERE.parent / "tune-24" / "kvpatch.toml")[0])
print("| release | fp16 warm | fp16 cold | bf16 warm | bf16 cold |\n|---|---|---|---|---|")
for v in RELEASES:
    cl = cells(load(HERE / v / "bench-heldout.json.gz"), cfg)
    row = []
    for c in CELLS:
        on = [r for r in cl[c] if r[2]]
        row.append(f"{len(on)} pts, min {min(r[0] for r in on):.2f}, {counts(on)}")
    print(f"| {v} | " + " | ".join(row) + " |")
