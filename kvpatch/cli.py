"""The ``kvpatch`` command: each command parses options, calls the library, renders.

Exit codes: 0 success; 1 other failure; 2 invalid parameters or configuration;
3 a release could not be fetched (unknown, unsupported, no network); 4 the source
cannot be patched (sites not found, local edits, failed re-parse); 5 build or
check failure, or a missing tool; 6 a GPU check failed (bit mismatch).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from . import __version__
from .config import PatchConfig, dump_config, load_config_file, make_config
from .errors import KvpatchError, UsageError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Patch vLLM's PagedAttention decode kernel with an L2 bulk prefetch of the next KV block.",
    epilog="Exit codes: 0 ok, 2 bad parameters, 3 fetch failed, 4 cannot patch, "
    "5 build/tool failure, 6 GPU check failed, 1 other.",
)
out = Console()
err = Console(stderr=True)
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


def config_from_options(config_file: Optional[Path], **options) -> PatchConfig:
    """A config file's values, overridden by options given on the command line."""
    values = load_config_file(config_file) if config_file else {}
    values.update({k: v for k, v in options.items() if v is not None})
    return make_config(**values)


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
    scope: Annotated[Optional[str], typer.Option(help="cta (every CTA prefetches) | kv-head (one CTA per KV head under GQA).")] = None,
    control: Annotated[Optional[bool], typer.Option("--control/--no-control", help="Compile the prefetch but never run it (for measurements).")] = None,
    remote: Annotated[str, typer.Option(help="git remote to fetch releases from.")] = "",
    force: Annotated[bool, typer.Option(help="Patch even if the header has local edits.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Fetch a vLLM release (or use --tree), locate the key/value loop sites, inject the prefetch."""
    from . import api

    cfg = config_from_options(
        config, preset=preset, lookahead=lookahead, size=size, align=align, caches=caches,
        cache_hint=cache_hint, placement=placement, scope=scope, control=control,
    )  # fmt: skip
    report = api.apply(vllm=vllm, tree=tree, cfg=cfg, cwd=_cwd(), remote=remote or None,
                       force=force, console=err)  # fmt: skip
    if as_json:
        out.print_json(json.dumps(report.to_json()))
        return
    if not report.changed:
        out.print(f"[green]already applied[/] ({cfg.marker()}): {report.tree.header}")
    else:
        verb = "replaced" if report.previous else "patched"
        out.print(f"[green]{verb}[/] {report.tree.header}")
        if report.previous:
            out.print(f"  previous: {'; '.join(report.previous)}")
    out.print(_sites_table(report.sites, cfg))
    out.print(f"config: {cfg.marker()}")
    out.print("next: [bold]kvpatch diff[/]  |  [bold]kvpatch build --arch 9.0a[/]  |  [bold]kvpatch revert[/]")


def _sites_table(sites, cfg: PatchConfig | None = None) -> Table:
    table = Table(title="KV loop sites")
    for col in ("site", "loop", "block number", "steps", "tile", "patched"):
        table.add_column(col, overflow="fold")
    for s in sites:
        patched = "-"
        if cfg is not None:
            patched = "yes" if (s.kind == "key" and cfg.k) or (s.kind == "value" and cfg.v) else "no"
        table.add_row(
            s.kind,
            f"line {s.line}",
            f"line {s.block_number_line}",
            f"{s.loop_var} += {s.stride}",
            f"{s.cache}[{s.block_table}[...]]",
            patched,
        )
    return table


# --------------------------------------------------------------------------- sites


@app.command()
def sites(vllm: VllmOpt = None, tree: TreeOpt = None, as_json: JsonOpt = False) -> None:
    """Show where the key and value loop sites are (no changes made)."""
    from . import api

    found, header = api.sites(vllm=vllm, tree=tree, cwd=_cwd(), console=err)
    if as_json:
        out.print_json(json.dumps({"header": str(header), **asdict(found)}))
        return
    out.print(f"{header}: {found.key.cache.split('_')[0]}/{found.value.cache.split('_')[0]} "
              f"sites in paged_attention_kernel (line {found.function_line})")  # fmt: skip
    out.print(_sites_table(found))


# --------------------------------------------------------------------------- diff / revert


@app.command()
def diff(
    tree: TreeOpt = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the patch to this file.")] = None,
) -> None:
    """Print what apply changed as a unified diff (a patch git apply / patch -p1 accept)."""
    from . import api
    from .workspace import write_atomic

    text = api.diff(tree=tree, cwd=_cwd())
    if output is not None:
        write_atomic(output, text)
        err.print(f"wrote {output}" if text else f"wrote {output} (empty: the tree is stock)")
        return
    if not text:
        err.print("no changes: the header is stock")
        return
    if out.is_terminal:
        out.print(Syntax(text, "diff", theme="ansi_dark", background_color="default"))
    else:
        sys.stdout.write(text)


@app.command()
def revert(tree: TreeOpt = None) -> None:
    """Remove kvpatch's injection: the header is stock again, byte for byte."""
    from . import api

    header, changed = api.revert(tree=tree, cwd=_cwd())
    out.print(f"[green]reverted[/] {header}" if changed else f"nothing to revert: {header} is stock")


@app.command("config")
def show_config(
    config: Annotated[Optional[Path], typer.Option("--config", help="kvpatch.toml to read.")] = None,
    preset: Annotated[Optional[str], typer.Option(help="default | paper.")] = None,
) -> None:
    """Print the effective configuration as kvpatch.toml text."""
    sys.stdout.write(dump_config(config_from_options(config, preset=preset)))


def run() -> None:
    """Console-script entry point: one-line errors, exit codes from the error type."""
    try:
        app(standalone_mode=False)
    except KvpatchError as e:
        if _DEBUG["on"]:
            raise
        err.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except typer.Abort:
        err.print("aborted")
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:
        # Usage errors come from the click that typer uses (vendored in newer typer):
        # each has show() and an exit_code (2 for usage errors).
        if callable(getattr(e, "show", None)) and isinstance(getattr(e, "exit_code", None), int):
            e.show()
            sys.exit(e.exit_code)
        raise
