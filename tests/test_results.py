"""The committed summaries are what their raw data say: regenerated from the JSON beside them,
they match byte for byte (so a README number traced to a summary traces to raw data)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("folder, table", [("releases-tune-12", "tune-12"), ("releases-tune-17", "tune-17"), ("releases-tune-23", "tune-23"),
                                           ("releases-tune-24", "tune-24"), ("tune-26", "tune-26")])
def test_release_summary_regenerates_from_its_raw_data(folder: str, table: str) -> None:
    results = ROOT / "benchmarks/results" / folder
    done = subprocess.run([sys.executable, str(ROOT / "scripts/summarize_releases.py"), str(results), "--table", table],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == (results / "summary.md").read_text(encoding="utf-8")


def test_release_summary_says_where_the_code_differs(tmp_path: Path) -> None:
    """The 'code differs' columns come from each bench's recorded configuration marker: with every
    kernel off (the marker of a table that turns nothing on) no point counts as differing."""
    import gzip
    import json
    import shutil

    src = ROOT / "benchmarks/results/releases-tune-17"
    for rel in ("0.6.4",):
        (tmp_path / rel).mkdir()
        for name in ("validate.json.gz", "bench-heldout.json.gz"):
            shutil.copy(src / rel / name, tmp_path / rel / name)
    path = tmp_path / "0.6.4" / "bench-heldout.json.gz"
    bench = json.loads(gzip.decompress(path.read_bytes()))
    bench["variant_info"]["patched"]["marker"] = "lookahead=1 size=auto align=16 caches=kv hint=none placement=start scope=cta issue=call quantized=skip bf16:off fp16:off fp32:off"
    path.write_bytes(gzip.compress(json.dumps(bench).encode()))
    done = subprocess.run([sys.executable, str(ROOT / "scripts/summarize_releases.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("| 0.6.4 |"))
    assert "code differs" not in row
    original = subprocess.run([sys.executable, str(ROOT / "scripts/summarize_releases.py"), str(src)],
                              capture_output=True, text=True, timeout=300, check=False).stdout  # fmt: skip
    assert "code differs: 14 pts" in next(line for line in original.splitlines() if line.startswith("| 0.6.4 |"))


def test_release_summary_counts_the_aa_twin_where_the_run_has_one(tmp_path: Path) -> None:
    """A held-out run with a stock-aa variant gets the A/A twin's own verdict counts in its cells (the
    method's false alarms beside the table's); a run without one gets none."""
    import gzip
    import json
    import shutil

    src = ROOT / "benchmarks/results/releases-tune-24/0.6.4"
    (tmp_path / "0.6.4").mkdir()
    shutil.copy(src / "validate.json.gz", tmp_path / "0.6.4")
    bench = json.loads(gzip.decompress((src / "bench-heldout.json.gz").read_bytes()))
    for r in bench["results"]:
        r["variants"]["stock-aa"]["verdict"] = "slower"
    (tmp_path / "0.6.4" / "bench-heldout.json.gz").write_bytes(gzip.compress(json.dumps(bench).encode()))
    out = subprocess.run([sys.executable, str(ROOT / "scripts/summarize_releases.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=300, check=False).stdout  # fmt: skip
    row = next(line for line in out.splitlines() if line.startswith("| 0.6.4 |"))
    assert row.count("A/A twin 0-0-96,") == 4
    bench["variants"].remove("stock-aa")
    (tmp_path / "0.6.4" / "bench-heldout.json.gz").write_bytes(gzip.compress(json.dumps(bench).encode()))
    out = subprocess.run([sys.executable, str(ROOT / "scripts/summarize_releases.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=300, check=False).stdout  # fmt: skip
    assert "A/A twin" not in next(line for line in out.splitlines() if line.startswith("| 0.6.4 |"))


def test_the_tune_24_view_of_the_tune_23_run_regenerates() -> None:
    """releases-tune-23/tune24_view.md (the README's never-slower claim for the shipped table) is
    what its script computes from the raw JSON and tune-24's committed table."""
    folder = ROOT / "benchmarks/results/releases-tune-23"
    done = subprocess.run([sys.executable, str(folder / "tune24_view.py")], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (folder / "tune24_view.md").read_text(encoding="utf-8")
    rows = done.stdout.splitlines()[2:]
    assert len(rows) == 6 and all(row.count("-0 |") == 4 for row in rows)  # no cell has a slower point

