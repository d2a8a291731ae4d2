"""The ``kvpatch`` command: each command parses options, calls the library, renders.

Exit codes: 0 success; 1 other failure; 2 invalid parameters or configuration;
3 a release could not be fetched (unknown, unsupported, no network); 4 the source
cannot be patched (sites not found, local edits, failed re-parse); 5 build or
check failure, or a missing tool (also: no GPU); 6 a GPU check failed (bit mismatch);
130 interrupted (Ctrl-C). The codes live with the error types, kvpatch/errors.py.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.syntax import Syntax

from . import __version__
from .config import dump_config, parse_rules
from .reach import unreached
from .config_io import config_and_tuned, variant_configs
from .render import sites_table
from .gpu.defaults import DECODE_LAYERS, DECODE_ROUNDS, DEFAULT_REPS, DEFAULT_ROUNDS, DEFAULT_WARMUP, TUNE_REPS
from .errors import GpuCheckError, KvpatchError, UsageError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Patch vLLM's PagedAttention decode kernel with an L2 bulk prefetch of the next KV block.",
    epilog="Exit codes: 0 ok, 2 bad parameters, 3 fetch failed, 4 cannot patch, "
    "5 build/tool failure (no GPU too), 6 GPU check failed, 130 interrupted, 1 other.",
)
out = Console(soft_wrap=True)  # lines stay whole in pipes and logs; tables still fit the width
err = Console(stderr=True, soft_wrap=True)  # diagnostics: one line each, however long
_DEBUG = {"on": False}


def _version(value: bool) -> None:
    if value:
        out.print(f"kvpatch {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    _DEBUG["on"] = debug


# --------------------------------------------------------------------------- options

VllmOpt = Annotated[Optional[str], typer.Option("--vllm", help="vLLM release: v0.10.2 or 0.10.2.")]
TreeOpt = Annotated[
    Optional[Path],
    typer.Option("--tree", help="An existing vLLM checkout (default: the tree of the last apply here)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _cwd() -> Path:
    return Path.cwd()


# --------------------------------------------------------------------------- apply


@app.command()
def apply(
    vllm: VllmOpt = None,
    tree: TreeOpt = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="kvpatch.toml with any of the options below.")] = None,
    preset: Annotated[Optional[str], typer.Option(help="default | paper (the paper's exact mechanism).")] = None,
    lookahead: Annotated[Optional[int], typer.Option(help="Prefetch block_idx + N*NUM_WARPS (default 1).")] = None,
    size: Annotated[Optional[str], typer.Option(help="auto (one K/V tile: BLOCK_SIZE*HEAD_SIZE*sizeof(cache_t)) or bytes, a multiple of 16.")] = None,
    align: Annotated[Optional[int], typer.Option(help="Round the address down to this power of two >= 16 (default 16).")] = None,
    caches: Annotated[Optional[str], typer.Option(help="k | v | kv (default kv).")] = None,
    cache_hint: Annotated[Optional[str], typer.Option(help="none | evict_last | evict_first | evict_normal.")] = None,
    placement: Annotated[Optional[str], typer.Option(help="start (after the block number is read) | end (after the block's work).")] = None,
    scope: Annotated[Optional[str], typer.Option(help="cta (every CTA prefetches) | kv-head (one CTA per KV head under GQA) | kv-head-rotate (the KV head's CTAs take turns, block by block).")] = None,
    min_group: Annotated[Optional[int], typer.Option("--min-group", help="Prefetch only where >= N query heads share a KV head (a runtime test; 1 = always; MHA has 1).")] = None,
    min_ctas: Annotated[Optional[int], typer.Option("--min-ctas", help="Prefetch only in launches of >= N CTAs (query heads x sequences x partitions; a runtime test; 1 = always).")] = None,
    min_kv_mib: Annotated[Optional[int], typer.Option("--min-kv-mib", help="issue=call only: the call helper skips the prefetch unless the launch's KV cache, estimated from the grid (KV heads x sequences x partitions x one partition's K and V), is >= N MiB (0 = always). Timed on fp16 128/16: does not remove its small warm losses (benchmarks/results/tune-19-min-kv-mib).")] = None,
    control: Annotated[Optional[bool], typer.Option("--control/--no-control", help="Compile the prefetch but never run it (for measurements).")] = None,
    issue: Annotated[Optional[str], typer.Option(help="call (an out-of-line helper; keeps stock's code generation) | inline (asm in the loop) | split (inline, and the key loop runs as stock's copy when the ALiBi slope is not 0).")] = None,
    read: Annotated[Optional[str], typer.Option(help="lane (lane 0 reads the next block number inside the guard, the default) | warp (every lane reads it before the guard, at an index clamped into the loop; the guard's tests joined by & so the invariant ones leave the loop).")] = None,
    quantized: Annotated[Optional[str], typer.Option(help="skip (fp8-cache kernels stay stock, the default) | prefetch.")] = None,
    fp16: Annotated[Optional[str], typer.Option("--fp16", help="Settings for the fp16 kernels no rule names: 'off' (the default), key=value,... (e.g. 'issue=inline,lookahead=2': turns them on), or 'none' (the base settings).")] = None,
    bf16: Annotated[Optional[str], typer.Option("--bf16", help="As --fp16, for bf16 kernels.")] = None,
    fp32: Annotated[Optional[str], typer.Option("--fp32", help="As --fp16, for fp32 kernels.")] = None,
    rule: Annotated[Optional[list[str]], typer.Option("--rule", help="Settings for the instantiations a selector picks: 'bf16/80/32=off', 'fp16/64=issue=call' (dtype\\[/head\\[/block\\[/kv\\[/kernel]]]], kernel v1 or v2, * for any; the most specific rule decides a kernel; repeatable; SEL=none drops a default rule).")] = None,
    remote: Annotated[str, typer.Option(help="git remote to fetch releases from.")] = "",
    force: Annotated[bool, typer.Option(help="Patch even if the header has local edits.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Fetch a vLLM release (or use --tree), locate the key/value loop sites, inject the prefetch."""
    from . import api

    settings = dict(lookahead=lookahead, size=size, align=align, caches=caches, cache_hint=cache_hint,
                    placement=placement, scope=scope, min_group=min_group, min_ctas=min_ctas,
                    min_kv_mib=min_kv_mib, control=control, issue=issue, read=read)  # fmt: skip
    rules = parse_rules(rule) if rule else None
    cfg, tuned = config_and_tuned(config, preset=preset, quantized=quantized, fp16=fp16, bf16=bf16, fp32=fp32,
                                  rules=rules, **settings)  # fmt: skip
    if cfg.preset == "default":  # say which options the rules leave without effect
        given = [k for k, v in (*settings.items(), ("quantized", quantized)) if v is not None]
        selectors = [*(rules or {}), *(d for d, v in (("fp16", fp16), ("bf16", bf16), ("fp32", fp32)) if v is not None)]
        for line in unreached(cfg, given, selectors):
            err.print(f"[yellow]warning:[/] {escape(line)}", highlight=False, soft_wrap=True)
    report = api.apply(vllm=vllm, tree=tree, cfg=cfg, cwd=_cwd(), remote=remote or None,
                       force=force, console=err, tuned=tuned)  # fmt: skip
    for line in report.machine_differences:
        err.print(f"[yellow]warning:[/] tuned on another machine: {escape(line)} (re-run kvpatch tune here)",
                  highlight=False, soft_wrap=True)  # fmt: skip
    if as_json:
        out.print_json(json.dumps(report.to_json()))
        return
    header = escape(str(report.tree.header))
    if not report.changed:
        out.print(f"[green]already applied[/] ({escape(cfg.marker())}): {header}", highlight=False, soft_wrap=True)
    else:
        verb = "replaced" if report.previous else "patched"
        out.print(f"[green]{verb}[/] {header}", highlight=False)
        if report.previous:
            out.print(f"  previous: {escape('; '.join(report.previous))}", highlight=False, soft_wrap=True)
    out.print(sites_table(report.sites, {s.kind: "yes" for s in report.sites if
                                          (s.kind == "key" and cfg.k) or (s.kind == "value" and cfg.v)}))  # fmt: skip
    out.print(f"config: {escape(cfg.marker())}", highlight=False, soft_wrap=True)
    if report.tuned_on is not None:
        out.print(f"tuned on: {escape(report.tuned_on.describe())}", highlight=False)
    out.print("next: [bold]kvpatch diff[/]  |  [bold]kvpatch build --arch 9.0a[/]  |  [bold]kvpatch revert[/]")


