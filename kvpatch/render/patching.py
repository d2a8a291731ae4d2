"""What the patching commands print: the sites, the configuration in short."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from ..config import PatchConfig


def sites_table(sites, injected: dict[str, str]) -> Table:
    """The sites, and at each whether kvpatch injected code there (80 columns: the
    configuration's whole marker is ``--json``'s and ``kvpatch config``'s)."""
    table = Table(title="KV loop sites")
    for col in ("site", "loop", "block number", "steps", "tile", "injected"):
        table.add_column(col, overflow="fold")
    for s in sites:
        table.add_row(
            s.kind,
            f"line {s.line}",
            f"line {s.block_number_line}",
            escape(f"{s.loop_var} += {s.stride_expr}"),
            escape(f"{s.cache_param}[...]"),
            "yes" if s.kind in injected else "no",
        )
    return table


def config_summary(cfg: PatchConfig) -> str:
    """The configuration in one short line: the preset, or how many of the kernels vLLM
    builds prefetch, and the command that prints all of it."""
    if cfg.preset == "paper":
        return "config: the paper's patch (preset paper); 'kvpatch config --preset paper' prints it"
    kernels = cfg.kernel_variants()
    on = sum(1 for _, _, c in kernels if not c.off)
    rules = len(cfg.overrides)
    dims = [sorted({k[i] for (k, _, _) in kernels}, key=str) for i in range(5)]
    what = (f"{'/'.join(map(str, dims[0]))} x {len(dims[1])} head sizes x {len(dims[2])} block sizes x "
            f"{'/'.join(dims[4])}, {'/'.join(dims[3])} cache")  # fmt: skip
    return (
        f"config: {on} of the {len(kernels)} kernels vLLM builds ({what}) prefetch, by {rules} rules; "
        "'kvpatch config' prints all of it (with --config FILE for yours)"
    )
