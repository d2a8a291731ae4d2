"""What ``kvpatch build`` prints: one row per kernel of every variant."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from ..jit.result import BuildResult


def build_table(result: BuildResult) -> Table:
    """One row per kernel of every variant; the caption names the compile flags."""
    table = Table(title=f"kvpatch build ({result.elapsed:.1f} s)")
    for name, justify in (("variant", "left"), ("arch", "left"), ("kernel", "left"), ("config", "left"),
                          ("regs", "right"), ("spill st/ld", "right"), ("stack", "right"),
                          ("UBLKPF", "center"), ("check", "center")):  # fmt: skip
        table.add_column(name, justify=justify)
    for v in result.variants:
        for k in v.kernels:
            table.add_row(
                escape(v.name), k.arch, k.kernel, k.config, str(k.registers), f"{k.spill_stores}/{k.spill_loads}",
                str(k.stack_bytes), "yes" if k.has_prefetch else "-", "[green]ok[/]" if k.ok else "[red]FAIL[/]",
            )  # fmt: skip
    if result.vllm_flags:
        table.caption = escape("vLLM's nvcc flags: " + " ".join(result.vllm_flags))
    return table