# --------------------------------------------------------------------------- sites


@app.command()
def sites(vllm: VllmOpt = None, tree: TreeOpt = None, as_json: JsonOpt = False) -> None:
    """Show where the key and value loop sites are (no changes made)."""
    from . import api

    report = api.sites(vllm=vllm, tree=tree, cwd=_cwd(), console=err)
    found = report.sites
    if as_json:
        out.print_json(json.dumps(report.to_json()))
        return
    out.print(f"{escape(str(report.header))}: {found.key.cache_param.split('_')[0]}/{found.value.cache_param.split('_')[0]} "
              f"sites in paged_attention_kernel (line {found.function_line})", highlight=False)  # fmt: skip
    out.print(sites_table(found, report.injected))
    if report.injected and not report.intact:
        err.print("note: kvpatch's regions were changed after kvpatch wrote them", highlight=False)


# --------------------------------------------------------------------------- diff / revert


@app.command()
def diff(
    tree: TreeOpt = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the patch to this file ('-': stdout).")] = None,
) -> None:
    """Print what apply changed as a unified diff (a patch git apply / patch -p1 accept)."""
    from . import api
    from .fsutil import write_atomic

    if output is not None and str(output) != "-" and output.is_dir():
        raise UsageError(f"--output {output} is a directory: give a file name, or - for stdout")
    text = api.diff(tree=tree, cwd=_cwd(), console=err)
    if output is not None and str(output) == "-":
        sys.stdout.write(text)
        return
    if output is not None:
        write_atomic(output, text)
        shown = escape(str(output))
        err.print(f"wrote {shown}" if text else f"wrote {shown} (empty: the tree is stock)", highlight=False)
        return
    if not text:
        err.print("no changes: the header is stock")
        return
    if out.is_terminal:
        out.print(Syntax(text, "diff", theme="ansi_dark", background_color="default"))
    else:
        sys.stdout.write(text)


