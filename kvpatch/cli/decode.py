"""The decode-step commands: bench-decode, and the weight-prefetch sweep (a maintainer's
command, hidden from --help)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from ..commands.choices import DECODE_LAYERS, DECODE_ROUNDS, DEFAULT_MODELS, MAX_CONTEXT, MODELS
from ..errors import GpuCheckError
from .base import (
    BuildArchOpt,
    JsonOpt,
    PlotOpt,
    TreeOpt,
    app,
    csv,
    cwd,
    decimal_value,
    file_value,
    io,
    json_target,
    path_value,
    progress,
    whole_value,
)

LibsFileOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--libs-file",
        metavar="FILE",
        help="A file of NAME=PATH.so:PREFIX lines ('#' comments; a relative PATH is read from the file's folder), as scripts/gpu_prepare.py writes libs.txt.",
        parser=file_value,
    ),
]


@app.command("bench-decode")
def bench_decode(
    lib: Annotated[
        list[str],
        typer.Option(
            "--lib",
            metavar="NAME=PATH.so:PREFIX",
            help="Attention libraries (repeatable; 'stock' required). Default: build stock+patched from the tree.",
        ),
    ] = [],  # noqa: B006
    libs_file: LibsFileOpt = None,
    tree: TreeOpt = None,
    arch: BuildArchOpt = None,
    models: Annotated[
        Optional[str],
        typer.Option(metavar="LIST", help=f"A comma list of {','.join(MODELS)} (default {','.join(DEFAULT_MODELS)})."),
    ] = None,
    dtypes: Annotated[Optional[str], typer.Option(metavar="LIST", help="bf16,fp16 (default both).")] = None,
    batches: Annotated[Optional[str], typer.Option(metavar="LIST", help="Default 1,4,16,64.")] = None,
    contexts: Annotated[
        Optional[str], typer.Option(metavar="LIST", help=f"Default 1024,4096,16384 (each 1 to {MAX_CONTEXT} tokens).")
    ] = None,
    layers: Annotated[
        int, typer.Option(parser=whole_value, metavar="N", help="Decoder layers per step.")
    ] = DECODE_LAYERS,
    rounds: Annotated[
        Optional[int],
        typer.Option(
            parser=whole_value,
            metavar="N",
            help=f"Interleaved rounds (spread = min..max over them; default 7 with weight prefetch, else {DECODE_ROUNDS}).",
        ),
    ] = None,
    cycles: Annotated[
        Optional[int],
        typer.Option(
            parser=whole_value,
            metavar="N",
            help="Whole carry-over cycles per round (each arm timed N x arms times; default: ~0.15 s a round).",
        ),
    ] = None,
    wpf: Annotated[
        Optional[str],
        typer.Option(
            "--wpf",
            metavar="CONFIG",
            help="A whole weight-prefetch configuration: windows NAME=CAPS[@HINT] and knobs, e.g. 'oproj->gateup=1:12,8:8;gateup->down=8@evict_normal;grid=16'.",
        ),
    ] = None,
    cap: Annotated[
        Optional[str],
        typer.Option(
            metavar="MIB",
            help="The first form (one window per layer: o_proj, gate/up, down): per-batch MiB '1:32,4:32,8:16', one MiB value, 'off' or 'default'.",
        ),
    ] = None,
    grid: Annotated[
        Optional[str], typer.Option(metavar="N", help="Prefetch CTAs, or 'auto' (one per MiB, 4..32).")
    ] = None,
    threads: Annotated[
        Optional[int], typer.Option(parser=whole_value, metavar="N", help="Prefetch threads per CTA (multiple of 32).")
    ] = None,
    chunk: Annotated[
        Optional[int],
        typer.Option(parser=whole_value, metavar="BYTES", help="Bytes per bulk prefetch (multiple of 16)."),
    ] = None,
    hint: Annotated[
        Optional[str], typer.Option(metavar="HINT", help="evict_last, evict_normal, evict_first or none.")
    ] = None,
    fork: Annotated[
        Optional[str],
        typer.Option(metavar="attn|qkv", help="The first form's fork: before attention or before the first RMSNorm."),
    ] = None,
    join: Annotated[
        Optional[str], typer.Option(metavar="step|oproj", help="Join once per step or before each o_proj.")
    ] = None,
    priority: Annotated[
        Optional[str], typer.Option(metavar="PRIORITY", help="Side stream priority: high, normal or an int.")
    ] = None,
    tail: Annotated[
        Optional[str],
        typer.Option(
            "--tail",
            metavar="CAPS[@HINT]",
            help="The in-kernel form (o_proj's head from the attention kernel's tail), e.g. '32@evict_normal'; needs a weight-tail library 'tail'.",
        ),
    ] = None,
    aa: Annotated[
        bool, typer.Option("--aa/--no-aa", help="Time stock against itself (stock-aa: a second capture).")
    ] = True,
    zero: Annotated[
        bool,
        typer.Option(
            "--zero/--no-zero", help="The zero-byte arm: the same forks, the prefetch kernel launched with no rows."
        ),
    ] = True,
    guard: Annotated[
        str,
        typer.Option(
            metavar="auto|on|off",
            help="Demote evict_last prefetches to evict_normal before every launch (auto: where an arm uses evict_last).",
        ),
    ] = "auto",
    prefetch_lib: Annotated[
        Optional[Path],
        typer.Option(
            "--prefetch-lib",
            metavar="FILE",
            help="A built weight-prefetch library (default: build one where an arm prefetches weights).",
            parser=file_value,
        ),
    ] = None,
    cold: Annotated[
        bool, typer.Option("--cold", help="Flush L2 (read+write >= 2x L2, then read) before every step.")
    ] = False,
    micro: Annotated[bool, typer.Option("--micro", help="Also run the GEMM-after-idle micro-benchmark.")] = False,
    json_out: JsonOpt = None,
    plot: PlotOpt = None,
    text: Annotated[
        Optional[Path],
        typer.Option("--text", metavar="FILE", help="Also write the table (as printed) here.", parser=file_value),
    ] = None,
) -> None:
    """GPU: a model-shaped decode step (CUDA graph): stock, patched, and both with the L2 weight prefetch, beside its controls."""
    from ..commands import decode as D
    from ..fsutil import write_atomic
    from ..render import decode_text, micro_table

    path, to_stdout = json_target(json_out)
    knobs = dict(wpf=wpf, cap=cap, grid=grid, threads=threads, chunk=chunk, hint=hint, fork=fork, join=join,
                 priority=priority)  # fmt: skip
    opts = D.DecodeOptions(libs=lib, libs_file=libs_file, tree=tree, cwd=cwd(), arch=arch, models=csv(models),
                           dtypes=csv(dtypes), batches=csv(batches, int), contexts=csv(contexts, int), layers=layers,
                           rounds=rounds, cycles=cycles, prefetch={k: v for k, v in knobs.items() if v is not None},
                           aa=aa, zero=zero, tail=tail, guard=guard, prefetch_lib=prefetch_lib, cold=cold, micro=micro,
                           json_out=path, plot=plot, text=text)  # fmt: skip
    with progress() as p:
        report = D.run(opts, progress=p)
    table = decode_text(report) + ("\n\n" + micro_table(report.micro) if report.micro else "")
    if text is not None:
        write_atomic(text, table + "\n")
    if not to_stdout:
        io.out.print(escape(table), highlight=False, soft_wrap=True)
    if not report.summary()["all_identical"]:
        raise GpuCheckError("outputs differ from stock")


@app.command("bench-decode-sweep", hidden=True)
def bench_decode_sweep(
    lib: Annotated[
        list[str], typer.Option("--lib", metavar="NAME=PATH.so:PREFIX", help="'stock' (and 'patched', 'tail').")
    ] = [],  # noqa: B006
    libs_file: LibsFileOpt = None,
    out: Annotated[
        Path,
        typer.Option(
            "--out", metavar="DIR", help="Where sweep.json, sweep.txt and each stage's JSON go.", parser=path_value
        ),
    ] = Path("sweep-out"),
    budget: Annotated[
        float,
        typer.Option(parser=decimal_value, metavar="SECONDS", help="For all stages (each stops at its share)."),
    ] = 420.0,
    prefetch_lib: Annotated[Optional[Path], typer.Option("--prefetch-lib", metavar="FILE", parser=file_value)] = None,
    stages: Annotated[
        Optional[str], typer.Option(metavar="LIST", help="lead,micro,kernels,steps,final,guard_off (default all).")
    ] = None,
    tail: Annotated[
        bool, typer.Option("--tail/--no-tail", help="The in-kernel arms, where a 'tail' library is given.")
    ] = True,
) -> None:
    """GPU, for maintainers: measure the weight prefetch's windows on the decode step, pick them per batch, bench the pick with every control."""

    from ..commands import decode as D
    from ..fsutil import parse_json, write_atomic
    from ..render.decode import sweep_summary, sweep_text

    opts = D.SweepOptions(libs=lib, libs_file=libs_file, out=out, budget=budget, prefetch_lib=prefetch_lib,
                          stages=csv(stages), tail=tail)  # fmt: skip
    with progress() as p:
        result = D.run_sweep(opts, progress=p)

    def load(name: str):
        try:
            return parse_json((out / name).read_bytes())
        except (OSError, ValueError):
            return None

    reports = {k: load(f"decode_{k}.json") for k in ("final", "lead", "steps", "guard_off")}
    reports = {k: v for k, v in reports.items() if v}
    text = sweep_text(result, reports=reports, kernels=load("kernels.json"))
    summary = sweep_summary(result, reports)
    write_atomic(out / "sweep.txt", text + "\n")
    write_atomic(out / "summary.txt", summary + "\n")
    io.out.print(escape(text + "\n\n" + summary), highlight=False, soft_wrap=True)
    if not D.sweep_identical(result):
        raise GpuCheckError("outputs differ from stock")
