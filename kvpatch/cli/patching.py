"""The patching commands: apply, sites, diff, revert, config (options -> commands -> render)."""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from rich.markup import escape
from rich.syntax import Syntax

from ..commands.choices import SETTINGS, Setting
from ..commands.common import check_report_output, check_stdout
from ..errors import UsageError
from .base import (
    JsonOpt,
    TreeOpt,
    VllmOpt,
    app,
    cwd,
    emit_json,
    file_value,
    io,
    progress,
    shown,
    warn,
    whole_value,
    write_stdout,
)

_RULE_HELP = ("Settings for the instantiations a selector picks: 'bf16/80/32=off', 'fp16/64=issue=call' "
              "(dtype[/head[/block[/kv[/kernel]]]], kernel v1 or v2, * for any; the most specific rule decides a "
              "kernel; repeatable; SEL=none drops a default rule).")  # fmt: skip


# the configuration's options, shared by apply and config
def _config_path(value: Optional[str]) -> Optional[Path]:
    """``--config``'s value as a path; an empty one (an unset shell variable) is refused, not
    taken for the current directory."""
    if value is None:
        return None
    if not value.strip():
        raise UsageError("--config is empty: give the path of a kvpatch.toml")
    return file_value(value)


ConfigOpt = Annotated[
    Optional[str],
    typer.Option("--config", metavar="FILE", callback=_config_path, help="kvpatch.toml with any of the options below."),
]
PresetOpt = Annotated[
    Optional[str], typer.Option(metavar="default|paper", help="default, or paper (the paper's exact mechanism).")
]
Fp16Opt = Annotated[
    Optional[str],
    typer.Option(
        "--fp16",
        metavar="SETTINGS",
        help="Settings for the fp16 kernels no rule names: 'off' (the default), key=value,... (e.g. 'issue=inline,lookahead=2': turns them on), or 'none' (the base settings).",
    ),
]
Bf16Opt = Annotated[Optional[str], typer.Option("--bf16", metavar="SETTINGS", help="As --fp16, for bf16 kernels.")]
Fp32Opt = Annotated[Optional[str], typer.Option("--fp32", metavar="SETTINGS", help="As --fp16, for fp32 kernels.")]
RuleOpt = Annotated[Optional[list[str]], typer.Option("--rule", metavar="SELECTOR=SETTINGS", help=_RULE_HELP)]
UntunedOpt = Annotated[
    bool,
    typer.Option(
        "--untuned",
        help="Start from the base settings everywhere: no shipped table (every kernel prefetches, with your settings).",
    ),
]


#: Where ``apply`` and ``config`` take the settings: :func:`setting_options` puts one option per
#: setting of the table there, and gives the command their values as one dict.
SettingsOpt = Optional[dict[str, Any]]


def _setting_option(s: Setting) -> inspect.Parameter:
    """One setting's option: ``--min-group N``, or a switch ``--control/--no-control``; None when not given."""
    if s.kind == "bool":
        kind, option = Optional[bool], typer.Option(f"--{s.label}/--no-{s.label}", help=s.help)
    else:
        number = s.kind == "int" and not s.auto
        kind = Optional[int] if number else Optional[str]
        option = typer.Option(f"--{s.label}", metavar=s.shown_metavar, help=s.help,
                              **({"parser": whole_value} if number else {}))  # fmt: skip
    return inspect.Parameter(s.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                             annotation=Annotated[kind, option])  # fmt: skip


