"""``kvpatch plugin enable|disable|status|check`` (options -> commands.plugin -> render)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..commands.choices import DEFAULT_ARCH
from ..commands.common import check_report_output
from .base import (
    ArchOpt,
    JobsOpt,
    JsonOpt,
    TreeOpt,
    app,
    cwd,
    decimal_value,
    emit_json,
    io,
    path_value,
    positive_value,
    progress,
    shown,
    warn,
    whole_value,
)

plugin_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Run the patched kernels inside the vLLM this Python environment has (vLLM's V0 engine, "
    "VLLM_USE_V1=0 VLLM_ATTENTION_BACKEND=XFORMERS), through vLLM's plugin entry point: no vLLM rebuild.",
)
app.add_typer(plugin_app, name="plugin")

DirOpt = Annotated[
    Optional[Path],
    typer.Option("--dir", metavar="DIR", help="The bundle's directory (default: $KVPATCH_PLUGIN_DIR, "
                 "else <sys.prefix>/share/kvpatch/vllm-plugin; the plugin reads the same).", parser=path_value),
]  # fmt: skip


def _print(lines: list[str]) -> None:
    for line in lines:
        io.out.print(shown(line), highlight=False, soft_wrap=True)


@plugin_app.command()
def enable(
    tree: TreeOpt = None,
    arch: ArchOpt = DEFAULT_ARCH,
    release: Annotated[
        Optional[str],
        typer.Option(
            metavar="VERSION",
            help="The tree's vLLM release, where kvpatch cannot read it (no apply here, no PKG-INFO).",
        ),
    ] = None,
    jobs: JobsOpt = None,
    build: Annotated[
        bool,
        typer.Option(
            "--build",
            help="Compile vLLM's full kernel set now if 'kvpatch build --all' has not (minutes to an hour, by CPU count).",
        ),
    ] = False,
    directory: DirOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Install the tree's patched kernels, built with vLLM's full kernel set ('kvpatch build --all'),
    for the installed vLLM of the same release; vLLM's plugin loader picks them up in every process."""
    from ..commands import plugin as P
    from ..render import enable_lines

    opts = P.EnableOptions(
        tree=tree, cwd=cwd(), arch=arch, jobs=jobs, release=release, directory=directory, build=build
    )
    bundle = directory if directory is not None else P.bundle_dir()
    check_report_output(json_out, opts.cwd, tree=tree, protected={"the plugin's bundle (--dir)": bundle})
    with progress() as p:
        report = P.enable(opts, progress=p)
    if not emit_json(json_out, {"directory": str(report.directory), "manifest": report.manifest.to_dict(),
                                "installed_vllm": report.installed_vllm, "warnings": list(report.warnings)}):  # fmt: skip
        _print(enable_lines(report))
    for line in report.warnings:
        warn(line)


@plugin_app.command()
def disable(directory: DirOpt = None) -> None:
    """Remove the bundle: vLLM runs its own kernels again (KVPATCH_DISABLE=1 does so for one process)."""
    from ..commands import plugin as P

    where, existed = P.disable(directory)
    _print([f"removed the bundle from {where}" if existed else f"no bundle at {where}: nothing to remove"])


@plugin_app.command()
def status(
    directory: DirOpt = None,
    gpus: Annotated[
        bool, typer.Option("--gpus", help="Also say which visible GPUs the bundle's archs serve (initialises CUDA).")
    ] = False,
    json_out: JsonOpt = None,
) -> None:
    """What vLLM's plugin loader would do in this environment, and why. Exit 0 when vLLM would
    run kvpatch's kernels, 1 when it would keep its own."""
    from ..commands import plugin as P
    from ..render import status_lines

    check_report_output(json_out, cwd(), protected={"the plugin's bundle (--dir)": directory})
    decision = P.status(directory, gpus=gpus)
    if not emit_json(json_out, decision.to_dict()):
        _print(status_lines(decision))
    if not decision.registers:
        raise typer.Exit(1)


@plugin_app.command()
def check(
    reps: Annotated[
        int, typer.Option(parser=positive_value, metavar="N", help="Timed replays per kernel and shape.")
    ] = 30,
    graphs: Annotated[
        bool, typer.Option("--graphs/--no-graphs", help="Also compare calls captured in CUDA graphs.")
    ] = True,
    json_out: JsonOpt = None,
) -> None:
    """On this GPU: register the plugin, compare vLLM's kernel with kvpatch's bit for bit over
    the bundle's configurations (through vllm._custom_ops and PagedAttention.forward_decode,
    eager and in CUDA graphs), and time both. Exit 6 on any difference."""
    from ..commands import plugin as P
    from ..render import check_lines

    check_report_output(json_out, cwd())
    report = P.check(reps=reps, graphs=graphs)
    if not emit_json(json_out, report.to_dict()):
        _print(check_lines(report))
    error = P.failure(report)
    if error is not None:
        raise error


