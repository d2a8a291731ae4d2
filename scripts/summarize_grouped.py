"""The ``grouped-form`` kind of scripts/summarize_evidence.py: kvpatch's grouped form (``group``)
as generated, checked bit for bit against stock and timed on the held-out set beside the shipped
kernels.

Reads the files its run.toml lists: ``validate*.json.gz`` (``kvpatch validate --json``),
``validate-releases.log`` (the printed summaries of a run whose JSON did not come back),
``upstream*.json`` (vLLM's own test) and ``bench-heldout.json.gz`` (``kvpatch bench --set heldout``
with the shipped table, the same table with ``group`` 2/4/8 and the A/A twin)."""

from __future__ import annotations

import re
from pathlib import Path

from summarize_releases import load, span

from kvpatch.gpu.dispatch import num_partitions
from kvpatch.gpu.stats import geomean


def _big(p: dict) -> bool:
    """Where the grouped form is meant to pay: batch >= 16, context >= 4096."""
    return p["batch"] >= 16 and p["context"] >= 4096


def _group(p: dict) -> int:
    return p["num_heads"] // p["num_kv_heads"]


def grouped_ctas(point: dict, kernel: str, heads: int) -> int:
    """CTAs of the grouped launch (query heads / heads x sequences x partitions); 0 where the
    launcher falls back to vLLM's form (the group is no multiple of ``heads``, or an fp8 cache)."""
    if _group(point) % heads or point["kv_cache_dtype"] != "auto":
        return 0
    parts = 1 if kernel == "v1" else num_partitions(point["context"])
    return point["num_heads"] // heads * point["batch"] * parts