def setting_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with its parameter ``settings`` replaced by one option per setting of the table
    (kvpatch.config.model.SETTINGS, through kvpatch.commands.choices, in its order; hidden settings have none); the command is
    called with their values as ``settings={name: value or None}``."""
    visible = [s for s in SETTINGS if not s.hidden]
    names = [s.name for s in visible]
    signature = inspect.signature(command, eval_str=True)
    params = list(signature.parameters.values())
    taken = set(names) & {p.name for p in params}
    if taken:
        raise TypeError(f"{command.__name__}: a parameter has a setting's name: {', '.join(sorted(taken))}")
    at = [p.name for p in params].index("settings")
    params[at : at + 1] = [_setting_option(s) for s in visible]

    @functools.wraps(command)
    def with_settings(**kwargs: Any) -> None:
        settings = {n: kwargs.pop(n, None) for n in names}
        return command(**kwargs, settings=settings)

    with_settings.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    with_settings.__annotations__ = {p.name: p.annotation for p in params}
    return with_settings


@app.command()
@setting_options
def apply(
    vllm: VllmOpt = None,
    tree: TreeOpt = None,
    config: ConfigOpt = None,
    preset: PresetOpt = None,
    settings: SettingsOpt = None,
    fp16: Fp16Opt = None,
    bf16: Bf16Opt = None,
    fp32: Fp32Opt = None,
    rule: RuleOpt = None,
    remote: Annotated[str, typer.Option(metavar="URL", help="git remote to fetch releases from.")] = "",
    untuned: UntunedOpt = False,
    force: Annotated[bool, typer.Option("--force", help="Patch even if the header has local edits.")] = False,
    force_write: Annotated[
        bool, typer.Option("--force-write", help="Replace the header even if it is read-only (its mode is kept).")
    ] = False,
    json_out: JsonOpt = None,
) -> None:
    """Fetch a vLLM release (or use --tree), locate the key/value loop sites, inject the prefetch."""
    from ..commands import apply as A
    from ..render import config_summary, sites_table

    opts = A.ApplyOptions(vllm=vllm, tree=tree, cwd=cwd(), config=config, preset=preset, settings=settings or {},
                          dtypes={"fp16": fp16, "bf16": bf16, "fp32": fp32}, rules=rule or [], untuned=untuned,
                          remote=remote or None, force=force, force_write=force_write)  # fmt: skip
    check_report_output(json_out, opts.cwd, tree=tree, inputs={"--config": config})
    check_stdout(opts.cwd, tree=tree, inputs={"--config": config})
    with progress() as p:
        report = A.run(opts, progress=p)
    for line in report.machine_differences:
        warn(f"tuned on another machine: {line} (re-run kvpatch tune here)")
    if emit_json(json_out, report.to_json()):
        return
    out = io.out
    header = shown(report.tree.header)
    if not report.changed:
        out.print(f"[green]already applied[/]: {header}", highlight=False)
    else:
        out.print(f"[green]{'replaced' if report.previous else 'patched'}[/] {header}", highlight=False)
    out.print(sites_table(report.sites, {s.kind: "yes" for s in report.sites
                                          if (s.kind == "key" and report.config.k) or (s.kind == "value" and report.config.v)}))  # fmt: skip
    out.print(escape(config_summary(report.config)), highlight=False)
    if report.tuned_on is not None:
        out.print(f"tuned on: {shown(report.tuned_on.describe())}", highlight=False)
    out.print("next: kvpatch diff  |  kvpatch build --arch 9.0a  |  kvpatch revert", highlight=False)


#: What a header without kvpatch's regions is, by ``stock_status``: stock only where that was checked.
NO_REGIONS = {
    "stock": "is stock",
    "edited": "carries none of kvpatch's regions, but has edits kvpatch did not make",
    "unknown": "carries none of kvpatch's regions (whether it is the release's could not be checked)",
}


@app.command()
def sites(vllm: VllmOpt = None, tree: TreeOpt = None, json_out: JsonOpt = None) -> None:
    """Show where the key and value loop sites are (no changes made)."""
    from ..commands import sites as S
    from ..render import sites_table

    check_report_output(json_out, cwd(), tree=tree)
    check_stdout(cwd(), tree=tree)
    with progress() as p:
        report = S.run(S.SitesOptions(vllm=vllm, tree=tree, cwd=cwd()), progress=p)
    if emit_json(json_out, report.to_json()):
        return
    found = report.sites
    io.out.print(f"{shown(report.header)}: paged_attention_kernel at line {found.function_line}", highlight=False)
    io.out.print(sites_table(found, report.injected))
    if report.injected and not report.intact:
        warn(f"kvpatch's regions ({', '.join(dict.fromkeys(report.changed))}) were changed after kvpatch wrote them")


@app.command()
def diff(
    tree: TreeOpt = None,
    output: Annotated[
        Optional[Path],
        typer.Option(
            "--output", "-o", metavar="FILE", help="Write the patch to FILE ('-': stdout).", parser=file_value
        ),
    ] = None,
) -> None:
    """Print what apply changed as a unified diff (a patch git apply / patch -p1 accept)."""
    from ..commands import diff as D
    from ..fsutil import write_atomic

    if output is not None:
        D.check_output(output, tree, cwd())  # before the diff: not a file kvpatch keeps, writable
    check_stdout(cwd(), tree=tree)
    with progress() as p:
        report = D.run(D.DiffOptions(tree=tree, cwd=cwd()), progress=p)
    for line in report.warnings:
        warn(line)
    text = report.text
    if output is not None and str(output) == "-":
        write_stdout(text)
        return
    if output is not None:
        write_atomic(output, text)
        where = shown(output)
        io.err.print(
            f"wrote {where}" if text else f"wrote {where} (empty: the header {NO_REGIONS[report.stock]})",
            highlight=False,
        )
        return
    if not text:
        io.err.print(f"no changes: the header {NO_REGIONS[report.stock]}", highlight=False)
        return
    if io.out.is_terminal:
        io.out.print(Syntax(text, "diff", theme="ansi_dark", background_color="default"))
    else:
        write_stdout(text)


@app.command()
def revert(
    tree: TreeOpt = None,
    force: Annotated[
        bool, typer.Option("--force", help="Revert even if kvpatch's regions were edited (the edits are lost).")
    ] = False,
    force_write: Annotated[
        bool, typer.Option("--force-write", help="Replace the header even if it is read-only (its mode is kept).")
    ] = False,
) -> None:
    """Remove kvpatch's injection: the header is stock again, byte for byte."""
    from ..commands import revert as R

    check_stdout(cwd(), tree=tree)
    with progress() as p:
        report = R.run(R.RevertOptions(tree=tree, cwd=cwd(), force=force, force_write=force_write), progress=p)
    where = shown(report.header)
    io.out.print(
        f"[green]reverted[/] {where}" if report.changed else f"nothing to revert: {where} {NO_REGIONS[report.stock]}",
        highlight=False,
    )
    if report.changed and report.stock == "edited":
        warn(f"{where} has edits kvpatch did not make: without kvpatch's regions it is not the release's header")


@app.command("config")
@setting_options
def show_config(
    config: ConfigOpt = None,
    preset: PresetOpt = None,
    settings: SettingsOpt = None,
    fp16: Fp16Opt = None,
    bf16: Bf16Opt = None,
    fp32: Fp32Opt = None,
    rule: RuleOpt = None,
    untuned: UntunedOpt = False,
) -> None:
    """Print the effective configuration as a complete kvpatch.toml, each setting with where it came from (the command line, the config file, the shipped table or the default) and where its rules were tuned."""
    from ..commands import configuration as C

    opts = C.ConfigOptions(config=config, preset=preset, settings=settings or {},
                           dtypes={"fp16": fp16, "bf16": bf16, "fp32": fp32}, rules=rule or [], untuned=untuned)  # fmt: skip
    check_stdout(cwd(), inputs={"--config": config})
    with progress() as p:
        report = C.run(opts, progress=p)
    write_stdout(report.toml)