@plugin_app.command()
def bench(
    model: Annotated[
        str,
        typer.Option(
            metavar="SHAPE|DIR",
            help="A model shape kvpatch knows (llama-3.1-8b, llama-3.2-1b, llama-3.2-3b, qwen2.5-7b; dummy weights, no download), or a model directory with config.json and weights.",
        ),
    ] = "llama-3.1-8b",
    dtype: Annotated[str, typer.Option("--dtype", metavar="DTYPE", help="fp16 or bf16.")] = "bf16",
    batch_sizes: Annotated[
        str,
        typer.Option(
            metavar="B,B",
            help="Batch sizes of the main rows (requests generated at once; '' for none: the --workload rows only).",
        ),
    ] = "1,8,32,64",
    input_len: Annotated[
        int, typer.Option(parser=whole_value, metavar="N", help="Prompt tokens per request in the main rows.")
    ] = 512,
    output_len: Annotated[
        int, typer.Option(parser=whole_value, metavar="N", help="Generated tokens per request in the main rows.")
    ] = 512,
    workload: Annotated[
        list[str],
        typer.Option(metavar="IN:OUT:B,B", help="More rows (repeatable), e.g. a long context: 4096:256:8,32."),
    ] = [],  # noqa: B006
    starts: Annotated[
        int,
        typer.Option(
            parser=whole_value,
            metavar="N",
            help="Engine starts per arm (arms: kvpatch, one per --bundle, vLLM, vLLM again).",
        ),
    ] = 4,
    bundle: Annotated[
        list[str],
        typer.Option(
            metavar="NAME=DIR",
            help="One more arm (repeatable, at most 3): the plugin bundle in DIR (kvpatch plugin enable --dir DIR) "
            "instead of the enabled one, e.g. grouped=./bundle-g4; the report sets it beside vLLM's kernels and "
            "the enabled bundle's, round by round.",
        ),
    ] = [],  # noqa: B006
    dummy_weights: Annotated[
        bool, typer.Option("--dummy-weights", help="With a model directory: random weights instead of its own.")
    ] = False,
    raw: Annotated[
        Optional[Path],
        typer.Option(
            metavar="DIR",
            help="Keep every engine start's numbers and log here; run again with the same DIR to resume (default: a temporary folder, removed when the run completes).",
            parser=path_value,
        ),
    ] = None,
    budget: Annotated[
        Optional[float],
        typer.Option(
            parser=decimal_value,
            metavar="SECONDS",
            help="Start no engine that would likely end after this many seconds; the report says how many ran.",
        ),
    ] = None,
    engine_timeout: Annotated[
        float,
        typer.Option(parser=decimal_value, metavar="SECONDS", help="Stop an engine start that runs longer than this."),
    ] = 1200.0,
    gpu_memory_utilization: Annotated[
        float, typer.Option(parser=decimal_value, metavar="F", help="vLLM's gpu_memory_utilization.")
    ] = 0.9,
    max_model_len: Annotated[
        Optional[int],
        typer.Option(
            parser=whole_value,
            metavar="N",
            help="The engine's context (default: 8192, or the longest workload's rounded up to 256 if longer, or "
            "the model's positions if fewer). vLLM captures decode graphs up to min(N, 8192) tokens and sizes every "
            "captured attention launch for that many, so the context, not the prompts, sets the kernels' shared "
            "memory; the default is what a deployment with a context of 8192 or more runs.",
        ),
    ] = None,
    json_out: JsonOpt = None,
) -> None:
    """vLLM serving with kvpatch's kernels against vLLM's own, on this GPU: vLLM's V0 engine
    (VLLM_USE_V1=0 VLLM_ATTENTION_BACKEND=XFORMERS) started again and again in separate
    processes, the arms alternated, KVPATCH_DISABLE=1 in vLLM's two arms (the A/A pair).
    Reports per workload the decode step time, the request latency and output tokens per
    second, and which kernels the plugin's own log says each arm ran; with --bundle, each other
    bundle's arm against vLLM's kernels and against the enabled bundle's. Exit 6 when an arm
    ran other kernels than it needs."""
    from ..commands import serving as S
    from ..render import serving_lines
    from .base import csv

    opts = S.ServingBenchOptions(
        model=model, dtype=dtype, batch_sizes=csv(batch_sizes, int, empty=True) or [], input_len=input_len, output_len=output_len,
        workloads=list(workload), bundles=list(bundle), starts=starts, dummy_weights=dummy_weights, raw=raw, budget_s=budget,
        engine_timeout_s=engine_timeout, gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
        json_path=json_out, cwd=cwd(),
    )  # fmt: skip
    with progress() as p:
        report = S.bench(opts, progress=p)
    if not emit_json(json_out, report):
        _print(serving_lines(report))
    if not report["complete"]:
        warn(f"{report['engine_starts']} of {report['planned']} engine starts ran: resume with --raw {report['raw']}")