def validation(folder: Path, files: list[str]) -> list[str]:
    lines = ["## Bit for bit: the grouped form against stock", "",
             "| release | check | configurations | identical to stock | served by the grouped form | failed, skipped |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for name in files:
        if name.startswith("validate") and name.endswith(".json.gz"):
            d = load(folder / name)
            release = d["env"]["libs"]["patched"]["vllm"]
            ident, grouped = d["identical"]["patched"], d["grouped"].get("patched", {})
            lines.append(f"| {release} | validate ({d['matrix']}) | {d['counts']['cases']} | {ident['identical']} | "
                         f"{grouped.get('grouped', 'not counted')} | {d['counts']['failed']}, "
                         f"{d['counts']['skipped']} |")  # fmt: skip
        elif name.endswith(".log"):
            text = (folder / name).read_text(encoding="utf-8")
            for release, body in re.findall(r"^(\S+) validate rc \d+ \(\d+ s\)\n(.*)$", text, re.M):
                m = re.search(r"^(\d+) configurations .*?: (\d+) passed, (\d+) failed, (\d+) skipped; patched: "
                              r"(\d+)/\d+ bit-identical \((\d+) by the grouped form\)", body)  # fmt: skip
                cases, _passed, failed, skipped, ident, grouped = m.groups()
                lines.append(f"| {release} | validate (tuned instantiations; printed summary) | {cases} | {ident} | "
                             f"{grouped} | {failed}, {skipped} |")  # fmt: skip
        elif name.startswith("upstream"):
            up = load(folder / name)["upstream"]
            same = up["identical"]["patched"]
            runs = "; ".join(f"{r['name']} {r['passed']} passed, {r['failed']} failed" for r in up["runs"])
            cut = (
                " (CUT at the time limit: the counts are of the tests run)"
                if any(r.get("cut") for r in up["runs"])
                else ""
            )
            lines.append(f"| {up['release'].removeprefix('vllm-')} | vLLM's own {up['test_id'].split('::')[-1]}{cut} | "
                         f"{runs} | {same['identical']}/{same['compared']} outputs | not counted | - |")  # fmt: skip
    return lines


def heldout(folder: Path, name: str) -> list[str]:
    bench = load(folder / name)
    grouped = [v for v in bench["variants"] if re.fullmatch(r"g\d+", v)]
    copy = bench["copy_bandwidth"]["bytes_per_s"] / 1e12
    rows = [r for r in bench["results"] if r["dispatched"]]
    lines = ["", f"## The held-out set: the shipped table, and the same table with group {'/'.join(g[1:] for g in grouped)}",
             "", f"`{name}`: {len(rows)} dispatched points (fp16/bf16 x warm/cold; GQA 32/8, 64/8, 8/1 and MHA 32/32; "
             f"head 64/128/256; block 16/32; auto and fp8 caches), {len(bench['rounds'])} rounds, "
             f"{bench['flagged_rounds']} flagged power-capped or throttled; copy bandwidth {copy:.3f} TB/s (same run). "
             "Each ratio: the variant's speedup over stock divided by the shipped table's (above 1: faster than "
             "what kvpatch ships today).", ""]  # fmt: skip
    lines += ["| variant | dtype | mode | all points | MHA (never grouped) | GQA, batch >= 16, ctx >= 4096 | "
              "GQA, batch 1 | slower than shipped (ranges apart) | A/A twin over stock |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for v in grouped:
        for dt in ("fp16", "bf16"):
            for mode in ("warm", "cold"):
                mine = [r for r in rows if r["point"]["dtype"] == dt and r["mode"] == mode]

                def over(r: dict, v: str = v) -> float:
                    return r["variants"][v]["speedup"] / r["variants"]["patched"]["speedup"]

                mha = [over(r) for r in mine if _group(r["point"]) == 1]
                big = [over(r) for r in mine if _group(r["point"]) > 1 and _big(r["point"])]
                one = [over(r) for r in mine if _group(r["point"]) > 1 and r["point"]["batch"] == 1]
                slower = sum(1 for r in mine if r["variants"][v]["speedup_hi"] < r["variants"]["patched"]["speedup_lo"])
                aa = [r["variants"]["stock-aa"]["speedup"] for r in mine if "stock-aa" in r["variants"]]
                cells = [
                    f"{geomean(xs):.2f} ({span(xs)})" if xs else "-" for xs in ([over(r) for r in mine], mha, big, one)
                ]
                lines.append(f"| {v} | {dt} | {mode} | {' | '.join(cells)} | {slower} of {len(mine)} | "
                             f"{span(aa) if aa else '-'} |")  # fmt: skip
    lines += ["", "By kernel (auto cache, GQA points, warm): each variant over the shipped table, geomean (range); "
              "grouped launches of >= 256 CTAs / fewer:", "",
              "| dtype | head | block | " + " | ".join(f"{v}: >= 256 CTAs | {v}: fewer" for v in grouped) + " |",
              "|---|---|---|" + "---|---|" * len(grouped)]  # fmt: skip
    kernels = sorted({(r["point"]["dtype"], r["point"]["head_size"], r["point"]["block_size"]) for r in rows
                      if r["point"]["kv_cache_dtype"] == "auto" and _group(r["point"]) > 1})  # fmt: skip
    for dt, hs, bs in kernels:
        cells = []
        for v in grouped:
            heads = int(v[1:])
            mine = [r for r in rows if r["mode"] == "warm" and r["point"]["kv_cache_dtype"] == "auto"
                    and (r["point"]["dtype"], r["point"]["head_size"], r["point"]["block_size"]) == (dt, hs, bs)
                    and grouped_ctas(r["point"], r["kernel"], heads)]  # fmt: skip
            for pick in (lambda n: n >= 256, lambda n: n < 256):
                xs = [r["variants"][v]["speedup"] / r["variants"]["patched"]["speedup"] for r in mine
                      if pick(grouped_ctas(r["point"], r["kernel"], heads))]  # fmt: skip
                cells.append(f"{geomean(xs):.2f} ({span(xs)})" if xs else "-")
        lines.append(f"| {dt} | {hs} | {bs} | " + " | ".join(cells) + " |")
    lines += ["", "Unique KV bytes per second over the copy bandwidth, GQA 4 (32/8), batch >= 16, context >= 4096, "
              "auto cache, warm (range over the points):", "",
              "| dtype | head | block | shipped | " + " | ".join(grouped) + " |", "|---|---|---|---|" + "---|" * len(grouped)]  # fmt: skip
    for dt, hs, bs in kernels:
        mine = [r for r in rows if r["mode"] == "warm" and r["point"]["kv_cache_dtype"] == "auto" and _group(r["point"]) == 4
                and _big(r["point"]) and (r["point"]["dtype"], r["point"]["head_size"], r["point"]["block_size"]) == (dt, hs, bs)]  # fmt: skip
        if mine:
            cells = [span([r["variants"][v]["copy_fraction"] for r in mine]) for v in ("patched", *grouped)]
            lines.append(f"| {dt} | {hs} | {bs} | " + " | ".join(cells) + " |")
    return lines


def grouped_form(folder: Path, cfg: dict) -> list[str]:
    files = [f for run in cfg["run"] for f in run.get("files", [])]
    lines = validation(folder, [f for f in files if not f.startswith("bench")])
    for name in files:
        if name.startswith("bench-heldout"):
            lines += heldout(folder, name)
    return lines
