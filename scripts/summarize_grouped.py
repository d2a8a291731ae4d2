"""The ``grouped-form`` and ``grouped-table`` kinds of scripts/summarize_evidence.py: kvpatch's
grouped form (``group``) as generated, checked bit for bit against stock and timed on the held-out
set beside the shipped kernels; and a rule table that groups, as tune chose it.

Reads the files its run.toml lists: ``validate*.json.gz`` (``kvpatch validate --json``),
``validate-releases.log`` (the printed summaries of a run whose JSON did not come back),
``upstream*.json`` (vLLM's own test), ``bench-heldout.json.gz`` (``kvpatch bench --set heldout``
with the shipped table, other variants and the A/A twin), ``bench-decode.json.gz`` (``kvpatch
bench-decode`` with several arms) and, for ``grouped-table``, the tune run the table was chosen
from (the ``tune-table`` kind's section)."""

from __future__ import annotations

import re
from pathlib import Path

from summarize_releases import load, span

from kvpatch.config.marker import config_from_marker
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
    head = ["## Bit for bit: the grouped form against stock", "",
            "| release | check | configurations | identical to stock | served by the grouped form | failed, skipped |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    lines: list[str] = []
    for name in files:
        if name.startswith("validate") and name.endswith(".json.gz"):
            d = load(folder / name)
            release = next(lib["vllm"] for lib in d["env"]["libs"].values() if lib.get("vllm"))
            for v, ident in d["identical"].items():  # each library validated against stock
                grouped = d["grouped"].get(v, {})
                which = "" if len(d["identical"]) == 1 else f", {v}"
                lines.append(f"| {release} | validate ({d['matrix']}{which}): `{name}` | {d['counts']['cases']} | "
                             f"{ident['identical']} | {grouped.get('grouped', 'not counted')} | {d['counts']['failed']}, "
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
    return head + lines if lines else []  # no records: no table


def beyond_twin(rows: list[dict], v: str, base: str) -> list[tuple[dict, float]]:
    """The rows where variant ``v``'s speedup over ``base``'s falls below the A/A twin's lowest
    speedup over stock in the row's dtype and mode (slower than ``base`` beyond the noise), each with
    that ratio; fp16 before bf16, warm before cold, then in the rows' order."""
    low: dict[tuple[str, str], float] = {}
    for r in rows:
        if "stock-aa" in r["variants"]:
            key = (r["point"]["dtype"], r["mode"])
            low[key] = min(low.get(key, float("inf")), r["variants"]["stock-aa"]["speedup"])
    out = [(r, r["variants"][v]["speedup"] / r["variants"][base]["speedup"]) for r in rows]
    out = [(r, x) for r, x in out if x < low.get((r["point"]["dtype"], r["mode"]), float("-inf"))]
    order = {"fp16": 0, "bf16": 1, "warm": 0, "cold": 1}
    return sorted(out, key=lambda rx: (order.get(rx[0]["point"]["dtype"], 2), order.get(rx[0]["mode"], 2)))


def _ctx(point: dict) -> str:
    """A point's context, with the length its launches were sized for where longer: ``'1024@8192'``."""
    capture = point.get("capture", 0)
    return f"{point['context']}@{capture}" if capture > point["context"] else str(point["context"])


def _described(rows: list[dict]) -> str:
    """What a run's points cover, read from the points: dtypes x modes; head layouts; head and
    block sizes; caches; batches; contexts."""
    pts = [r["point"] for r in rows]

    def each(key: str) -> str:
        return "/".join(str(v) for v in sorted({p[key] for p in pts}))

    layouts = sorted({(p["num_heads"], p["num_kv_heads"]) for p in pts}, key=lambda hk: (hk[0] == hk[1], hk))
    heads = ", ".join(f"{'MHA' if h == k else 'GQA'} {h}/{k}" for h, k in layouts)
    modes = "/".join(sorted({r["mode"] for r in rows}, reverse=True))
    return (f"{each('dtype')} x {modes}; {heads}; head {each('head_size')}; block {each('block_size')}; "
            f"{each('kv_cache_dtype')} cache; batch {each('batch')}; context {each('context')}")  # fmt: skip


def heldout(folder: Path, name: str, base: str = "patched") -> list[str]:
    """The held-out set: each variant other than stock, ``base`` (the table the run compares with:
    the one kvpatch shipped then) and the A/A twin, over ``base``."""
    bench = load(folder / name)
    variants = [v for v in bench["variants"] if v not in ("stock", base, "stock-aa")]
    copy = bench["copy_bandwidth"]["bytes_per_s"] / 1e12
    rows = [r for r in bench["results"] if r["dispatched"]]
    lines = ["", f"## The held-out set (`{name}`): {', '.join(variants)} over {base}",
             "", f"`{name}`: {len(rows)} dispatched points ({_described(rows)}), {len(bench['rounds'])} rounds, "
             f"{bench['flagged_rounds']} flagged power-capped or throttled; copy bandwidth {copy:.3f} TB/s (same run). "
             f"Each ratio: the variant's speedup over stock divided by {base}'s (above 1: faster than {base}).", ""]  # fmt: skip
    lines += ["| variant | dtype | mode | all points | MHA (never grouped) | GQA, batch >= 16, ctx >= 4096 | "
              f"GQA, batch 1 | slower than {base} (ranges apart) | A/A twin over stock |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for v in variants:
        for dt in ("fp16", "bf16"):
            for mode in ("warm", "cold"):
                mine = [r for r in rows if r["point"]["dtype"] == dt and r["mode"] == mode]

                def over(r: dict, v: str = v) -> float:
                    return r["variants"][v]["speedup"] / r["variants"][base]["speedup"]

                mha = [over(r) for r in mine if _group(r["point"]) == 1]
                big = [over(r) for r in mine if _group(r["point"]) > 1 and _big(r["point"])]
                one = [over(r) for r in mine if _group(r["point"]) > 1 and r["point"]["batch"] == 1]
                slower = sum(1 for r in mine if r["variants"][v]["speedup_hi"] < r["variants"][base]["speedup_lo"])
                aa = [r["variants"]["stock-aa"]["speedup"] for r in mine if "stock-aa" in r["variants"]]
                cells = [
                    f"{geomean(xs):.2f} ({span(xs)})" if xs else "-" for xs in ([over(r) for r in mine], mha, big, one)
                ]
                lines.append(f"| {v} | {dt} | {mode} | {' | '.join(cells)} | {slower} of {len(mine)} | "
                             f"{span(aa) if aa else '-'} |")  # fmt: skip
    for v in variants:
        mine = beyond_twin([r for r in rows if r["point"]["dtype"] in ("fp16", "bf16")], v, base)
        listed = "; ".join(
            f"{r['point']['dtype']} {r['mode']} {r['kernel']} {r['point']['num_heads']}/{r['point']['num_kv_heads']} "
            f"h{r['point']['head_size']} b{r['point']['block_size']} {r['point']['kv_cache_dtype']} "
            f"B{r['point']['batch']}/{_ctx(r['point'])}: {x:.3f}"
            for r, x in mine
        )
        # where neither library groups, both run vLLM's form of the kernel: the same code wherever
        # their vLLM-form SASS is the same (a folder's sass file says whether it is)
        neither = sum(
            1 for r, _ in mine if not r["variants"][v].get("grouped") and not r["variants"][base].get("grouped")
        )
        lines += ["", f"{v}: {len(mine)} points below the A/A twin's lowest ratio over stock in their dtype and mode "
                  f"(slower than {base} beyond the noise){': ' + listed if 0 < len(mine) <= 16 else ''}."
                  + (f" At {neither} of them neither {v} nor {base} groups (both run vLLM's form)." if neither else "")]  # fmt: skip
    lines += ["", f"By kernel (auto cache, GQA points, warm): each variant over {base}, geomean (range); "
              "grouped launches of >= 256 CTAs / fewer:", "",
              "| dtype | head | block | " + " | ".join(f"{v}: >= 256 CTAs | {v}: fewer" for v in variants) + " |",
              "|---|---|---|" + "---|---|" * len(variants)]  # fmt: skip
    kernels = sorted({(r["point"]["dtype"], r["point"]["head_size"], r["point"]["block_size"]) for r in rows
                      if r["point"]["kv_cache_dtype"] == "auto" and _group(r["point"]) > 1})  # fmt: skip
    # how each variant groups a kernel: its configuration, read back from its marker
    cfgs = {v: config_from_marker(bench["variant_info"][v]["marker"]) for v in variants}
    for dt, hs, bs in kernels:
        cells = []
        for v in variants:
            heads = {k: cfgs[v].resolve(dt, hs, bs, "auto", k).group for k in ("v1", "v2")}
            mine = [r for r in rows if r["mode"] == "warm" and r["point"]["kv_cache_dtype"] == "auto"
                    and (r["point"]["dtype"], r["point"]["head_size"], r["point"]["block_size"]) == (dt, hs, bs)
                    and heads[r["kernel"]] > 1 and grouped_ctas(r["point"], r["kernel"], heads[r["kernel"]])]  # fmt: skip
            for pick in (lambda n: n >= 256, lambda n: n < 256):
                xs = [r["variants"][v]["speedup"] / r["variants"][base]["speedup"] for r in mine
                      if pick(grouped_ctas(r["point"], r["kernel"], heads[r["kernel"]]))]  # fmt: skip
                cells.append(f"{geomean(xs):.2f} ({span(xs)})" if xs else "-")
        lines.append(f"| {dt} | {hs} | {bs} | " + " | ".join(cells) + " |")
    lines += ["", "Unique KV bytes per second over the copy bandwidth, GQA 4 (32/8), batch >= 16, context >= 4096, "
              "auto cache, warm (range over the points):", "",
              f"| dtype | head | block | {base} | " + " | ".join(variants) + " |", "|---|---|---|---|" + "---|" * len(variants)]  # fmt: skip
    for dt, hs, bs in kernels:
        mine = [r for r in rows if r["mode"] == "warm" and r["point"]["kv_cache_dtype"] == "auto" and _group(r["point"]) == 4
                and _big(r["point"]) and (r["point"]["dtype"], r["point"]["head_size"], r["point"]["block_size"]) == (dt, hs, bs)]  # fmt: skip
        if mine:
            cells = [span([r["variants"][v]["copy_fraction"] for r in mine]) for v in (base, *variants)]
            lines.append(f"| {dt} | {hs} | {bs} | " + " | ".join(cells) + " |")
    return lines


def decode_arms(folder: Path, name: str, base: str = "patched") -> list[str]:
    """``kvpatch bench-decode`` with more than one patched arm: per model and dtype, each arm's
    whole-step speedup over stock and over ``base`` (the table kvpatch shipped then), range over
    contexts."""
    d = load(folder / name)
    pts = d["points"]
    arms = [a for a in d["variants"] if a not in ("stock", "stock-aa")]
    batches = sorted({p["batch"] for p in pts})
    ctxs = "/".join(map(str, sorted({p["context"] for p in pts})))

    def med(p: dict, arm: str) -> float:
        return p["variants"][arm]["speedup"]["median"]

    lines = ["", f"## The decode step (`{name}`): {d['layers']} layers in one CUDA graph, {d['mode']} L2, median of "
             f"{d['rounds']} rounds; each cell the range over context {ctxs}", "",
             "| model | dtype | arm | " + " | ".join(f"batch {b}" for b in batches) + " | geomean |",
             "|---|---|---|" + "---|" * (len(batches) + 1)]  # fmt: skip
    for model in sorted({p["model"] for p in pts}):
        for dt in sorted({p["dtype"] for p in pts}):
            mine = [p for p in pts if p["model"] == model and p["dtype"] == dt]
            rows = [(a, f"{a} over stock", lambda p, a=a: med(p, a)) for a in arms]
            rows += [(a, f"{a} over {base}", lambda p, a=a: med(p, a) / med(p, base)) for a in arms if a != base]
            for _, label, f in rows:
                cells = [span([f(p) for p in mine if p["batch"] == b]) for b in batches]
                lines.append(
                    f"| {model} | {dt} | {label} | " + " | ".join(cells) + f" | {geomean([f(p) for p in mine]):.3f} |"
                )
    aa = [med(p, "stock-aa") for p in pts if "stock-aa" in p["variants"]]
    lines += ["", f"A/A twin over stock: {span(aa)}. Outputs bit-identical to stock at every point: "
              f"{'yes' if all(p['all_identical'] for p in pts) else 'NO'}. v1 points (vLLM's dispatch): "
              + ", ".join(f"{p['model']} {p['dtype']} B{p['batch']}/{p['context']}" for p in pts if p["kernel"] == "v1") + "."]  # fmt: skip
    return lines


def bench_points(folder: Path, name: str, base: str = "patched") -> list[str]:
    """A ``kvpatch bench`` of chosen shapes (not a named set): every point, each variant's speedup
    over stock (range over rounds) and its unique KV bytes over the copy bandwidth; then, per
    variant, the points where it is slower than ``base`` beyond the A/A twin's reach."""
    bench = load(folder / name)
    variants = [v for v in bench["variants"] if v != "stock"]
    copy = bench["copy_bandwidth"]["bytes_per_s"] / 1e12
    lines = ["", f"## Chosen shapes (`{name}`): {', '.join(variants)} over stock", "",
             f"{len(bench['results'])} points x {bench['settings']['rounds']} rounds ({', '.join(bench['settings']['modes'])}), "
             f"{bench['flagged_rounds']} of {len(bench['rounds'])} round-pools flagged power-capped or throttled; copy bandwidth {copy:.3f} TB/s (same run). "
             "Each cell: speedup over stock (min-max over rounds) / KV bytes over copy bandwidth; * = the kernel vLLM "
             "dispatches there.", "",
             "| point | kernel | stock, us | " + " | ".join(variants) + " |", "|---|---|---|" + "---|" * len(variants)]  # fmt: skip
    for r in bench["results"]:
        p, vs = r["point"], r["variants"]
        cells = [f"{vs[v]['speedup']:.2f} ({vs[v]['speedup_lo']:.2f}-{vs[v]['speedup_hi']:.2f}) / {vs[v]['copy_fraction']:.2f}"
                 for v in variants]  # fmt: skip
        lines.append(f"| {p['dtype']} {p['num_heads']}/{p['num_kv_heads']} h{p['head_size']} b{p['block_size']} "
                     f"{p['kv_cache_dtype']} B{p['batch']}/{_ctx(p)} {r['mode']} | {r['kernel']}{'*' if r['dispatched'] else ''} | "
                     f"{vs['stock']['median_us']:.1f} | " + " | ".join(cells) + " |")  # fmt: skip
    aa = [r["variants"]["stock-aa"]["speedup"] for r in bench["results"] if "stock-aa" in r["variants"]]
    if aa and base in variants:
        lines += ["", f"A/A twin over stock: {span(aa)}."]
        for v in variants:
            if v in (base, "stock-aa"):
                continue
            over = [r["variants"][v]["speedup"] / r["variants"][base]["speedup"] for r in bench["results"]]
            below = [f"{r['point']['dtype']} {r['mode']} h{r['point']['head_size']} B{r['point']['batch']}/"
                     f"{_ctx(r['point'])} {x:.2f}" for r, x in beyond_twin(bench["results"], v, base)]  # fmt: skip
            lines.append(f"{v} over {base}: geomean {geomean(over):.3f} ({span(over)}); {len(below)} of {len(over)} "
                         f"points below the A/A twin's lowest ratio in their dtype and mode"
                         f"{': ' + '; '.join(below) if below else ''}.")  # fmt: skip
    return lines


def grouped_runs(folder: Path, cfg: dict) -> list[str]:
    """What the runs of a grouped-form folder wrote: validate and vLLM-test records, then each held-out
    bench and decode step over the run's ``base`` (the library it compares with; default patched)."""
    files = [(f, run.get("base", "patched")) for run in cfg["run"] for f in run.get("files", [])]
    lines = validation(folder, [f for f, _ in files if not f.startswith("bench")])
    for name, base in files:
        if name.startswith("bench-heldout"):
            lines += heldout(folder, name, base)
        elif name.startswith("bench-decode"):
            lines += decode_arms(folder, name, base)
        elif name.startswith("bench-"):
            lines += bench_points(folder, name, base)
    return lines


def grouped_table(folder: Path, cfg: dict, tune_table) -> list[str]:
    """The table tune picked with the grouped form: how it was chosen (``tune_table``), then its runs."""
    return ["## How the table was chosen", "", *tune_table(folder, cfg), "", *grouped_runs(folder, cfg)]


def grouped_form(folder: Path, cfg: dict) -> list[str]:
    return grouped_runs(folder, cfg)
