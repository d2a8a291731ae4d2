"""The shipped rule table (kvpatch.config.defaults): what ``kvpatch tune`` wrote and chooses
again from the committed timing runs, what it leaves off, and what the docs say of it."""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from kvpatch.config import DEFAULT_TUNED_ON, config_from_marker, make_config, read_config_file
from kvpatch.config.machine import FIELDS

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "benchmarks/evidence/bounded-table"
#: The held-out set's corrections: bf16 head 128 block 16 v1 under launch bounds and fp16 head 64
#: block 16 v1 grouped were slower than the table before (tune-27, grouped-table/ in benchmarks/ARCHIVE.md,
#: the candidates' base) at batch 64, context 4096; o4 at fp16 head 64 block 16 v1 is tune-27's code.
EXCLUDE = ("g4xo4@bf16/128/16/auto/v1", "o4@bf16/128/16/auto/v1", "g4x*@fp16/64/16/auto/v1", "o4@fp16/64/16/auto/v1")


def _on(cfg) -> dict[tuple, object]:
    """The kernels vLLM builds that prefetch, and their settings."""
    return {kernel: c for kernel, _, c in cfg.kernel_variants() if not c.off}


def _halves(kernel: tuple, c) -> bool:
    """Whether the launcher reads the kernel's group-half-below: a grouped v1 kernel."""
    return c.group > 1 and kernel[4] == "v1"


#: The kernels whose logits the shipped table puts in global memory where shared memory limits them
#: (group-logits = auto; benchmarks/evidence/global-logits): fp16 head 128 and bf16 head 64, block 16, v1.
GLOBAL_LOGITS = {("fp16", 128, 16, "auto", "v1"), ("bf16", 64, 16, "auto", "v1")}
#: The kernels whose grouped form loads the next block's V vectors before it computes the block in
#: hand (group-v-loads = ahead; benchmarks/evidence/v-loads-ahead): fp16 head 256 block 16.
V_LOADS_AHEAD = {("fp16", 256, 16, "auto", "v1"), ("fp16", 256, 16, "auto", "v2")}
#: The kernels whose grouped form loads the next block's K vectors before it scores the block in
#: hand too (group-k-loads = ahead; benchmarks/evidence/k-loads-ahead): the same two.
K_LOADS_AHEAD = V_LOADS_AHEAD
#: The kernels the shipped table grouped last (benchmarks/evidence/fp16-h64-grouped): fp16 head 64
#: block 16, which tune-28 left ungrouped.
H64_GROUPED = {("fp16", 64, 16, "auto", "v1"), ("fp16", 64, 16, "auto", "v2")}


def _before_h64():
    """The shipped table before fp16 head 64 block 16 grouped (k-loads-ahead/kvpatch.toml): the
    table the settings measured since tune-28 chain to."""
    options, _ = read_config_file(EVIDENCE.parent / "k-loads-ahead" / "kvpatch.toml")
    return make_config(**options)


def _kernels(cfg, half_below: int | None = None, logits: bool = True, v_loads: bool = True,
             k_loads: bool = True) -> dict:  # fmt: skip
    """Each kernel's settings, group-half-below and group-logits only where the launcher reads them
    (grouped v1 kernels), there ``half_below`` where given, group-logits only with ``logits``,
    group-v-loads only with ``v_loads`` and group-k-loads only with ``k_loads``: tune-28's table
    with those settings."""
    return {k: replace(c, overrides=(), group_half_below=(half_below or c.group_half_below) if _halves(k, c) else 0,
                       group_logits=c.group_logits if logits and _halves(k, c) else "shared",
                       group_v_loads=c.group_v_loads if v_loads and c.group > 1 else "at-use",
                       group_k_loads=c.group_k_loads if k_loads and c.group > 1 else "at-use")
            for k, _, c in cfg.kernel_variants()}  # fmt: skip