@app.command()
def revert(
    tree: TreeOpt = None,
    force: Annotated[bool, typer.Option(help="Revert even if kvpatch's regions were edited (the edits are lost).")] = False,
) -> None:
    """Remove kvpatch's injection: the header is stock again, byte for byte."""
    from . import api

    header, changed = api.revert(tree=tree, cwd=_cwd(), force=force)
    shown = escape(str(header))
    out.print(f"[green]reverted[/] {shown}" if changed else f"nothing to revert: {shown} is stock", highlight=False)


@app.command("config")
def show_config(
    config: Annotated[Optional[Path], typer.Option("--config", help="kvpatch.toml to read.")] = None,
    preset: Annotated[Optional[str], typer.Option(help="default | paper.")] = None,
) -> None:
    """Print the effective configuration as kvpatch.toml text (with where its rules were tuned)."""
    sys.stdout.write(dump_config(*config_and_tuned(config, preset=preset)))


# --------------------------------------------------------------------------- build / validate / bench

ArchOpt = Annotated[str, typer.Option("--arch", help="TORCH_CUDA_ARCH_LIST syntax: 9.0a, 9.0, '8.0;9.0a', 9.0+PTX.")]


def _csv(text: Optional[str], kind=str) -> Optional[list]:
    if text is None:
        return None
    try:
        return [kind(x) for x in text.replace(";", ",").split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"invalid list {text!r}") from None


