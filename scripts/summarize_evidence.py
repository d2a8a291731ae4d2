"""Print an evidence folder's summary.md (markdown) from the raw data in it.

    python scripts/summarize_evidence.py benchmarks/evidence/FOLDER > benchmarks/evidence/FOLDER/summary.md

The folder's run.toml says which kind of evidence it is (``kind``) and, per run, the files that
run wrote (``files``) and what they are for; each kind below reads exactly those files:

* ``tune-table``: runs ``python -m kvpatch tune --from ...`` (with the run's ``exclude`` and ``incumbent``) on the saved tune JSONs (no GPU),
  checks that it writes the committed table, and prints the pick of every kernel;
* ``bit-identity``: validate and vLLM-test records, and SASS comparisons between libraries;
* ``heldout``: held-out benches, one per header revision (``scripts/summarize_releases.py``);
* ``headline``: headline benches, and a table of the headline kernels' key-loop load-use distance;
* ``decode-step``: ``kvpatch bench-decode`` JSONs;
* ``weight-prefetch``: ``kvpatch bench-decode-sweep``'s JSONs, bench-decode JSONs on held-out
  shapes and models, and a junit file of the GPU tests;
* ``plugin``: ``kvpatch plugin status`` / ``check`` JSONs and the pytest logs of the GPU tests;
* ``serving``: ``kvpatch plugin bench`` JSON reports, one per dtype, each re-derived from its raw engine
  runs; a report short of its planned engine starts is marked INCOMPLETE with its per-arm counts; how
  often the grouped form launched per start where the library counted it; the ``kvpatch.toml`` the
  plugin's bundle was built with, where the run used one; a ``kvpatch bench`` (``bench-*.json[.gz]``)
  of the rows' attention launches as kernels, where the run kept one;
* ``grouped-form``: the grouped form as kvpatch generates it: validate and vLLM-test records, and a
  held-out bench with other variants where one is listed (``scripts/summarize_grouped.py``);
* ``grouped-table``: a rule table that groups: the tune run it was chosen from, validate records,
  the held-out bench beside the shipped table and the decode step (``scripts/summarize_grouped.py``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
import summarize_releases as releases  # noqa: E402
from summarize_grouped import bench_points, grouped_form, grouped_table  # noqa: E402
from summarize_releases import load, span  # noqa: E402

from kvpatch.config import config_from_marker  # noqa: E402
from kvpatch.gpu.stats import geomean  # noqa: E402
from kvpatch.gpu.upstream import count_cases, junit_cases  # noqa: E402


def junit(path: Path) -> dict:
    """junit_cases of a JUnit XML file, kept as is or gzipped (``.xml.gz``)."""
    if path.name.endswith(".gz"):
        with gzip.open(path) as f:
            return junit_cases(f)
    return junit_cases(path)


def run_files(cfg: dict) -> list[tuple[dict, str]]:
    return [(run, f) for run in cfg["run"] for f in run.get("files", [])]


# --------------------------------------------------------------------------- tune-table


def tune_table(folder: Path, cfg: dict) -> list[str]:
    run = next(r for r in cfg["run"] if "from" in r)
    args = [a for f in run["from"] for a in ("--from", f)] + [
        a for e in run.get("exclude", []) for a in ("--exclude", e)
    ]
    if "incumbent" in run:  # the configuration the run was tuned to improve on
        args += ["--incumbent", run["incumbent"]]
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        }
        # -P: the folder (the working directory) is not on sys.path: a kvpatch/ there is not imported
        done = subprocess.run([sys.executable, "-P", "-m", "kvpatch", "tune", *args, "-o", f"{tmp}/kvpatch.toml", "--json", f"{tmp}/tune.json"],
                              cwd=folder, env=env, capture_output=True, text=True, check=False)  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"kvpatch tune --from failed:\n{done.stderr}")
        written = Path(tmp, "kvpatch.toml").read_text(encoding="utf-8")
        data = json.loads(Path(tmp, "tune.json").read_text(encoding="utf-8"))
    same = written == (folder / run["output"]).read_text(encoding="utf-8")
    shown = " ".join(["kvpatch tune"] + [f"'{a}'" if "*" in a else a for a in args] + ["-o", run["output"]])
    lines = [f"`{shown}` writes `{run['output']}` byte for byte: {'yes' if same else 'NO'}", ""]
    source = {}
    # one --from: every kernel was measured there (tune records merged_from only for several)
    merged_from = data["bench"].get("merged_from") or [{"kernels": list(data["picked"])}]
    for path, merged in zip(run["from"], merged_from):
        name = str(Path(path).parent) if Path(path).parent != Path(".") else path
        source.update({k: name for k in merged["kernels"]})
        lines.append(f"* `{path}`: {len(merged['kernels'])} kernels measured last there")
    # each picked kernel's settings as the written configuration resolves them
    written_cfg = config_from_marker(data["marker"])
    picked = {k: written_cfg.resolve(d, int(h), int(b), kv, kern)
              for k, p in data["picked"].items() if p != "off" for d, h, b, kv, kern in [k.split("/")]}  # fmt: skip
    # a pick whose rule is off (a candidate that groups without prefetching there) prefetches nothing
    on = {k: c for k, c in picked.items() if not c.off}
    grouped = sum(1 for c in picked.values() if c.group > 1)
    bounded = sum(1 for c in picked.values() if c.group > 1 and c.group_ctas_per_sm > 0)
    lines += ["", f"Kernels on: {len(on)} of {len(data['picked'])}; with `scope = kv-head-rotate`: "
                  f"{sum(1 for c in on.values() if c.scope == 'kv-head-rotate')}; with `read = warp`: "
                  f"{sum(1 for c in on.values() if c.read == 'warp')}"
                  + (f"; grouped (`group` > 1, prefetching or not): {grouped}" if grouped else "")
                  + (f"; of them under launch bounds (`group-ctas-per-sm`): {bounded}" if bounded else "") + "."]  # fmt: skip
    by_kernel: dict[str, list[str]] = {}
    for cand, kernels in data["exclusions"].items():
        for k in kernels:
            by_kernel.setdefault(k, []).append(cand)
    if by_kernel:
        said = [f"{k} ({'every candidate' if len(cs) == len(data['ranking'][k]) else ', '.join(sorted(cs))})"
                for k, cs in sorted(by_kernel.items())]  # fmt: skip
        lines.append(f"Excluded after tune: {'; '.join(said)} (`{'`, `'.join(run['exclude'])}`).")
    lines += ["", "Per kernel, policy strict: the pick (else off) and, over that kernel's tuning points in the run it was "
                  "measured in, the candidate shown (the pick, or for a kernel off the best candidate tune ranked): "
                  "bit-identical, points slower than stock beyond noise, worst point, geomean [interval over rounds].", "",
              "| kernel | measured in | pick | candidate shown | bit-identical | slower | worst | geomean |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for kernel, pick in sorted(data["picked"].items()):
        best = next((s for s in data["ranking"][kernel] if s["name"] == pick), data["ranking"][kernel][0])
        ident = "yes, excluded" if best["excluded"] else ("yes" if best["bit_identical"] else "no")
        lo, hi = best["geomean_interval"]
        lines.append(f"| {kernel} | {source.get(kernel, '?')} | {pick} | {best['name']} | {ident} | {best['slower']} | "
                     f"{best['worst']:.3f} | {best['geomean']:.3f} [{lo:.3f}..{hi:.3f}] |")  # fmt: skip
    return lines


# --------------------------------------------------------------------------- bit-identity

KERNEL = re.compile(
    r"paged_attention_(v[12])_kernelI(tt|13__nv_bfloat16S1_|ff)Li(\d+)ELi(\d+)ELi\d+EL2ns_18Fp8KVCacheDataTypeE(\d)"
)
DTYPES = {"tt": "fp16", "13__nv_bfloat16S1_": "bf16", "ff": "fp32"}


def kernel_name(mangled: str) -> str:
    """A mangled paged_attention kernel as dtype/head/block/cache/kernel."""
    m = KERNEL.search(mangled)
    if not m:
        return mangled
    kernel, dt, head, block, cache = m.groups()
    return f"{DTYPES[dt]}/{head}/{block}/{'auto' if cache == '0' else 'fp8'}/{kernel}"


def sass_sections(path: Path) -> list[dict]:
    """The comparisons in a SASS comparison file: its counts line and the kernels that differ."""
    out: list[dict] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"(\d+) stock kernels, (\d+) patched; identical (\d+), differ (\d+), missing (\d+)", line)
        if m:
            out.append(
                {"kernels": int(m[2]), "identical": int(m[3]), "differ": int(m[4]), "missing": int(m[5]), "names": []}
            )
        elif line.startswith("differs: "):
            out[-1]["names"].append(kernel_name(line.split(": ", 1)[1]))
    return out


def bit_identity(folder: Path, cfg: dict) -> list[str]:
    lines = ["| release | table | check | result |", "|---|---|---|---|"]
    sass, kernels_on = [], []
    for run, name in run_files(cfg):
        path = folder / name
        check = run.get("check", {}).get(name) if isinstance(run.get("check"), dict) else run.get("check")
        if name.endswith(("validate.json.gz", "validate-full.json.gz")):
            val = load(path)
            ident = val["identical"]["patched"]
            lines.append(f"| {run['release']} | {run['table']} | {check} | {ident['identical']}/{ident['checked']} identical to "
                         f"stock, {val['counts']['failed']} failed, {val['counts']['skipped']} skipped |")  # fmt: skip
        elif name.endswith("upstream.json"):
            up = load(path)["upstream"]
            text = "; ".join(f"{r['name']} {r['passed']} passed, {r['failed']} failed" for r in up["runs"])
            same = up["identical"]["patched"]
            text += f"; {same['identical']}/{same['compared']} patched outputs equal stock's"
            rerun = [f"{r['name']} {len(r['rerun'])}" for r in up["runs"] if r.get("rerun")]
            if rerun:
                text += (
                    f"; run again alone after running out of GPU memory beside the other workers: {', '.join(rerun)}"
                )
            if any(r.get("cut") for r in up["runs"]):
                text += "; CUT at the time limit"
            lines.append(f"| {run['release']} | {run['table']} | {check} | {text} |")
        elif name.endswith("kernels-on.txt"):
            kernels_on += [
                (run, line)
                for line in path.read_text(encoding="utf-8").splitlines()
                if re.match(r"\w+/\d+/\d+/\w+/v[12]: ", line)
            ]
        elif name.endswith(".txt"):
            sass += [(label, s) for label, s in zip(run["labels"][name], sass_sections(path), strict=True)]
    lines += [
        "",
        "SASS (`cuobjdump` of each library, kernel by kernel):",
        "",
        "| comparison | kernels | identical | differ | missing | the kernels that differ |",
        "|---|---|---|---|---|---|",
    ]
    for label, s in sass:
        names = ", ".join(sorted(s["names"])) if len(s["names"]) <= 2 else f"{len(s['names'])} kernels"
        lines.append(f"| {label} | {s['kernels']} | {s['identical']} | {s['differ']} | {s['missing']} | {names} |")
    if kernels_on:
        fields = [
            re.match(r"(\S+): regs (\d+) \[(\d+)\], spills (\d+)/(\d+), FFMA (\d+) \[(\d+)\]", line).groups()
            for _r, line in kernels_on
        ]
        lines += ["", f"The {len(fields)} kernels with a prefetch ({kernels_on[0][0]['table']}): FFMA count equal to stock's in "
                      f"{sum(1 for f in fields if f[5] == f[6])}, spills in {sum(1 for f in fields if f[3] != '0' or f[4] != '0')}; "
                      f"registers {span([int(f[1]) for f in fields], 'd')} (stock's {span([int(f[2]) for f in fields], 'd')})."]  # fmt: skip
    for cover in cfg.get("cover", []):
        lines += ["", cover["claim"]]
        gaps = None
        for part in cover["runs"]:
            val = load(folder / part["validate"])
            s = sass_sections(folder / part["sass"])[part["section"] - 1]
            ident = val["identical"]["patched"]
            gaps = set(s["names"]) if gaps is None else gaps & set(s["names"])
            lines.append(f"* `{part['validate']}`: {ident['identical']}/{ident['checked']} identical; its library's SASS differs "
                         f"from the shipped table's at {s['differ']} of {s['kernels']} kernels ({', '.join(sorted(s['names'])) or 'none'})")  # fmt: skip
        lines.append(f"* kernels that differ in every one of these runs: {', '.join(sorted(gaps or [])) or 'none'}")
    return lines


# --------------------------------------------------------------------------- held-out, headline


def heldout(folder: Path, cfg: dict) -> list[str]:
    lines, runs = releases.heldout(folder, cfg["table"])
    return lines + releases.verdicts(runs) + releases.pooled(runs, cfg["table"])


def headline(folder: Path, cfg: dict) -> list[str]:
    lines: list[str] = []
    for run, name in run_files(cfg):
        if name.endswith(".json.gz"):
            lines += releases.headline(run["label"], load(folder / name), run["table"])
        else:  # a whitespace table: the headline kernels' registers and key-loop load-use distance
            rows = [
                line.split()
                for line in (folder / name).read_text(encoding="utf-8").splitlines()
                if line and not line.startswith("#")
            ]
            lines += ["", f"## The headline kernels' key loops ({run['label']}): median instructions between each key load "
                          "and its first use (load_use)", "",
                      "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]  # fmt: skip
            lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return lines[1:] if lines and lines[0] == "" else lines


# --------------------------------------------------------------------------- decode step


def decode_step(folder: Path, cfg: dict) -> list[str]:
    lines: list[str] = []
    for _run, name in run_files(cfg):
        d = load(folder / name)
        pts = d["points"]
        batches = sorted({p["batch"] for p in pts})
        ctxs = sorted({p["context"] for p in pts})
        model = pts[0]["model"]
        lines += ["" if lines else None,
                  f"## {model}: the whole step, patched over stock ({d['layers']} layers in one CUDA graph, {d['mode']} L2, "
                  f"median of {d['rounds']} rounds; each cell the range over context {'/'.join(map(str, ctxs))})", "",
                  "| dtype | " + " | ".join(f"batch {b}" for b in batches) + " | attention's share of stock's step |",
                  "|---|" + "---|" * (len(batches) + 1)]  # fmt: skip
        for dt in sorted({p["dtype"] for p in pts}):
            mine = [p for p in pts if p["dtype"] == dt]
            row = [
                span([p["variants"]["patched"]["speedup"]["median"] for p in mine if p["batch"] == b]) for b in batches
            ]
            share = [100 * p["variants"]["stock"]["attention_share"] for p in mine]
            lines.append(f"| {dt} | " + " | ".join(row) + f" | {span(share, '.0f')}% |")
        v1 = [
            f"{p['dtype']} B{p['batch']}/{p['context']} {p['variants']['patched']['speedup']['median']:.3f}"
            for p in pts
            if p["kernel"] == "v1"
        ]
        wpf = {
            str(p["variants"]["stock+wpf"]["weight_prefetch"]["label"]) for p in pts if p["variants"].get("stock+wpf")
        }
        lines += ["", f"Geomean over the {len(pts)} points: {geomean([p['variants']['patched']['speedup']['median'] for p in pts]):.3f}. "
                      f"Outputs bit-identical to stock at every point: {'yes' if all(p['all_identical'] for p in pts) else 'NO'}. "
                      f"Points where vLLM dispatches v1: {', '.join(v1) or 'none'}. "
                      f"Weight prefetch in the +wpf variants: {', '.join(sorted(wpf)) or 'none'}."]  # fmt: skip
    return [x for x in lines if x is not None]


# --------------------------------------------------------------------------- weight prefetch


MODEL_NAMES = {"llama-3.1-8b": "Llama-3.1-8B", "llama-3.2-1b": "Llama-3.2-1B", "llama-3.2-3b": "Llama-3.2-3B",
               "qwen2.5-7b": "Qwen2.5-7B"}  # fmt: skip


def title(model: str) -> str:
    """A model's name as its publisher writes it (the id itself where none is known)."""
    return MODEL_NAMES.get(model, model)


