"""What ``kvpatch build`` prints: one row per kernel of every variant."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from ..jit.result import BuildResult


#: What the per-variant table's counts count.
COUNTS = ("kernels: per arch, v1 and v2 of each configuration and v2's reduce kernel per dtype and head size; "
          "configurations: dtype x KV-cache dtype x head size x block size; prefetching: kernels whose SASS "
          "holds UBLKPF; grouped: kernels of the grouped form (--group), checked like the others")  # fmt: skip
#: Above this many kernels a build is shown per variant (plus every kernel that failed its
#: check); ``--json`` always holds every kernel.
MAX_KERNEL_ROWS = 60


def build_table(result: BuildResult) -> Table:
    """One row per kernel of every variant (per variant for a large build); the caption names
    the compile flags."""
    if sum(len(v.kernels) + len(v.grouped) for v in result.variants) > MAX_KERNEL_ROWS:
        return _variant_table(result)
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
        for g in v.grouped:  # the grouped form (--group): its own kernels beside vLLM's
            table.add_row(
                escape(v.name), g.arch, f"grouped {g.kernel} x{g.heads}{g.bounds}{g.where}{g.ahead}", f"{g.dtype}/auto/{g.head_size}/{g.block_size}",
                str(g.registers), f"{g.spill_stores}/{g.spill_loads}", "-", "yes" if g.has_prefetch else "-",
                "[green]ok[/]" if g.ok else "[red]FAIL[/]",
            )  # fmt: skip
    if result.vllm_flags:
        table.caption = escape("vLLM's nvcc flags: " + " ".join(result.vllm_flags))
    return table


def _span(xs: list[int]) -> str:
    return "-" if not xs else str(xs[0]) if min(xs) == max(xs) else f"{min(xs)}-{max(xs)}"


def _variant_table(result: BuildResult) -> Table:
    table = Table(title=f"kvpatch build ({result.elapsed:.1f} s): per variant; every kernel is in --json")
    for name, justify in (("variant", "left"), ("archs", "left"), ("kernels", "right"), ("configurations", "right"),
                          ("prefetching (UBLKPF)", "right"), ("regs", "right"), ("spilling", "right"),
                          ("grouped", "right"), ("check", "center")):  # fmt: skip
        table.add_column(name, justify=justify)
    failed = []
    for v in result.variants:
        ks = v.kernels
        bad = [k for k in ks if not k.ok] + [g for g in v.grouped if not g.ok]
        failed += [(v.name, k) for k in bad]
        configs = {(k.dtype, k.kv_cache_dtype, k.head_size, k.block_size) for k in ks if k.block_size}
        table.add_row(
            escape(v.name), ", ".join(sorted({k.arch for k in ks})), str(len(ks)), str(len(configs)),
            str(sum(k.has_prefetch for k in ks)), _span(sorted(k.registers for k in ks)),
            str(sum(1 for k in ks + v.grouped if k.spill_stores or k.spill_loads)), str(len(v.grouped)),
            "[green]ok[/]" if not bad else f"[red]{len(bad)} FAIL[/]",
        )  # fmt: skip
    for name, k in failed:
        what = k.label.removesuffix(f" {k.arch}")
        table.add_row(escape(name), k.arch, what, "", "yes" if k.has_prefetch else "-",
                      str(k.registers), f"{k.spill_stores}/{k.spill_loads}", "", "[red]FAIL[/]")  # fmt: skip
    table.caption = escape(
        COUNTS + ("\nvLLM's nvcc flags: " + " ".join(result.vllm_flags) if result.vllm_flags else "")
    )
    return table
