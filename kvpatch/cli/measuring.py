"""The GPU commands: validate, bench, tune (options -> commands -> render)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..commands.choices import DEFAULT_REPS, DEFAULT_ROUNDS, DEFAULT_WARMUP, GRID_KEYS, MAX_CONTEXT, TUNE_REPS
from ..errors import GpuCheckError
from .base import (
    BuildArchOpt,
    DeviceOpt,
    JobsOpt,
    JsonOpt,
    LibOpt,
    PlotOpt,
    TreeOpt,
    VariantInfoOpt,
    app,
    csv,
    cwd,
    decimal_value,
    file_value,
    io,
    json_target,
    path_value,
    progress,
    shown,
    whole_value,
)

#: The settings ``tune --grid`` may vary, as its help names them.
_GRID_KEYS = ", ".join(k.replace("_", "-") for k in GRID_KEYS)


@app.command()
def validate(
    tree: TreeOpt = None,
    arch: BuildArchOpt = None,
    lib: LibOpt = [],  # noqa: B006
    variant_info: VariantInfoOpt = None,
    quick: Annotated[bool, typer.Option("--quick", help="fp16/bf16, head 128, block 16 only (32 cases).")] = False,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Every head and block size vLLM instantiates, ALiBi on/off, all dtypes, auto+fp8, v1+v2 (sampled contexts); a skipped configuration fails.",
        ),
    ] = False,
    upstream: Annotated[
        bool,
        typer.Option(
            "--upstream",
            help="Also run the release's own test_paged_attention, unchanged, against each library (needs the tree).",
        ),
    ] = False,
    matrix: Annotated[
        bool, typer.Option("--matrix/--no-matrix", help="Run kvpatch's own matrix (--no-matrix: only --upstream).")
    ] = True,
    upstream_dir: Annotated[
        Optional[Path],
        typer.Option(
            "--upstream-dir",
            metavar="DIR",
            help="Where --upstream writes its run dir, logs and records.",
            parser=path_value,
        ),
    ] = None,
    workers: Annotated[
        Optional[int],
        typer.Option(
            parser=whole_value, metavar="N", help="pytest-xdist workers for --upstream, in all (default: CPU count)."
        ),
    ] = None,
    upstream_shard: Annotated[
        Optional[str],
        typer.Option(
            "--upstream-shard",
            metavar="K/N",
            help="Run only the K-th of N shares of vLLM's test cases (every N-th case as pytest collects them, from the K-th); the N runs together cover every case once.",
        ),
    ] = None,
    upstream_timeout: Annotated[
        Optional[float],
        typer.Option(
            "--upstream-timeout",
            parser=decimal_value,
            metavar="SECONDS",
            help="Seconds for the whole --upstream run (default 900); at the limit pytest is interrupted, the report counts what finished and says the run was cut (not a pass).",
        ),
    ] = None,
    paper: Annotated[
        bool, typer.Option("--paper", help="Also check the paper preset against stock (when building).")
    ] = False,
    seed: Annotated[int, typer.Option(parser=whole_value, metavar="N", help="Seed of the random inputs.")] = 0,
    dtypes: Annotated[Optional[str], typer.Option(metavar="LIST", help="Query dtypes, e.g. fp16,bf16.")] = None,
    kv: Annotated[Optional[str], typer.Option("--kv", metavar="LIST", help="KV-cache dtypes: auto,fp8.")] = None,
    head_sizes: Annotated[Optional[str], typer.Option(metavar="LIST", help="e.g. 64,128,256.")] = None,
    block_sizes: Annotated[Optional[str], typer.Option(metavar="LIST", help="e.g. 16,32.")] = None,
    kernels: Annotated[Optional[str], typer.Option(metavar="LIST", help="v1,v2.")] = None,
    heads: Annotated[Optional[str], typer.Option(metavar="Q/KV,...", help="Query/KV head pairs, e.g. 8/2,4/4.")] = None,
    alibi: Annotated[Optional[str], typer.Option(metavar="on,off", help="ALiBi on, off or both.")] = None,
    contexts: Annotated[
        Optional[str],
        typer.Option(metavar="LIST", help=f"Context lengths, e.g. 1,17,1500 (each 1 to {MAX_CONTEXT} tokens)."),
    ] = None,
    json_out: JsonOpt = None,
    device: DeviceOpt = "cuda",
) -> None:
    """GPU: patched == stock bit for bit over a configuration matrix (and stock ~= a float reference)."""
    from ..commands import validate as V
    from ..commands.common import parse_bools, parse_heads
    from ..render import print_upstream, print_validate

    path, to_stdout = json_target(json_out)
    opts = V.ValidateOptions(
        tree=tree, cwd=cwd(), arch=arch, libs=lib, variant_info=variant_info, quick=quick, full=full, paper=paper,
        seed=seed, dtypes=csv(dtypes), kv_cache_dtypes=csv(kv), head_sizes=csv(head_sizes, int),
        block_sizes=csv(block_sizes, int), kernels=csv(kernels), heads=parse_heads(heads) if heads is not None else None,
        alibi=parse_bools(alibi) if alibi is not None else None, contexts=csv(contexts, int), upstream=upstream,
        matrix=matrix, upstream_dir=upstream_dir, upstream_shard=upstream_shard, upstream_timeout=upstream_timeout,
        workers=workers, json_out=path, device=device,
    )  # fmt: skip
    with progress() as p:
        outcome = V.run(opts, progress=p)
    if not to_stdout:
        if outcome.report is not None:
            print_validate(outcome.report, io.out, io.err)
        if outcome.upstream is not None:
            print_upstream(outcome.upstream, io.out)
    if not outcome.ok:
        raise GpuCheckError(outcome.why())


@app.command()
def bench(
    tree: TreeOpt = None,
    arch: BuildArchOpt = None,
    lib: LibOpt = [],  # noqa: B006
    variant_info: VariantInfoOpt = None,
    point_set: Annotated[
        Optional[str],
        typer.Option("--set", metavar="SET", help="tuning, headline (default) or heldout (shapes tune never saw)."),
    ] = None,
    json_out: JsonOpt = None,
    plot: PlotOpt = None,
    variant: Annotated[
        list[str],
        typer.Option(
            "--variant", metavar="NAME=FILE", help="More variants: NAME=config.toml (repeatable; when building)."
        ),
    ] = [],  # noqa: B006
    paper: Annotated[
        Optional[bool], typer.Option("--paper/--no-paper", help="Include the paper preset (when building; default on).")
    ] = None,
    control: Annotated[
        bool, typer.Option("--control/--no-control", help="Include the prefetch-never-runs control (when building).")
    ] = False,
    quick: Annotated[
        bool, typer.Option("--quick", help="A set of 8 points instead of 24 (alone: not with --set or shape options).")
    ] = False,
    dtypes: Annotated[Optional[str], typer.Option(metavar="LIST", help="fp16,bf16 (default).")] = None,
    batches: Annotated[Optional[str], typer.Option(metavar="LIST", help="e.g. 1,4,16,64.")] = None,
    contexts: Annotated[
        Optional[str], typer.Option(metavar="LIST", help=f"e.g. 1024,4096,16384 (each 1 to {MAX_CONTEXT} tokens).")
    ] = None,
    heads: Annotated[
        Optional[str], typer.Option(metavar="Q/KV,...", help="Query/KV heads, e.g. 32/8 or 32/8,8/1.")
    ] = None,
    head_sizes: Annotated[Optional[str], typer.Option(metavar="LIST", help="e.g. 64,128.")] = None,
    block_sizes: Annotated[Optional[str], typer.Option(metavar="LIST", help="e.g. 16,32.")] = None,
    kv: Annotated[Optional[str], typer.Option("--kv", metavar="LIST", help="KV-cache dtypes: auto,fp8.")] = None,
    kernels: Annotated[
        str, typer.Option(metavar="LIST", help="v1,v2 or 'dispatched' (only the kernel vLLM launches).")
    ] = "v1,v2",
    seed: Annotated[
        Optional[int],
        typer.Option(
            parser=whole_value, metavar="N", help="Seed of the KV data and block tables (default: the set's)."
        ),
    ] = None,
    capture_len: Annotated[
        Optional[int],
        typer.Option(
            parser=whole_value,
            metavar="N",
            help="Size every launch for N tokens (its max_seq_len, which also picks v1 or v2 as vLLM does) while "
            "the sequences keep their context: what vLLM's CUDA graphs launch, captured for min(engine context, "
            "8192) tokens.",
        ),
    ] = None,
    reps: Annotated[
        int,
        typer.Option(
            parser=whole_value,
            metavar="N",
            help="Timed launches per point, variant and round (more for kernels < 30 us).",
        ),
    ] = DEFAULT_REPS,
    rounds: Annotated[
        int,
        typer.Option(
            parser=whole_value, metavar="N", help="Interleaved rounds (the speedup interval is min..max over them)."
        ),
    ] = DEFAULT_ROUNDS,
    warmup: Annotated[
        int, typer.Option(parser=whole_value, metavar="N", help="Untimed launches per variant before each round.")
    ] = DEFAULT_WARMUP,
    warm: Annotated[bool, typer.Option("--warm/--no-warm", help="Time with a warm L2.")] = True,
    cold: Annotated[bool, typer.Option("--cold/--no-cold", help="Time with the L2 flushed before each launch.")] = True,
    check: Annotated[
        bool, typer.Option("--check/--no-check", help="Check outputs bit-identical before timing.")
    ] = True,
    aa: Annotated[
        bool,
        typer.Option("--aa", help="Also time stock against itself (variant 'stock-aa'): the method's false verdicts."),
    ] = False,
    device: DeviceOpt = "cuda",
) -> None:
    """GPU: time stock, the paper preset and the patched kernels side by side (warm and cold)."""
    from ..commands import bench as B
    from ..commands.common import parse_heads
    from ..render import print_bench

    path, to_stdout = json_target(json_out)
    opts = B.BenchOptions(
        tree=tree, cwd=cwd(), arch=arch, libs=lib, variant_info=variant_info, variants=variant,
        paper=paper, control=control, point_set=point_set, quick=quick, dtypes=csv(dtypes),
        batches=csv(batches, int), contexts=csv(contexts, int), heads=parse_heads(heads) if heads is not None else None,
        head_sizes=csv(head_sizes, int), block_sizes=csv(block_sizes, int), kv_cache_dtypes=csv(kv), seed=seed,
        capture_len=capture_len, kernels=csv(kernels) or ["v1", "v2"], reps=reps, rounds=rounds, warmup=warmup, warm=warm, cold=cold,
        check=check, aa=aa, json_out=path, plot=plot, device=device,
    )  # fmt: skip
    with progress() as p:
        report = B.run(opts, progress=p)
    if not to_stdout:
        print_bench(report, io.out)
    if not report.ok:
        raise GpuCheckError("outputs differ from stock")


@app.command()
def tune(
    tree: TreeOpt = None,
    arch: Annotated[
        Optional[str],
        typer.Option(
            "--arch",
            metavar="ARCHS",
            help="TORCH_CUDA_ARCH_LIST syntax: 9.0a, 9.0, '8.0;9.0a', 9.0+PTX (default 9.0a; not with --from).",
        ),
    ] = None,
    lib: Annotated[
        list[str],
        typer.Option(
            "--lib",
            metavar="NAME=PATH.so:PREFIX",
            help="Prebuilt libraries (repeatable): 'stock' and the candidates; nothing is built.",
        ),
    ] = [],  # noqa: B006
    variant_info: Annotated[
        Optional[Path],
        typer.Option(
            "--variant-info",
            metavar="FILE",
            help="JSON of NAME -> {marker: ...}: the candidates' configurations (with --lib).",
            parser=file_value,
        ),
    ] = None,
    output: Annotated[
        Path,
        typer.Option(
            "--output", "-o", metavar="FILE", help="Where to write the tuned configuration.", parser=file_value
        ),
    ] = Path("kvpatch.toml"),
    json_out: Annotated[
        Optional[str],
        typer.Option(
            "--json", metavar="PATH", help="Write the ranking and the bench data as JSON to PATH ('-': stdout)."
        ),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick", help="Bench batch 2/32 x context 512/12288 of the tuning set (144 points) instead of 324."
        ),
    ] = False,
    reps: Annotated[
        Optional[int],
        typer.Option(
            parser=whole_value,
            metavar="N",
            help=f"Timed launches per point, candidate and round (default {TUNE_REPS}).",
        ),
    ] = None,
    rounds: Annotated[
        Optional[int],
        typer.Option(
            parser=whole_value,
            metavar="N",
            help=f"Interleaved rounds (the spread a verdict uses; default {DEFAULT_ROUNDS}).",
        ),
    ] = None,
    policy: Annotated[
        str,
        typer.Option(
            metavar="strict|geomean",
            help="strict (no tuning point slower than stock beyond noise where the candidate ran its own code) or geomean (only the geomean's interval above 1.00).",
        ),
    ] = "strict",
    fallback: Annotated[
        str,
        typer.Option(
            metavar="off|base", help="What instantiations tune does not measure get: off, or the base settings."
        ),
    ] = "off",
    jobs: JobsOpt = None,
    from_json: Annotated[
        list[Path],
        typer.Option(
            "--from",
            metavar="FILE",
            help="Choose again from a saved tune JSON (--json of an earlier tune; .gz too): no GPU, nothing built. Repeatable: each kernel from the last JSON that measured it (the runs must come from one machine).",
            parser=file_value,
        ),
    ] = [],  # noqa: B006
    exclude: Annotated[
        list[str],
        typer.Option(
            "--exclude",
            metavar="CANDIDATE@SELECTOR",
            help="With --from: rule out a candidate at a kernel (shell patterns, e.g. 'inline_*@bf16/256/16/auto/v1', '*@KERNEL' for the whole kernel); never picked, shown as excluded (repeatable).",
        ),
    ] = [],  # noqa: B006
    grid: Annotated[
        list[str],
        typer.Option(
            "--grid",
            metavar="KEY=V1,V2;...",
            help="The candidates to build: the default grid with settings replaced or added, e.g. "
            f"'issue=inline,call;min-group=2;min-ctas=1,1024' (keys {_GRID_KEYS}; repeatable: the union).",
        ),
    ] = [],  # noqa: B006
    dtype: Annotated[
        list[str],
        typer.Option(
            "--dtype",
            metavar="DTYPE",
            help="Measure only this query dtype's kernels (fp16 or bf16; repeatable); the others come out off.",
        ),
    ] = [],  # noqa: B006
    only: Annotated[
        list[str],
        typer.Option(
            "--only",
            metavar="SELECTOR",
            help="Measure only the tuned instantiations this selector picks (dtype[/head[/block]], e.g. fp16/128/16; repeatable); the others come out off.",
        ),
    ] = [],  # noqa: B006
    incumbent: Annotated[
        Optional[str],
        typer.Option(
            "--incumbent",
            metavar="NAME",
            help="The configuration to improve on: each kernel where it qualifies keeps its settings unless a qualifying candidate is never slower than it at a tuning point (beyond the rounds' spread; not counting points where both ran the same SASS, by the digests their builds recorded) and faster in geomean (its interval above 1.00). With --lib or --from, one of their candidates; when building, the tree's own configuration (the shipped table, or your kvpatch.toml), built as candidate NAME.",
        ),
    ] = None,
) -> None:
    """GPU: per kernel (v1, v2) of the tuned instantiations, sweep candidate settings, keep the fastest bit-identical one never slower than stock (else off; with --incumbent, never slower than it); write kvpatch.toml with the machine it was tuned on."""
    from ..commands import tune as T
    from ..render import tune_table

    opts = T.TuneOptions(tree=tree, cwd=cwd(), arch=arch, libs=lib, variant_info=variant_info, output=output,
                         json_out=json_target(json_out)[0], quick=quick, reps=reps, rounds=rounds, policy=policy, fallback=fallback,
                         jobs=jobs, from_json=from_json, exclude=exclude, grid=grid, dtypes=dtype, only=only,
                         incumbent=incumbent)  # fmt: skip
    with progress() as p:
        report = T.run(opts, progress=p)
    io.out.print(tune_table(report))
    on = sum(1 for _, _, c in report.config.kernel_variants() if not c.off)
    io.out.print(f"wrote {shown(output)}: {on} kernels prefetch; 'kvpatch config --config {shown(output)}' "
                 "prints it", highlight=False)  # fmt: skip
    if report.machine is not None:
        io.out.print(f"tuned on: {shown(report.machine.describe())}", highlight=False)
    if report.tree:
        io.out.print(f"next: kvpatch apply --tree {shown(report.tree)} --config {shown(output)}", highlight=False)