def test_the_shipped_default_is_what_tune_wrote_on_the_h200() -> None:
    """DEFAULT_OVERRIDES and DEFAULT_TUNED_ON are the committed output of `kvpatch tune` (raw data
    beside it) with two settings measured since: group-half-below = 4 for every grouped v1 kernel
    (wave-rule/kvpatch.toml, the configuration that run timed: the tuned file with that one line
    changed), then group-logits = auto for two of them (global-logits/kvpatch.toml, that file with
    those two rules changed), then group-v-loads = ahead for fp16 head 256 block 16
    (v-loads-ahead/kvpatch.toml, that file with that rule changed), then group-k-loads = ahead
    there too (k-loads-ahead/kvpatch.toml, that file with that rule changed), then fp16 head 64
    block 16 grouped (fp16-h64-grouped/kvpatch.toml, that file with its two rules changed). Kernel
    by kernel the shipped table is that configuration."""
    options, tuned = read_config_file(EVIDENCE / "kvpatch.toml")
    timed, _ = read_config_file(EVIDENCE.parent / "wave-rule" / "kvpatch.toml")
    assert {k for k in options.keys() | timed.keys() if options.get(k) != timed.get(k)} == {"group_half_below"}
    assert (options["group_half_below"], timed["group_half_below"]) == (2, 4)
    logits, _ = read_config_file(EVIDENCE.parent / "global-logits" / "kvpatch.toml")
    v_ahead, _ = read_config_file(EVIDENCE.parent / "v-loads-ahead" / "kvpatch.toml")
    latest, _ = read_config_file(EVIDENCE.parent / "fp16-h64-grouped" / "kvpatch.toml")
    before = _before_h64()

    shipped, prev = _kernels(make_config()), _kernels(before)
    assert shipped == _kernels(make_config(**latest))
    assert {k for k in shipped if shipped[k] != prev[k]} == H64_GROUPED
    assert {k for k, c in shipped.items() if c.group_k_loads != "at-use"} == K_LOADS_AHEAD | H64_GROUPED
    shipped = prev
    assert {k for k, c in shipped.items() if c.group_k_loads != "at-use"} == K_LOADS_AHEAD
    shipped = _kernels(before, k_loads=False)
    assert shipped == _kernels(make_config(**v_ahead))
    assert {k for k, c in shipped.items() if c.group_v_loads != "at-use"} == V_LOADS_AHEAD
    shipped = _kernels(before, k_loads=False, v_loads=False)
    assert shipped == _kernels(make_config(**logits), v_loads=False) == _kernels(make_config(**v_ahead), v_loads=False)
    assert {k for k, c in shipped.items() if c.group_logits != "shared"} == GLOBAL_LOGITS
    shipped = _kernels(before, logits=False, v_loads=False, k_loads=False)
    assert shipped == _kernels(make_config(**timed), logits=False) == _kernels(make_config(**logits), logits=False)
    assert shipped != _kernels(make_config(**options)) == _kernels(make_config(**options), half_below=2)
    assert shipped == _kernels(make_config(**options), half_below=4)
    assert {c.group_half_below for c in shipped.values() if c.group > 1} == {0, 4}
    assert config_from_marker(make_config().marker()) == make_config()  # the table's marker reads back
    assert [getattr(tuned, f) for f in FIELDS] == [getattr(DEFAULT_TUNED_ON, f) for f in FIELDS]


@pytest.mark.slow
def test_the_shipped_table_is_what_tune_chooses_from_the_fixed_timing_runs() -> None:
    """Chosen again from the raw data of the run it was tuned from (tune-28: stock, tune-27 and
    tune-27 grouped and bounded three ways), the strict policy writes exactly the shipped rules;
    without the held-out set's exclusions bf16 head 128 block 16 v1 would take launch bounds and
    fp16 head 64 block 16 v1 would group (it groups since, chosen and timed on its own with the
    grouped form's later code: the table before that step is what tune-28 chose)."""
    from kvpatch.tune import merge_tune_data, rechoose

    merged = merge_tune_data([json.loads(gzip.decompress((EVIDENCE / "tune.json.gz").read_bytes()))])
    report = rechoose(merged, policy="strict", exclude=list(EXCLUDE))
    # and the settings measured since (above)
    assert _kernels(report.config, half_below=4) == _kernels(_before_h64(), logits=False, v_loads=False, k_loads=False)
    unexcluded = rechoose(merged, policy="strict").config

    def form(cfg) -> dict:
        return {k: (c.group, c.group_ctas_per_sm) for k, _, c in cfg.kernel_variants() if c.group > 1}

    shipped, again = form(_before_h64()), form(unexcluded)
    assert {k for k in again if again[k] != shipped.get(k)} == {
        ("fp16", 64, 16, "auto", "v1"),
        ("bf16", 128, 16, "auto", "v1"),
    }
    assert again[("bf16", 128, 16, "auto", "v1")] == (4, 4) and shipped[("bf16", 128, 16, "auto", "v1")] == (4, 0)