def by_model(pts: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for p in pts:
        out.setdefault(p["model"], []).append(p)
    return out


def ratios(pts: list[dict], arm: str, key: str = "speedup") -> tuple[list[float], list[float]]:
    """The per-point medians and round minima of ``arm``'s ``key`` (over stock, or over its own
    library / zero-byte twin), at the points where the arm ran."""
    got = [p["variants"][arm][key] for p in pts if p["variants"].get(arm) and p["variants"][arm].get(key)]
    return [g["median"] for g in got], [g["min"] for g in got]


def shapes(pts: list[dict]) -> str:
    return (f"batch {'/'.join(map(str, sorted({p['batch'] for p in pts})))}, "
            f"context {'/'.join(map(str, sorted({p['context'] for p in pts})))}")  # fmt: skip


def aa_worst(pts: list[dict]) -> float:
    return max(abs(p["aa"]["median"] - 1) for p in pts)


def weight_prefetch(folder: Path, cfg: dict) -> list[str]:
    """``kvpatch bench-decode-sweep``'s JSONs (sweep.json and one bench-decode JSON per stage) and
    bench-decode JSONs on shapes and models the sweep never saw (decode_confirm, decode_heldout)."""
    data = {Path(f).name.split(".")[0]: folder / f for _run, f in run_files(cfg)}
    sweep = load(data["sweep"])
    benches = {n: load(data[n]) for n in data if n.startswith("decode_")}
    runs = [("lead", "sweep, lead stage"), ("confirm", "held-out shapes"), ("heldout", "held-out models")]
    runs = [(benches["decode_" + n], what) for n, what in runs if "decode_" + n in benches]
    d0 = runs[0][0]
    label = d0["points"][0]["variants"]["stock+wpf"]["weight_prefetch"]["label"]
    lib = d0["env"]["prefetch_library"]["config"]
    lines = [f"The default windows `{label}` (MiB per batch bucket, forked on a side stream; the prefetch library `{lib}`), bf16, "
             f"{d0['layers']} layers in one CUDA graph, {d0['mode']} L2, {d0['rounds']} interleaved rounds; each ratio is "
             "the median of the per-round ratios, the round-min its smallest round.", "",
             "## Stock + weight prefetch over stock, per model", "",
             "| run | model | shapes | per point | geomean | worst round-min | over its zero-byte twin | zero-byte arm | "
             "A/A largest deviation | bit-identical |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for d, what in runs:
        for model, pts in by_model(d["points"]).items():
            med, mins = ratios(pts, "stock+wpf")
            twin, _ = ratios(pts, "stock+wpf", "speedup_vs_zero")
            zero, _ = ratios(pts, "stock+zero")
            lines.append(f"| {what} | {title(model)} | {shapes(pts)} | {span(med, '.3f')} | {geomean(med):.3f} | "
                         f"{min(mins):.3f} | {geomean(twin):.3f} | {geomean(zero):.3f} | {100 * aa_worst(pts):.2f}% | "
                         f"{'yes' if all(p['all_identical'] for p in pts) else 'NO'} |")  # fmt: skip
    lead = d0["points"]
    med, mins = ratios(lead, "stock+wpf")
    met = geomean(med) >= 1.02 and min(mins) > 1 and aa_worst(lead) <= 0.003 and all(p["all_identical"] for p in lead)
    lines += ["", f"The goal (+2% geomean over the sweep's {len(lead)} points, {', '.join(title(m) for m in by_model(lead))}, "
                  f"{shapes(lead)}; every round-min above 1.00; the A/A twin within +-0.3%; bit-identical): geomean "
                  f"{geomean(med):.4f}, worst round-min {min(mins):.4f}, A/A within {100 * aa_worst(lead):.2f}%: "
                  f"{'met' if met else 'missed'}."]  # fmt: skip

    lines += [
        "",
        "## The patched attention kernels with and without the weight prefetch",
        "",
        "| run | model | patched over stock | patched + weight prefetch over patched | worst round-min |",
        "|---|---|---|---|---|",
    ]
    for d, what in runs:
        for model, pts in by_model(d["points"]).items():
            pat, _ = ratios(pts, "patched")
            both, bmin = ratios(pts, "patched+wpf", "speedup_vs_library")
            lines.append(f"| {what} | {title(model)} | {span(pat, '.3f')} | {span(both, '.3f')} | {min(bmin):.3f} |")

    steps = benches["decode_steps"]
    arms = [a["name"] for a in steps["arms"] if a["name"] not in ("stock", "stock-aa")]
    models = list(by_model(steps["points"]))
    lines += ["", f"## Each window alone in the step (sweep, steps stage: {shapes(steps['points'])}; geomean over stock, "
                  "per model; the caps and hint each window's kernel-by-kernel best)", "",
              "| arm | settings | " + " | ".join(title(m) for m in models) + " |", "|---|---|" + "---|" * len(models)]  # fmt: skip
    for arm in arms:
        wp = steps["points"][0]["variants"][arm]["weight_prefetch"]
        cells = [f"{geomean(ratios(pts, arm)[0]):.3f}" for pts in by_model(steps["points"]).values()]
        lines.append(f"| {arm} | `{wp['label'] if wp else '-'}` | " + " | ".join(cells) + " |")

    lines += ["", "## Each window kernel by kernel (sweep, kernels stage; us, median of rounds): the next GEMM with and "
                  "without its prefetch, the window's own kernels with and without it; the best cap and hint per row", "",
              "| model | batch | window | GEMM | MiB | hint | GEMM off | GEMM on | gave | window off | window on | cost | net |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for k in load(data["kernels"]):
        best: dict[tuple[int, str], dict] = {}
        for r in k["results"]:
            key = (r["batch"], r["window"])
            if key not in best or r["net_us"] > best[key]["net_us"]:
                best[key] = r
        for (b, w), r in sorted(best.items()):
            lines.append(f"| {title(k['model'])} | {b} | {w} | {r['target']} | {r['prefetched_bytes'] / 2**20:.0f} | "
                         f"{r['hint']} | {r['gemm_off_us']:.1f} | {r['gemm_on_us']:.1f} | {r['gave_us']:+.2f} | {r['window_off_us']:.1f} | "
                         f"{r['window_on_us']:.1f} | {r['cost_us']:+.2f} | {r['net_us']:+.2f} |")  # fmt: skip

    lines += ["", "## The in-kernel form (the attention kernel's tail prefetches o_proj's head) beside its side-stream twin", "",
              "| run | model | tail over tail+zero | tail+zero (empty table) over stock | side stream attn->oproj over stock |",
              "|---|---|---|---|---|"]  # fmt: skip
    named = [(benches["decode_lead"], "sweep, lead stage"), (benches["decode_final"], "sweep, final stage")]
    named += [(d, what) for d, what in runs if what == "held-out models"]
    for d, what in named:
        for model, pts in by_model(d["points"]).items():
            tail, _ = ratios(pts, "tail", "speedup_vs_library")
            if not tail:
                continue
            side, _ = ratios(pts, "stock+attn")
            lines.append(f"| {what} | {title(model)} | {span(tail, '.3f')} | "
                         f"{span(ratios(pts, 'tail+zero')[0], '.3f')} | {span(side, '.3f') if side else '-'} |")  # fmt: skip

    off = benches["decode_guard_off"]["points"]
    on = {(p["model"], p["batch"], p["context"]): p for p in lead}
    carry = [p["carryover"]["stock"]["ratio"] for d, _ in runs for p in d["points"] if p.get("carryover")]
    g = sweep["guard_check"]
    lines += ["", "## The evict_last guard (lines demoted to evict_normal before every launch)", "",
              f"Stock timed right after an evict_last arm over stock timed after the others, every point of the runs above: "
              f"{span(carry, '.4f')} (1: nothing carried over). The guard alone ({g['demoted_bytes'] / 2**20:.0f} MiB demoted) "
              f"before stock, {title(g['model'])} batch {g['batch']}: {g['ratio']['median']:.4f} "
              f"[{g['ratio']['min']:.4f}..{g['ratio']['max']:.4f}] of plain stock.", "",
              "| point | stock + weight prefetch, guard on | guard off |", "|---|---|---|"]  # fmt: skip
    for p in off:
        q = on[(p["model"], p["batch"], p["context"])]
        lines.append(f"| {title(p['model'])} B{p['batch']}/{p['context']} | {q['variants']['stock+wpf']['speedup']['median']:.3f} | "
                     f"{p['variants']['stock+wpf']['speedup']['median']:.3f} |")  # fmt: skip

    lines += [
        "",
        "## In isolation: a GEMM right after a kernel that leaves HBM idle (clean L2 flush before; median of trials)",
        "",
        "| hint | gemm | m | prefetched MiB | cold us | prefetched us | warm us | speedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for hint, mg in sweep["micro"].items():
        for r in mg["results"]:
            lines.append(f"| {hint} | {r['gemm']} | {r['m']} | {r['prefetched_bytes'] / 2**20:.0f} | {r['cold_us']:.1f} | "
                         f"{r['prefetched_us']:.1f} | {r['warm_us']:.1f} | {r['speedup']:.2f}x |")  # fmt: skip

    fin = benches["decode_final"]["points"]
    med, mins = ratios(fin, "stock+wpf")
    twin, _ = ratios(fin, "stock+wpf", "speedup_vs_zero")
    lines += ["", f"## The sweep's pick: `{sweep['picked']['config']['label']}`", "",
              f"On the sweep's {len(fin)} points (final stage): {span(med, '.3f')} per point, geomean {geomean(med):.4f}, worst "
              f"round-min {min(mins):.4f}, over its zero-byte twin {geomean(twin):.4f}; bit-identical: "
              f"{'yes' if all(p['all_identical'] for p in fin) else 'NO'}."]  # fmt: skip

    if "gpu_tests" in data:
        cases = junit_cases(data["gpu_tests"])
        lines += ["", f"## The GPU tests of the decode step and the prefetch runtime (`-m gpu`): "
                      f"{count_cases(cases)['passed']} of {len(cases)} passed", ""]  # fmt: skip
        lines += [f"- {c['outcome']}: `{n}`" for n, c in cases.items()]
    return lines


# --------------------------------------------------------------------------- plugin


_OUTCOME = re.compile(r"^(?:(PASSED|FAILED|ERROR) (\S+)|(\S+::\S+) (PASSED|FAILED|ERROR))")


def pytest_outcomes(text: str) -> list[tuple[str, str]]:
    """(test id, outcome) from a pytest log ('-rA' summary lines and '-v' lines); a test whose
    '-v' line has no outcome (the run was cut off there) is 'cut off'."""
    seen: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        m = _OUTCOME.match(line)
        if m:
            name, outcome = (m.group(2), m.group(1)) if m.group(1) else (m.group(3), m.group(4))
            seen[name] = outcome
        elif line.startswith("tests/") and "::" in line and len(line.split()) == 1:
            seen.setdefault(line, "cut off")
    return list(seen.items())


def plugin(folder: Path, cfg: dict) -> list[str]:
    lines = []
    for run in cfg["run"]:
        lines += [f"## {run['name']}", ""]
        for f in run.get("files", []):
            path = folder / f
            if f.endswith("status.json"):
                d = json.loads(path.read_text(encoding="utf-8"))
                lines += [f"`kvpatch plugin status --gpus` ({f}): {d['action']}; vLLM {d['vllm_version']}, torch "
                          f"{d['torch_version']}; {'; '.join(d['gpus'])}", ""]  # fmt: skip
            elif f.endswith(("check.json", "check.json.gz")):
                d = load(path)
                res = d["results"]
                cells: dict[tuple[str, str], list[bool]] = {}
                for r in res:
                    cells.setdefault((r["path"], r["mode"]), []).append(r["equal"] and not r["error"])
                ok = sum(1 for r in res if r["equal"] and not r["error"])
                cases = len({json.dumps(r["case"], sort_keys=True) for r in res})
                long = [r for r in res if r["case"].get("long")]
                sized = (f"; {sum(1 for r in long if r['equal'] and not r['error'])}/{len(long)} of them of v1 launches "
                         "sized for 8192 tokens, their graphs captured before any eager call") if long else ""  # fmt: skip
                lines += [f"`kvpatch plugin check` ({f}): {ok}/{len(res)} outputs bit-identical to vLLM's op, {cases} cases{sized}", "",
                          "| path | mode | bit-identical |", "|---|---|---|"]  # fmt: skip
                lines += [f"| {p} | {m} | {sum(v)}/{len(v)} |" for (p, m), v in sorted(cells.items())]
                lines += ["", "Kernel times in the same check (CUDA-graph replays, median; the check's own timing, not a "
                          "benchmark: no A/A twin, no spread):", "", "| shape | vLLM us | kvpatch us | ratio |", "|---|---|---|---|"]  # fmt: skip
                lines += [f"| {t['shape']} | {t['stock_us']:.1f} | {t['kvpatch_us']:.1f} | {t['speedup']:.3f}x |"
                          for t in d["timings"]]  # fmt: skip
                lines.append("")
            elif f.endswith((".xml", ".xml.gz")):
                cases = junit(path)
                n = count_cases(cases)
                lines += [f"junit ({f}): {n['passed']} of {len(cases)} cases passed, {n['failed'] + n['errors']} failed, "
                          f"{n['skipped']} skipped", ""]  # fmt: skip
            elif f.endswith(".txt") and Path(f).name not in ("status.txt", "check.txt", "log.txt"):
                outcomes = pytest_outcomes(path.read_text(encoding="utf-8"))
                if outcomes:
                    lines += [f"pytest ({f}):", ""] + [f"- {o}: `{n}`" for n, o in outcomes] + [""]
    return lines


def _cell(d: dict, fmt: str = ".2f") -> str:
    return f"{format(d['median'], fmt)} ({span([d['min'], d['max']], fmt)})" if d.get("n") else "-"


def _ratio(d: dict) -> str:
    return f"{d['median']:.3f} ({span([d['lo'], d['hi']], '.3f')})" if d.get("n") else "-"


def _starts(n: int) -> str:
    return f"{n} start" if n == 1 else f"{n} starts"


def _rounds(n: int) -> str:
    return f"{n} round" if n == 1 else f"{n} rounds"


def _grouped(arm: dict) -> str:
    """How often the grouped form launched in an arm's engine starts (the library's own counter)."""
    counts = [n for n in arm.get("grouped_launches", []) if n is not None]
    return f", the grouped form launched {span(counts, '.0f')} times a start" if counts else ""


def _engine_runs(path: Path) -> tuple[list[dict], set[str]]:
    """The counted engine starts in a ``kvpatch plugin bench --raw`` folder, packed as tar.xz, and
    the model paths their spec files name (runs of a kvpatch that hashed that path)."""
    import tarfile

    runs, models = [], set()
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            name = Path(m.name).name
            if m.isfile() and re.fullmatch(r"r\d\d-[a-z0-9-]+\.json", name):
                runs.append(json.loads(tar.extractfile(m).read()))
            elif m.isfile() and re.fullmatch(r"r\d\d-[a-z0-9-]+\.spec\.json", name):
                models.add(json.loads(tar.extractfile(m).read())["model"])
    return sorted(runs, key=lambda r: r["index"]), models


def _options_of(report: dict):
    """The ServingOptions a report was made with (its fingerprint must be its runs')."""
    from kvpatch.serving import Arm, ServingOptions, Workload

    e = report["engine"]
    arms = tuple(Arm(name, a["kernels"], a.get("bundle"), a.get("bundle_id", "")) for name, a in report["arms"].items())
    return ServingOptions(model=e["model"], model_label=report["model"], dtype=report["dtype"],
                          workloads=tuple(Workload(w["input_len"], w["output_len"], w["batch"]) for w in report["workloads"]),
                          starts=report["starts_per_arm"], dummy_weights=e["dummy_weights"], seed=e["seed"],
                          gpu_memory_utilization=e["gpu_memory_utilization"], warmup_tokens=e["warmup_tokens"],
                          extra=report.get("model_source", {}), arms=arms, context=e["max_model_len"])  # fmt: skip


def serving(folder: Path, cfg: dict) -> list[str]:
    """``kvpatch plugin bench``: the report, re-derived from the raw engine runs beside it (and
    refused where they disagree), every engine start, vLLM's kernel tests on the rebuilt ops."""
    from kvpatch.serving.bench import fingerprints
    from kvpatch.serving.report import build_report

    files = [f for _, f in run_files(cfg)]
    lines = []
    for f in files:
        if not (f.startswith("serving-") and f.endswith(".json")):
            continue
        d = json.loads((folder / f).read_text(encoding="utf-8"))
        raw = f.replace("serving-", "raw-").replace(".json", ".tar.xz")
        runs, models = _engine_runs(folder / raw)
        options = _options_of(d)
        ours = fingerprints(options, models)  # the runs saved_runs would count
        again = build_report(options, [r for r in runs if r["fingerprint"] in ours], planned=d["planned"])
        if again["workloads"] != d["workloads"] or again["engine_starts"] != d["engine_starts"]:
            raise SystemExit(f"{f} does not follow from the engine runs in {raw}")
        env, arms = d["environment"], d["arms"]
        others = [name for name, arm in arms.items() if arm.get("bundle")]  # --bundle's arms
        logged = "; ".join(f"{a}: {'/'.join(v['kernels_logged'])} in {_starts(v['starts'])}{_grouped(v)}"
                           for a, v in arms.items())  # fmt: skip
        ups = [r["result"]["engine_start_s"] for r in runs]
        by_round: dict[int, set[str]] = {}
        for r in runs:
            by_round.setdefault(r["round"], set()).add(r["arm"]["name"])
        full = sum(1 for names in by_round.values() if names >= set(arms))
        if d["complete"]:
            heading, done = "", (f"{d['engine_starts']} of {d['planned']} planned engine starts ran ({full} rounds of "
                                 f"{len(arms)} arms, the order rotated each round)")  # fmt: skip
        else:
            per_arm = ", ".join(f"{a} {v['starts']}" for a, v in arms.items())
            n_sp, n_aa = (min(w[k]["decode_ms"].get("n", 0) for w in d["workloads"]) for k in ("speedup", "aa"))
            heading = f": INCOMPLETE, {d['engine_starts']} of {d['planned']} engine starts"
            done = (f"INCOMPLETE: {d['engine_starts']} of {d['planned']} planned engine starts ran (per arm: {per_arm}; "
                    f"{full} of {d['starts_per_arm']} rounds of {len(arms)} arms complete, the order rotated each "
                    f"round): the speedup below rests on {_rounds(n_sp)}, the A/A pair on {_rounds(n_aa)}")  # fmt: skip
        lines += [f"## {d['model']}, {d['dtype']} ({f}, re-derived from {raw}){heading}", "",
                  f"vLLM {env.get('vllm')} V0 engine (XFORMERS backend), CUDA graphs, dummy weights; {env.get('gpu')}, "
                  f"torch {env.get('torch')}. {done}; engine up in "
                  f"{span(ups, '.0f')} s. What the plugin's log line said each arm ran: {logged}.", "",
                  "Decode step, ms: median over engine starts (min-max); speedup = vLLM's kernels / kvpatch's, median "
                  "of the arms (range of the per-round ratios); A/A = vLLM's kernels / vLLM's kernels in another "
                  "engine start." + (" An arm of another plugin bundle: its decode step, vLLM's kernels / its, and "
                  "kvpatch's enabled bundle / its." if others else ""), "",
                  "| workload | vLLM | kvpatch | vLLM again | speedup | A/A | latency speedup | tokens/s speedup |"
                  + "".join(f" {o} | {o} speedup | {o} over kvpatch |" for o in others),
                  "|---|---|---|---|---|---|---|---|" + "---|---|---|" * len(others)]  # fmt: skip
        for w in d["workloads"]:
            a, sp, aa = w["arms"], w["speedup"], w["aa"]
            theirs = "".join(f" {_cell(a[o]['decode_ms'])} | {_ratio(w['others'][o]['speedup']['decode_ms'])} | "
                             f"{_ratio(w['others'][o]['over_kvpatch']['decode_ms'])} |" for o in others)  # fmt: skip
            lines.append(f"| {w['workload']} | {_cell(a['vllm']['decode_ms'])} | {_cell(a['kvpatch']['decode_ms'])} | "
                         f"{_cell(a['vllm-twin']['decode_ms'])} | {_ratio(sp['decode_ms'])} | {_ratio(aa['decode_ms'])} | "
                         f"{_ratio(sp['latency_s'])} | {_ratio(sp['tokens_per_s'])} |{theirs}")  # fmt: skip
        worst = max(abs(1 - x) for w in d["workloads"] for k in ("lo", "hi") if (x := w["aa"]["decode_ms"].get(k)))
        lines += ["", f"A/A pair, decode step: every per-round ratio within {100 * worst:.1f}% of 1.00.", "",
                  "Every engine start, in the order it ran (decode step, ms):", "",
                  "| start | arm | plugin logged | engine up, s | " + " | ".join(w["workload"] for w in d["workloads"]) + " |",
                  "|---|---|---|---|" + "---|" * len(d["workloads"])]  # fmt: skip
        for r in runs:
            ms = " | ".join(f"{w['decode_ms']:.2f}" for w in r["result"]["workloads"])
            lines.append(f"| {r['slot']} | {r['arm']['name']} | {'/'.join(r['kernels_logged'])} | "
                         f"{r['result']['engine_start_s']:.0f} | {ms} |")  # fmt: skip
        lines.append("")
    for f in files:
        if f.startswith("bench-"):  # a kvpatch bench of the rows' attention launches, as kernels
            lines += bench_points(folder, f)[1:] + [""]
        elif f.endswith((".xml", ".xml.gz")):
            n = count_cases(junit(folder / f))
            lines += [f"vLLM's own kernel tests on the rebuilt ops ({f}): {n['passed']} passed, "
                      f"{n['failed'] + n['errors']} failed, {n['skipped']} skipped.", ""]  # fmt: skip
        elif f.endswith(("status.txt", "kvpatch.toml")):
            arm = Path(f).name.removesuffix("kvpatch.toml").rstrip(".-") or "kvpatch"  # NAME.kvpatch.toml: arm NAME's
            head = ("`kvpatch plugin status --gpus` on the machine" if f.endswith("status.txt")
                    else f"The configuration the {arm} arm's bundle was built with")  # fmt: skip
            text = (folder / f).read_text(encoding="utf-8").strip().splitlines()
            lines += [f"{head} ({f}):", "", *(f"    {t}" for t in text), ""]
    return lines


KINDS = {"tune-table": tune_table, "bit-identity": bit_identity, "heldout": heldout, "headline": headline,
         "decode-step": decode_step, "weight-prefetch": weight_prefetch, "plugin": plugin, "serving": serving,
         "grouped-form": grouped_form,
         "grouped-table": lambda folder, cfg: grouped_table(folder, cfg, tune_table)}  # fmt: skip


def summary(folder: Path) -> str:
    cfg = tomllib.loads((folder / "run.toml").read_text(encoding="utf-8"))
    return "\n".join([f"# {cfg['title']}", "", *KINDS[cfg["kind"]](folder, cfg)]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="an evidence folder (with run.toml)")
    folder = ap.parse_args(argv).folder
    try:
        cfg = tomllib.loads((folder / "run.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        ap.error(f"{folder}: no readable run.toml ({e})")
    for key in ("title", "kind"):
        if not isinstance(cfg.get(key), str):
            ap.error(f"{folder}/run.toml: no '{key}'")
    if cfg["kind"] not in KINDS:
        ap.error(f"{folder}/run.toml: kind {cfg['kind']!r} is none of {', '.join(KINDS)}")
    sys.stdout.write(summary(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
