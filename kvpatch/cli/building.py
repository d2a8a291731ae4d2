"""``kvpatch build`` (options -> commands.build -> render)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.markup import escape

from ..commands.choices import DEFAULT_ARCH
from ..commands.common import check_report_output
from .base import ArchOpt, JobsOpt, JsonOpt, TreeOpt, app, csv, cwd, emit_json, io, progress, shown, warn


@app.command()
def build(
    tree: TreeOpt = None,
    arch: ArchOpt = DEFAULT_ARCH,
    dtypes: Annotated[Optional[str], typer.Option(metavar="LIST", help="fp16,bf16,fp32 (default fp16,bf16).")] = None,
    head_sizes: Annotated[Optional[str], typer.Option(metavar="LIST", help="e.g. 64,128,256 (default 128).")] = None,
    block_sizes: Annotated[Optional[str], typer.Option(metavar="LIST", help="e.g. 16,32 (default 16).")] = None,
    kv_cache_dtypes: Annotated[Optional[str], typer.Option(metavar="LIST", help="auto,fp8 (default auto).")] = None,
    all_kernels: Annotated[bool, typer.Option("--all", help="vLLM's full set of configurations.")] = False,
    jobs: JobsOpt = None,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Run vLLM's own build of the patched tree instead (pip install -e into this Python environment).",
        ),
    ] = False,
    json_out: JsonOpt = None,
) -> None:
    """Compile stock and patched kernels for an arch; report registers/spills; check the SASS."""
    from ..commands import build as B
    from ..render import build_table

    opts = B.BuildOptions(tree=tree, cwd=cwd(), arch=arch, dtypes=csv(dtypes), head_sizes=csv(head_sizes, int),
                          block_sizes=csv(block_sizes, int), kv_cache_dtypes=csv(kv_cache_dtypes),
                          all_kernels=all_kernels, jobs=jobs, full=full)  # fmt: skip
    check_report_output(json_out, opts.cwd, tree=tree)
    with progress() as p:
        report = B.run(opts, progress=p)
    if report.result is None:  # --full: vLLM's own build, whose report is its time
        if not emit_json(json_out, {"kind": "vllm-build", "seconds": report.full_seconds}):
            io.err.print(f"vLLM's build finished in {report.full_seconds:.0f} s", highlight=False)
        return
    result = report.result
    if not emit_json(json_out, result.to_dict()):
        io.out.print(build_table(result))
        for v in result.variants:
            io.out.print(f"{escape(v.name)}: {shown(v.library)}", highlight=False)
        if all_kernels:
            io.out.print("next: 'kvpatch plugin enable' puts the patched kernels into this environment's vLLM; "
                         "'kvpatch validate' and 'kvpatch bench' run them on a GPU", highlight=False)  # fmt: skip
        else:
            io.out.print("next: 'kvpatch validate' and 'kvpatch bench' run them on a GPU (needs torch with CUDA); "
                         "'kvpatch build --all' builds vLLM's full set, which 'kvpatch plugin enable' needs",
                         highlight=False)  # fmt: skip
    for line in report.warnings:
        warn(line)