def test_only_the_tuned_instantiations_prefetch() -> None:
    """Every kernel tune did not measure (other head and block sizes, fp32, fp8 caches) compiles
    as stock; what prefetches is one of the tuned instantiations' kernels."""
    from kvpatch.tune import tuned_instantiations

    cfg = make_config()
    tuned = set(tuned_instantiations())
    on = _on(cfg)
    assert on and {k[:3] for k in on} <= tuned and {k[3] for k in on} == {"auto"}
    assert all(not cfg.prefetches(d, h, b, "fp8", k) for d, h, b in tuned for k in ("v1", "v2"))
    for dtype, head, block in [
        ("fp32", 128, 16),
        ("bf16", 80, 32),
        ("bf16", 32, 32),
        ("fp16", 96, 16),
        ("fp16", 128, 8),
    ]:
        assert not cfg.prefetches(dtype, head, block, "auto", "v1") and not cfg.prefetches(
            dtype, head, block, "auto", "v2"
        )


def test_every_bf16_kernel_of_the_default_takes_the_split_form() -> None:
    """Inline asm alone stops nvcc unswitching the key loop on the ALiBi slope, and bf16/fp32
    then round the ALiBi term differently from stock: every bf16 kernel the shipped table turns
    on takes ``issue=split`` (inline asm, with stock's loop kept for heads with ALiBi), so
    ``apply`` with no options warns of nothing."""
    from kvpatch.commands.configuration import ConfigOptions, configure

    assert all(c.issue == "split" for k, c in _on(make_config()).items() if k[0] in ("bf16", "fp32"))
    _, unreached, overridden = configure(ConfigOptions())
    assert unreached == [] and overridden == []


def _user_docs() -> str:
    """README and the docs, where the shipped table is shown to users."""
    return "\n".join(p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def test_the_documented_table_of_the_default_is_the_default() -> None:
    """The per-kernel table the docs show is written by hand but must say what the shipped
    table does, and so must their counts of the kernels it turns on."""
    docs = _user_docs()
    cfg = make_config()
    for dtype in ("fp16", "bf16"):
        for kernel in ("v1", "v2"):
            cells = []
            for head in (64, 128, 256):
                for block in (16, 32):
                    c = cfg.resolve(dtype, head, block, "auto", kernel)
                    gates = (f" mg{c.min_group}" if c.min_group != 1 else "") + (
                        f" ctas{c.min_ctas}" if c.min_ctas != 1 else ""
                    )
                    gates += " warp" if c.read == "warp" else ""
                    grouped = f" g{c.group}/{c.group_min_ctas}" if c.group > 1 else ""
                    grouped += f" {c.group_ctas_per_sm}/SM" if c.group > 1 and c.group_ctas_per_sm else ""
                    grouped += " gl" if c.group > 1 and kernel == "v1" and c.group_logits == "auto" else ""
                    grouped += " va" if c.group > 1 and c.group_v_loads == "ahead" else ""
                    grouped += " ka" if c.group > 1 and c.group_k_loads == "ahead" else ""
                    cells.append(("off" if c.off else f"{c.issue} {c.scope} la{c.lookahead}{gates}") + grouped)
            assert f"| {dtype} {kernel} | " + " | ".join(cells) + " |" in docs, (dtype, kernel, cells)
    on = _on(cfg)
    rotate = sum(c.scope == "kv-head-rotate" for c in on.values())
    assert re.search(rf"uses it on {rotate} of its {len(on)} kernels", docs), (rotate, len(on))


def test_a_base_setting_gives_every_kernel_the_earlier_halving_rule_back() -> None:
    """``--group-half-below 2`` (docs/configuration.md): the table's grouped v1 kernels, prefetching
    or off, all halve by the earlier rule again; without it they take the table's 4."""

    def half_below(cfg) -> set[int]:
        return {c.group_half_below for k, _, c in cfg.kernel_variants() if _halves(k, c)}

    assert half_below(make_config()) == {4}
    assert half_below(make_config(group_half_below=2)) == {2}