@app.command()
def build(
    tree: TreeOpt = None,
    arch: ArchOpt = "9.0a",
    dtypes: Annotated[Optional[str], typer.Option(help="fp16,bf16,fp32 (default fp16,bf16).")] = None,
    head_sizes: Annotated[Optional[str], typer.Option(help="e.g. 64,128,256 (default 128).")] = None,
    block_sizes: Annotated[Optional[str], typer.Option(help="e.g. 16,32 (default 16).")] = None,
    kv_cache_dtypes: Annotated[Optional[str], typer.Option(help="auto,fp8 (default auto).")] = None,
    all_kernels: Annotated[bool, typer.Option("--all", help="vLLM's full set of configurations.")] = False,
    jobs: Annotated[Optional[int], typer.Option(help="Parallel nvcc processes (default: CPU count).")] = None,
    full: Annotated[bool, typer.Option("--full", help="Run vLLM's own build of the patched tree instead (pip install -e into this Python environment).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Compile stock and patched kernels for an arch; report registers/spills; check the SASS."""
    from . import api
    from . import build as B
    from .render import build_table

    if full:
        selection = [f"--{n}" for n, v in (("dtypes", dtypes), ("head-sizes", head_sizes), ("block-sizes", block_sizes),
                                            ("kv-cache-dtypes", kv_cache_dtypes)) if v is not None] + (["--all"] if all_kernels else [])  # fmt: skip
        if selection:
            raise UsageError(f"--full runs vLLM's own build (its whole kernel set): {', '.join(selection)} do not apply")
        target = api.resolve_tree(tree, _cwd())
        archs = B.parse_arch_list(arch)
        B.run_full_build(target.root, archs, jobs, console=err)
        return
    result = api.build(
        tree=tree, cwd=_cwd(), archs=arch, jobs=jobs, console=err,
        dtypes=_csv(dtypes), head_sizes=_csv(head_sizes, int), block_sizes=_csv(block_sizes, int),
        kv_cache_dtypes=_csv(kv_cache_dtypes), all_kernels=all_kernels,
    )  # fmt: skip
    if as_json:
        out.print_json(json.dumps(result.to_dict()))
    else:
        out.print(build_table(result))
        for v in result.variants:
            out.print(f"{v.name}: {v.library}")
        out.print("Load with kvpatch.gpu.launch.Kernels(path, prefix); running them needs a CUDA GPU "
                  "and a CUDA build of torch ('kvpatch validate', 'kvpatch bench').")  # fmt: skip
    for warning in result.split_warnings() + result.schedule_warnings():
        err.print(f"[yellow]warning:[/] {escape(warning)}")
    result.check()


LibOpt = Annotated[
    list[str],
    typer.Option("--lib", help="A prebuilt library NAME=path.so:PREFIX (repeatable); nothing is built, 'stock' is the baseline."),
]
VariantInfoOpt = Annotated[
    Optional[Path],
    typer.Option("--variant-info", help="With --lib: JSON {name: marker or {marker, compile_flags, ...}} recorded in the report."),
]


def _progress(message: str) -> None:
    err.print(message, highlight=False, markup=False)


@app.command()
def validate(
    tree: TreeOpt = None,
    arch: ArchOpt = "9.0a",
    lib: LibOpt = [],  # noqa: B006
    variant_info: VariantInfoOpt = None,
    quick: Annotated[bool, typer.Option(help="fp16/bf16, head 128, block 16 only (32 cases).")] = False,
    full: Annotated[bool, typer.Option(help="Every head and block size vLLM instantiates, ALiBi on/off, all dtypes, auto+fp8, v1+v2 (sampled contexts); a skipped configuration fails.")] = False,
    upstream: Annotated[bool, typer.Option(help="Also run the release's own test_paged_attention, unchanged, against each library (needs the tree).")] = False,
    matrix: Annotated[bool, typer.Option("--matrix/--no-matrix", help="Run kvpatch's own matrix (--no-matrix: only --upstream).")] = True,
    upstream_dir: Annotated[Optional[Path], typer.Option("--upstream-dir", help="Where --upstream writes its run dir, logs and records.")] = None,
    workers: Annotated[Optional[int], typer.Option(help="pytest-xdist workers for --upstream, in all (default: CPU count).")] = None,
    upstream_shard: Annotated[Optional[str], typer.Option("--upstream-shard", help="K/N: run only the K-th of N shares of vLLM's test cases (every N-th case as pytest collects them, from the K-th); the N runs together cover every case once. For machines whose time per run is limited.")] = None,
    upstream_timeout: Annotated[Optional[float], typer.Option("--upstream-timeout", help="Seconds for the whole --upstream run (default 900); at the limit pytest is interrupted, the report counts what finished and says the run was cut (not a pass).")] = None,
    paper: Annotated[bool, typer.Option(help="Also check the paper preset against stock (when building).")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the random inputs.")] = 0,
    dtypes: Annotated[Optional[str], typer.Option(help="Query dtypes, e.g. fp16,bf16.")] = None,
    kv: Annotated[Optional[str], typer.Option("--kv", help="KV-cache dtypes: auto,fp8.")] = None,
    head_sizes: Annotated[Optional[str], typer.Option(help="e.g. 64,128,256.")] = None,
    block_sizes: Annotated[Optional[str], typer.Option(help="e.g. 16,32.")] = None,
    kernels: Annotated[Optional[str], typer.Option(help="v1,v2.")] = None,
    heads: Annotated[Optional[str], typer.Option(help="Query/KV head pairs, e.g. 8/2,4/4.")] = None,
    alibi: Annotated[Optional[str], typer.Option(help="on,off.")] = None,
    contexts: Annotated[Optional[str], typer.Option(help="Context lengths, e.g. 1,17,1500.")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the full report here.")] = None,
    device: Annotated[str, typer.Option("--device", hidden=True, help="torch device (tests: cpu).")] = "cuda",
) -> None:
    """GPU: patched == stock bit for bit over a configuration matrix (and stock ~= a float reference)."""
    from .gpu.commands import ValidateOptions, parse_bools, parse_heads, run_validate_command
    from .render import print_upstream, print_validate

    opts = ValidateOptions(
        tree=tree, cwd=_cwd(), arch=arch, libs=lib, variant_info=variant_info, quick=quick, full=full, paper=paper,
        seed=seed, dtypes=_csv(dtypes), kv_cache_dtypes=_csv(kv), head_sizes=_csv(head_sizes, int),
        block_sizes=_csv(block_sizes, int), kernels=_csv(kernels), heads=parse_heads(heads) if heads else None,
        alibi=parse_bools(alibi) if alibi else None, contexts=_csv(contexts, int), upstream=upstream,
        matrix=matrix, upstream_dir=upstream_dir, upstream_shard=upstream_shard, upstream_timeout=upstream_timeout,
        workers=workers, json_out=json_out, device=device,
    )  # fmt: skip
    outcome = run_validate_command(opts, console=err, progress=_progress)
    if outcome.report is not None:
        print_validate(outcome.report, out, err)
    if outcome.upstream is not None:
        print_upstream(outcome.upstream, out)
    if not outcome.ok:
        raise GpuCheckError(outcome.why())


@app.command()
def bench(
    tree: TreeOpt = None,
    arch: ArchOpt = "9.0a",
    lib: LibOpt = [],  # noqa: B006
    variant_info: VariantInfoOpt = None,
    point_set: Annotated[Optional[str], typer.Option("--set", help="tuning | headline (default) | heldout: see kvpatch.gpu.points.")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write results + environment here.")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write a PNG of the speedups here.")] = None,
    variant: Annotated[list[str], typer.Option("--variant", help="More variants: NAME=config.toml (repeatable; when building).")] = [],  # noqa: B006
    paper: Annotated[bool, typer.Option("--paper/--no-paper", help="Include the paper preset (when building).")] = True,
    control: Annotated[bool, typer.Option("--control/--no-control", help="Include the prefetch-never-runs control (when building).")] = False,
    quick: Annotated[bool, typer.Option(help="8 points instead of 24.")] = False,
    dtypes: Annotated[Optional[str], typer.Option(help="fp16,bf16 (default).")] = None,
    batches: Annotated[Optional[str], typer.Option(help="e.g. 1,4,16,64.")] = None,
    contexts: Annotated[Optional[str], typer.Option(help="e.g. 1024,4096,16384.")] = None,
    heads: Annotated[Optional[str], typer.Option(help="Query/KV heads, e.g. 32/8 or 32/8,8/1.")] = None,
    head_sizes: Annotated[Optional[str], typer.Option(help="e.g. 64,128.")] = None,
    block_sizes: Annotated[Optional[str], typer.Option(help="e.g. 16,32.")] = None,
    kv: Annotated[Optional[str], typer.Option("--kv", help="KV-cache dtypes: auto,fp8.")] = None,
    kernels: Annotated[str, typer.Option(help="v1,v2 or 'dispatched' (only the kernel vLLM launches).")] = "v1,v2",
    seed: Annotated[Optional[int], typer.Option(help="Seed of the KV data and block tables (default: the set's).")] = None,
    reps: Annotated[int, typer.Option(help="Timed launches per point, variant and round (more for kernels < 30 us).")] = DEFAULT_REPS,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds (the speedup interval is min..max over them).")] = DEFAULT_ROUNDS,
    warmup: Annotated[int, typer.Option(help="Untimed launches per variant before each round.")] = DEFAULT_WARMUP,
    warm: Annotated[bool, typer.Option("--warm/--no-warm", help="Time with a warm L2.")] = True,
    cold: Annotated[bool, typer.Option("--cold/--no-cold", help="Time with the L2 flushed before each launch.")] = True,
    check: Annotated[bool, typer.Option("--check/--no-check", help="Check outputs bit-identical before timing.")] = True,
    aa: Annotated[bool, typer.Option("--aa/--no-aa", help="Also time stock against itself (variant 'stock-aa'): the method's false verdicts.")] = False,
    device: Annotated[str, typer.Option("--device", hidden=True, help="torch device (tests: cpu).")] = "cuda",
) -> None:
    """GPU: time stock, the paper preset and the patched kernels side by side (warm and cold)."""
    from .gpu.commands import BenchOptions, parse_heads, run_bench_command
    from .render import print_bench

    opts = BenchOptions(
        tree=tree, cwd=_cwd(), arch=arch, libs=lib, variant_info=variant_info, variants=variant_configs(variant),
        paper=paper, control=control, point_set=point_set, quick=quick, dtypes=_csv(dtypes),
        batches=_csv(batches, int), contexts=_csv(contexts, int), heads=parse_heads(heads) if heads else None,
        head_sizes=_csv(head_sizes, int), block_sizes=_csv(block_sizes, int), kv_cache_dtypes=_csv(kv), seed=seed,
        kernels=_csv(kernels) or ["v1", "v2"], reps=reps, rounds=rounds, warmup=warmup, warm=warm, cold=cold,
        check=check, aa=aa, json_out=json_out, plot=plot, device=device,
    )  # fmt: skip
    report = run_bench_command(opts, console=err, progress=_progress)
    print_bench(report, out)
    if not report.ok:
        raise GpuCheckError("bench found outputs that differ from stock")


@app.command()
def tune(
    tree: TreeOpt = None,
    arch: ArchOpt = "9.0a",
    lib: Annotated[list[str], typer.Option("--lib", help="Prebuilt NAME=PATH.so:PREFIX (repeatable): 'stock' and the candidates; nothing is built.")] = [],  # noqa: B006
    variant_info: Annotated[Optional[Path], typer.Option("--variant-info", help="JSON of NAME -> {marker: ...}: the candidates' configurations (with --lib).")] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the tuned configuration.")] = Path("kvpatch.toml"),
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the ranking and the bench data here.")] = None,
    quick: Annotated[bool, typer.Option(help="Bench batch 2/32 x context 512/12288 of the tuning set (144 points) instead of 324.")] = False,
    reps: Annotated[int, typer.Option(help="Timed launches per point, candidate and round.")] = TUNE_REPS,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds (the spread a verdict uses).")] = DEFAULT_ROUNDS,
    policy: Annotated[str, typer.Option(help="strict (no tuning point slower than stock beyond noise) | geomean (only the geomean's interval above 1.00).")] = "strict",
    fallback: Annotated[str, typer.Option(help="What instantiations tune does not measure get: off | base (the base settings).")] = "off",
    jobs: Annotated[Optional[int], typer.Option(help="Parallel nvcc processes (default: CPU count).")] = None,
    from_json: Annotated[list[Path], typer.Option("--from", help="Choose again from a saved tune JSON (--json of an earlier tune; .gz too): no GPU, nothing built. Repeatable: each kernel from the last JSON that measured it (the runs must come from one machine).")] = [],  # noqa: B006
    exclude: Annotated[list[str], typer.Option("--exclude", help="With --from: rule out CANDIDATE@SELECTOR (shell patterns, e.g. 'inline_*@bf16/256/16/auto/v1', or '*@KERNEL' for the whole kernel), as when validate --upstream or the held-out set found it at fault; never picked, shown as excluded (repeatable).")] = [],  # noqa: B006
    grid: Annotated[list[str], typer.Option("--grid", help="The candidates to build: the default grid with settings replaced or added, e.g. 'issue=inline,call;min-group=2;min-ctas=1,1024' (keys issue, scope, lookahead, min-group, min-ctas, min-kv-mib, read; repeatable: the union; min-kv-mib pairs only with issue=call).")] = [],  # noqa: B006
    dtype: Annotated[list[str], typer.Option("--dtype", help="Measure only this query dtype's kernels (fp16 or bf16; repeatable); the others come out off.")] = [],  # noqa: B006
    only: Annotated[list[str], typer.Option("--only", help="Measure only the tuned instantiations this selector picks (dtype\\[/head\\[/block]], e.g. fp16/128/16; repeatable); the others come out off (merge runs with --from).")] = [],  # noqa: B006
) -> None:
    """GPU: per kernel (v1, v2) of fp16/bf16 x head 64/128/256 x block 16/32, sweep 12 candidates (issue inline/call/split x scope x lookahead; --grid: others), keep the fastest bit-identical one never slower than stock, or off; write kvpatch.toml with the machine it was tuned on."""
    from .gpu.tune_command import TuneOptions, run_tune_command
    from .render import tune_table

    opts = TuneOptions(tree=tree, cwd=_cwd(), arch=arch, libs=lib, variant_info=variant_info, output=output,
                       json_out=json_out, quick=quick, reps=reps, rounds=rounds, policy=policy, fallback=fallback,
                       jobs=jobs, from_json=from_json, exclude=exclude, grid=grid, dtypes=dtype, only=only)  # fmt: skip
    report = run_tune_command(opts, console=err, progress=_progress)
    out.print(tune_table(report))
    out.print(f"wrote {escape(str(output))}: {escape(report.config.marker())}", highlight=False, soft_wrap=True)
    if report.machine is not None:
        out.print(f"tuned on: {escape(report.machine.describe())}", highlight=False)
    if report.tree:
        out.print(f"next: [bold]kvpatch apply --tree {escape(report.tree)} --config {escape(str(output))}[/]")


# --------------------------------------------------------------------------- bench-decode


@app.command("bench-decode")
def bench_decode(
    lib: Annotated[list[str], typer.Option("--lib", help="NAME=PATH.so:PREFIX (repeatable; 'stock' required). Default: build stock+patched from --tree.")] = [],  # noqa: B006
    tree: TreeOpt = None,
    arch: ArchOpt = "9.0a",
    models: Annotated[Optional[str], typer.Option(help="llama-3.1-8b,llama-3.2-1b (default both).")] = None,
    dtypes: Annotated[Optional[str], typer.Option(help="bf16,fp16 (default both).")] = None,
    batches: Annotated[Optional[str], typer.Option(help="Default 1,4,16,64.")] = None,
    contexts: Annotated[Optional[str], typer.Option(help="Default 1024,4096,16384.")] = None,
    layers: Annotated[int, typer.Option(help="Decoder layers per step.")] = DECODE_LAYERS,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds (spread = min..max over them).")] = DECODE_ROUNDS,
    reps: Annotated[Optional[int], typer.Option(help="Timed replays per variant and round (default: ~0.15 s a round).")] = None,
    wpf: Annotated[Optional[str], typer.Option("--wpf", help="A whole prefetch configuration, e.g. 'cap=1:32,4:16;grid=132;hint=evict_normal'.")] = None,
    cap: Annotated[Optional[str], typer.Option(help="Weight-prefetch cap: per-batch MiB '1:32,4:32,8:16', one MiB value, 'off' or 'default'.")] = None,
    grid: Annotated[Optional[str], typer.Option(help="Prefetch CTAs, or 'auto' (one per MiB, 4..32).")] = None,
    threads: Annotated[Optional[int], typer.Option(help="Prefetch threads per CTA (multiple of 32).")] = None,
    chunk: Annotated[Optional[int], typer.Option(help="Bytes per bulk prefetch (multiple of 16).")] = None,
    hint: Annotated[Optional[str], typer.Option(help="evict_last, evict_normal, evict_first or none.")] = None,
    fork: Annotated[Optional[str], typer.Option(help="Fork the prefetch at 'attn' (before attention) or 'qkv' (before the QKV GEMM).")] = None,
    join: Annotated[Optional[str], typer.Option(help="Join once per 'step' or before each 'oproj'.")] = None,
    priority: Annotated[Optional[str], typer.Option(help="Side stream priority: high, normal or an int.")] = None,
    prefetch_lib: Annotated[Optional[Path], typer.Option("--prefetch-lib", help="A built prefetch library (default: build one).")] = None,
    cold: Annotated[bool, typer.Option("--cold", help="Flush L2 (read+write 3x L2) before every step.")] = False,
    micro: Annotated[bool, typer.Option("--micro", help="Also run the GEMM-after-idle micro-benchmark.")] = False,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the report here.")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write a PNG of the speedups here.")] = None,
) -> None:
    """GPU: a model-shaped decode step (CUDA graph): stock, patched, and both with the L2 weight prefetch."""
    from .prefetch.decode import bench_decode_cli

    def build(dtype_list, head_sizes):
        from . import api
        from .gpu.env import require_cuda

        require_cuda()
        result = api.build(tree=tree, cwd=_cwd(), archs=arch, console=err, dtypes=dtype_list, head_sizes=head_sizes,
                           block_sizes=[16], kv_cache_dtypes=["auto"])  # fmt: skip
        return api.load_libraries(result)

    _, text, code = bench_decode_cli(
        lib_args=lib, build=build, models=models, dtypes=dtypes, batches=batches, contexts=contexts, layers=layers,
        rounds=rounds, reps=reps, prefetch_lib=str(prefetch_lib) if prefetch_lib else None, cold=cold, micro=micro,
        json_path=str(json_out) if json_out else None, plot_path=str(plot) if plot else None,
        say=lambda m: err.print(m, highlight=False, soft_wrap=True), wpf=wpf, cap=cap, grid=grid, threads=threads,
        chunk=chunk, hint=hint, fork=fork, join=join, priority=priority,
    )  # fmt: skip
    out.print(text, markup=False, highlight=False, soft_wrap=True)
    if code:
        raise GpuCheckError("bench-decode: outputs differ from stock")


# --------------------------------------------------------------------------- the entry point


def _one_line(message: str, code: int) -> NoReturn:
    """Print ``error: message`` (user text escaped, never read as rich markup) and exit."""
    text = re.sub(r"[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+", " ", str(message)).strip() or "failed"
    err.print(f"[red]error:[/] {escape(text)}", highlight=False, soft_wrap=True)
    sys.exit(code)


def _os_error(e: OSError) -> str:
    """An OSError in one line: what failed, on which path, why."""
    why = e.strerror or str(e) or type(e).__name__
    where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    return f"{where}: {why}" if where else why


#: What Ctrl-C prints (exit 130, as a shell reports a SIGINT).
INTERRUPTED = "interrupted (Ctrl-C)"


def run() -> None:
    """Console-script entry point: one-line errors, exit codes from the error type.

    With ``standalone_mode=False`` Typer *returns* the exit code of an ``Exit`` (and
    turns a KeyboardInterrupt inside a command into ``Exit(130)``) instead of exiting,
    so the returned code is what this process must exit with.
    """
    import os

    for name in ("stdout", "stderr"):  # started with the stream closed (cmd >&-): write nowhere, do not crash
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115 - lives as long as the process
    try:
        code = app(standalone_mode=False)
    except KeyboardInterrupt:  # outside the command (typer converts one inside it)
        code = 130
    except KvpatchError as e:
        if _DEBUG["on"]:
            raise
        _one_line(str(e), e.exit_code)
    except typer.Abort:
        code = 130
    except typer.Exit as e:
        code = e.exit_code
    except OSError as e:  # the file system said no (permissions, read-only, disk full)
        if _DEBUG["on"]:
            raise
        _one_line(_os_error(e), 1)
    except Exception as e:
        # Usage errors come from the click that typer vendors: each has
        # format_message() and an exit_code (2 for usage errors). One line each,
        # except "no arguments", which shows the help.
        if type(e).__name__ == "NoArgsIsHelpError":
            e.show()
            sys.exit(e.exit_code)
        if callable(getattr(e, "format_message", None)) and isinstance(getattr(e, "exit_code", None), int):
            ctx = getattr(e, "ctx", None)
            hint = f" (see '{ctx.command_path if ctx is not None else 'kvpatch'} --help')"
            _one_line(e.format_message() + hint, e.exit_code)
        raise
    if code == 130:
        _one_line(INTERRUPTED, 130)
    sys.exit(code if isinstance(code, int) else 0)
