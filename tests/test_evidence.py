"""benchmarks/evidence/: one folder per result the README states. Each folder's summary.md is what
its raw data say (regenerated here byte for byte by scripts/summarize_evidence.py), and each folder
says what it backs (claim.md) and how it was made (run.toml); plus the behaviour of the summary
scripts themselves."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "benchmarks/evidence"
FOLDERS = sorted(p.name for p in EVIDENCE.iterdir() if p.is_dir())
OWN = {"claim.md", "run.toml", "summary.md"}


def script(name: str, *args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *map(str, args)],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


def test_there_is_evidence() -> None:
    assert {
        "bounded-table",
        "bit-identity",
        "heldout-six-releases",
        "headline",
        "decode-step",
        "weight-prefetch",
    } <= set(FOLDERS)


@pytest.mark.slow
@pytest.mark.parametrize("folder", FOLDERS)
def test_summary_regenerates_from_the_raw_data(folder: str) -> None:
    done = script("summarize_evidence.py", EVIDENCE / folder)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (EVIDENCE / folder / "summary.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("folder", FOLDERS)
def test_folder_says_what_it_backs_and_how_it_was_made(folder: str) -> None:
    """claim.md, run.toml (a kind, and per run the kvpatch commit, the commands, the files it
    wrote), summary.md; no runner scripts (commands call scripts/ or kvpatch), and no file the
    summary does not read."""
    here = EVIDENCE / folder
    assert {p.name for p in here.iterdir() if p.is_file()} >= OWN
    assert (here / "claim.md").read_text(encoding="utf-8").startswith("# ")
    run = tomllib.loads((here / "run.toml").read_text(encoding="utf-8"))
    assert run["kind"] and run["title"] and run["machine"]["gpu"]
    assert run["run"]
    listed = set()
    for r in run["run"]:
        assert re.fullmatch(r"[0-9a-f]{40}", r["commit"]), r.get("name")
        assert r["commands"] and all(isinstance(c, str) and c.strip() for c in r["commands"])
        for c in r["commands"]:
            assert all(w.startswith("scripts/") for w in re.findall(r"\S+\.sh\b", c)), c
        listed |= set(r["files"])
    assert not list(here.rglob("*.sh"))
    files = {p.relative_to(here).as_posix() for p in here.rglob("*") if p.is_file()} - OWN
    assert files == listed  # every file is one a run wrote and the summary reads


def release_copy(tmp_path: Path, release: str = "0.6.4") -> Path:
    """A one-release folder as scripts/gpu_releases.sh writes it: validate + held-out bench."""
    (tmp_path / release).mkdir()
    shutil.copy(EVIDENCE / "bit-identity" / release / "validate.json.gz", tmp_path / release)
    shutil.copy(EVIDENCE / "heldout-six-releases" / release / "bench-heldout.json.gz", tmp_path / release)
    return tmp_path / release / "bench-heldout.json.gz"


def row(out: str, release: str = "0.6.4") -> str:
    return next(line for line in out.splitlines() if line.startswith(f"| {release} |"))


def rewrite(path: Path, change) -> None:
    data = json.loads(gzip.decompress(path.read_bytes()))
    change(data)
    path.write_bytes(gzip.compress(json.dumps(data).encode()))


@pytest.mark.slow
def test_release_summary_says_where_the_code_differs(tmp_path: Path) -> None:
    """The 'code differs' columns come from each bench's recorded configuration marker: with every
    kernel off (the marker of a table that turns nothing on) no point counts as differing."""
    bench = release_copy(tmp_path)
    done = script("summarize_releases.py", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "code differs: 54 pts" in row(done.stdout)
    off = "lookahead=1 size=auto align=16 caches=kv hint=none placement=start scope=cta issue=call quantized=skip bf16:off fp16:off fp32:off"
    rewrite(bench, lambda b: b["variant_info"]["patched"].update(marker=off))
    done = script("summarize_releases.py", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "code differs" not in row(done.stdout)


@pytest.mark.slow
def test_release_summary_counts_the_aa_twin_where_the_run_has_one(tmp_path: Path) -> None:
    """A held-out run with a stock-aa variant gets the A/A twin's own verdict counts in its cells (the
    method's false alarms beside the table's); a run without one gets none."""
    bench = release_copy(tmp_path)

    def all_slower(b: dict) -> None:
        for r in b["results"]:
            r["variants"]["stock-aa"]["verdict"] = "slower"

    rewrite(bench, all_slower)
    out = script("summarize_releases.py", tmp_path).stdout
    assert (
        row(out).count(", 0-0-96, min") == 4
        and "A/A twin (stock against itself), per cell of 96 points: faster 0-0, slower 96-96" in out
    )
    rewrite(bench, lambda b: b["variants"].remove("stock-aa"))
    out = script("summarize_releases.py", tmp_path).stdout
    assert "A/A twin" not in row(out) and "A/A twin (stock against itself)" not in out


@pytest.mark.slow
def test_release_summary_has_a_validate_column_only_where_a_record_is(tmp_path: Path) -> None:
    """A release whose validate record did not come back reads 'no record' (never a pass); a folder
    with no validate record at all (held-out benches only) has no such column."""
    release_copy(tmp_path)
    (tmp_path / "0.8.5").mkdir()
    shutil.copy(EVIDENCE / "heldout-six-releases/0.8.5/bench-heldout.json.gz", tmp_path / "0.8.5")
    out = script("summarize_releases.py", tmp_path).stdout
    assert row(out).startswith("| 0.6.4 | 960/960 identical (0 failed) | ") and row(out, "0.8.5").startswith(
        "| 0.8.5 | no record | "
    )
    (tmp_path / "0.6.4" / "validate.json.gz").unlink()
    out = script("summarize_releases.py", tmp_path).stdout
    assert "| release | fp16 warm |" in out and row(out).startswith("| 0.6.4 | 1.09 (min ")


@pytest.mark.slow
def test_the_held_out_verdicts_name_a_slower_point_where_the_code_differs(tmp_path: Path) -> None:
    bench = release_copy(tmp_path)

    def one_slower(b: dict) -> None:
        r = next(r for r in b["results"] if r["dispatched"] and r["point"]["dtype"] == "bf16" and r["point"]["head_size"] == 128
                 and r["point"]["block_size"] == 16 and r["point"]["kv_cache_dtype"] == "auto")  # fmt: skip
        r["variants"]["patched"].update(verdict="slower", speedup=0.5)

    out = script("summarize_releases.py", tmp_path).stdout
    assert "0 slower; min" in out and ", 0 of them where the code differs" in out
    rewrite(bench, one_slower)
    out = script("summarize_releases.py", tmp_path).stdout
    assert "1 slower; min 0.500" in out and ", 1 of them where the code differs; 0.500-" in out


@pytest.mark.slow
def test_bit_identity_names_a_kernel_no_full_run_checked(tmp_path: Path) -> None:
    """The 0.10.2 coverage line: a kernel whose SASS differs from the shipped table's in every
    --full run is named."""
    here = tmp_path / "bit-identity"
    shutil.copytree(EVIDENCE / "bit-identity", here)
    sass = here / "0.10.2/sass-tune-26-vs-tune-24-and-stock.txt"
    theirs = (here / "0.10.2/sass-tune-24-vs-tune-23.txt").read_text(encoding="utf-8").splitlines()[2]
    text = sass.read_text(encoding="utf-8").splitlines()
    text[2] = theirs  # tune-26 now differs where tune-23 does
    sass.write_text("\n".join(text) + "\n", encoding="utf-8")
    done = script("summarize_evidence.py", here)
    assert done.returncode == 0, done.stderr
    assert "* kernels that differ in every one of these runs: fp16/256/16/auto/v2" in done.stdout
    assert (
        "* kernels that differ in every one of these runs: none"
        in script("summarize_evidence.py", EVIDENCE / "bit-identity").stdout
    )


def test_serving_summary_sets_a_bundle_arm_beside_vllm_and_the_enabled_bundle(tmp_path: Path) -> None:
    """A ``plugin bench --bundle`` run: the summary re-derives the report from its engine runs (the
    arm's fingerprint by its kernels; an arm's name may hold digits) and gives that arm's step time
    and both of its ratios, and names the configuration its bundle was built with."""
    import tarfile

    from kvpatch.serving import KVPATCH, VLLM, VLLM_TWIN, Arm, ServingOptions, Workload
    from kvpatch.serving.report import build_report

    fast = Arm("g4", "kvpatch", bundle="/b/g4", bundle_id="0123456789abcdef")
    options = ServingOptions(model="/m/model-llama-3.1-8b-bfloat16", model_label="llama-3.1-8b", dtype="bf16",
                             workloads=(Workload(512, 512, 64),), starts=2, arms=(KVPATCH, fast, VLLM, VLLM_TWIN),
                             extra={"model_shape": "llama-3.1-8b"})  # fmt: skip
    ms = {"kvpatch": (15.0, 15.5), "g4": (12.0, 12.5), "vllm": (18.0, 18.6), "vllm-twin": (18.2, 18.4)}
    records = []
    for rnd in (0, 1):
        for name, arm in zip(ms, options.arms, strict=True):
            row = {"input_len": 512, "output_len": 512, "batch": 64, "decode_ms": ms[name][rnd],
                   "latency_s": ms[name][rnd] / 2, "tokens_per_s": 1000 / ms[name][rnd]}  # fmt: skip
            records.append({"fingerprint": options.fingerprint(), "slot": f"r{rnd:02d}-{name}", "round": rnd,
                            "index": len(records), "arm": {"name": name, "kernels": arm.kernels},
                            "kernels_logged": [arm.kernels], "result": {"engine_start_s": 40.0, "workloads": [row]}})  # fmt: skip
    report = {**build_report(options, records, planned=8), "model_source": {"model_shape": "llama-3.1-8b"}}
    (tmp_path / "serving-bf16.json").write_text(json.dumps(report))
    with tarfile.open(tmp_path / "raw-bf16.tar.xz", "w:xz") as tar:
        for r in records:
            (tmp_path / f"{r['slot']}.json").write_text(json.dumps(r))
            tar.add(tmp_path / f"{r['slot']}.json", arcname=f"./{r['slot']}.json")
    (tmp_path / "g4.kvpatch.toml").write_text("[kvpatch]\ngroup = 4\n")
    (tmp_path / "run.toml").write_text('title = "t"\nkind = "serving"\n[[run]]\nfiles = ["serving-bf16.json", '
                                       '"raw-bf16.tar.xz", "g4.kvpatch.toml"]\n')  # fmt: skip
    done = script("summarize_evidence.py", tmp_path)
    assert done.returncode == 0, done.stderr
    head = next(line for line in done.stdout.splitlines() if line.startswith("| workload |"))
    assert head.endswith("| g4 | g4 speedup | g4 over kvpatch |")
    line = next(line for line in done.stdout.splitlines() if line.startswith("| 512x512 B64 |"))
    # vLLM 18.3 / g4 12.25 and kvpatch 15.25 / g4 12.25; per round 18.0/12.0 .. 18.6/12.5
    assert line.endswith("| 12.25 (12.00-12.50) | 1.494 (1.488-1.500) | 1.245 (1.240-1.250) |")
    assert "The configuration the g4 arm's bundle was built with (g4.kvpatch.toml):" in done.stdout
    assert "    group = 4" in done.stdout


@pytest.mark.parametrize(
    ("run_toml", "needle"),
    [
        (None, "no readable run.toml"),
        ("title = \n", "no readable run.toml"),
        ('kind = "serving"\n', "no 'title'"),
        ('title = "t"\nkind = "nope"\n', "kind 'nope' is none of"),
    ],  # fmt: skip
)
def test_a_folder_that_is_no_evidence_is_a_one_line_error(tmp_path: Path, run_toml: str | None, needle: str) -> None:
    if run_toml is not None:
        (tmp_path / "run.toml").write_text(run_toml)
    done = script("summarize_evidence.py", tmp_path)
    assert done.returncode == 2 and needle in done.stderr.splitlines()[-1] and "Traceback" not in done.stderr


def test_a_point_below_the_twin_where_neither_table_groups_is_said_so() -> None:
    """Below the A/A twin's reach beside another table, a point where neither library groups runs
    vLLM's form in both: the held-out section counts those apart."""
    out = script("summarize_evidence.py", EVIDENCE / "before-grouping-h100").stdout
    assert "patched: 6 points below the A/A twin's lowest ratio" in out
    assert "At 6 of them neither patched nor t24 groups (both run vLLM's form)." in out
