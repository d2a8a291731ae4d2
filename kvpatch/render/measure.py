"""What the measuring commands print: bench, validate, vLLM's test, tune."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import printable

if TYPE_CHECKING:
    from ..gpu.bench_report import BenchReport
    from ..gpu.report import ValidateReport
    from ..gpu.upstream import UpstreamReport
    from ..tune.report import TuneReport


def fmt_speedup(x: float, match: bool | None = None, verdict: str | None = None) -> str:
    """A speedup, coloured by its verdict (interval above / below 1.00: kvpatch.gpu.stats'
    one rule), ``!`` if the bits differ; no verdict, no colour."""
    from ..gpu.stats import FASTER, SLOWER

    s = f"{x:.2f}"
    if match is False:
        return f"[red]{s}![/red]"
    if verdict == FASTER:
        return f"[green]{s}[/green]"
    if verdict == SLOWER:
        return f"[red]{s}[/red]"
    return s


def bench_tables(report: BenchReport) -> list[Table]:
    """Per point/kernel (stock us and per-variant speedups with their interval, warm and
    cold) and the summary over the dispatched kernels, with the noise counts."""
    modes = list(dict.fromkeys(r.mode for r in report.results))
    others = report.variants[1:]
    by_key: dict[tuple[Any, str], dict[str, Any]] = {}
    for r in report.results:
        by_key.setdefault((r.point, r.kernel), {})[r.mode] = r
    bw = report.copy_bandwidth.get("bytes_per_s", 0) / 1e12
    t = Table(
        title=f"{escape(report.point_set)} set: speedup over {escape(report.baseline)} (x) [min..max over rounds]; "
        f"k* = the kernel vLLM dispatches; ~ = a power-capped/throttled round; copy BW {bw:.2f} TB/s"
        + (
            "; ctx@N = launches sized for N tokens"
            if any(r.point.capture > r.point.context for r in report.results)
            else ""
        ),  # fmt: skip
        title_justify="left",
    )
    for col in ("point", "B", "ctx", "k"):
        t.add_column(col, justify="right" if col in ("B", "ctx") else "left")
    for m in modes:
        t.add_column(escape(f"{report.baseline}\n{m} us"), justify="right")
        for n in others:
            t.add_column(escape(f"{n}\n{m}"), justify="right")
    t.add_column("KV\nTB/s", justify="right")
    for (point, kernel), per_mode in by_key.items():
        disp = "*" if kernel == point.dispatched else ""
        ctx = _tokens(point.context) + (f"@{_tokens(point.capture)}" if point.capture > point.context else "")
        row = [f"{point.dtype} {point.shape}", str(point.batch), ctx, kernel + disp]
        best = 0.0
        for m in modes:
            r = per_mode.get(m)
            if r is None:
                row += ["-"] * (1 + len(others))
                continue
            base = r.variants[report.baseline]
            flag = "~" if r.flagged else ""
            row.append((f"{base.median_us:.1f}" if base.median_us < 100 else f"{base.median_us:.0f}") + flag)
            for n in others:
                v = r.variants.get(n)
                row.append(
                    f"{fmt_speedup(v.speedup, v.outputs_match, v.verdict)} [dim][{v.speedup_lo:.2f}..{v.speedup_hi:.2f}][/dim]"
                    if v
                    else "-"
                )
            best = max([best] + [v.kv_bytes_per_s for v in r.variants.values()])
        row.append(f"{best / 1e12:.2f}")
        t.add_row(*row)
    return [t, bench_summary_table(report)]


def bench_summary_table(report: BenchReport) -> Table:
    s = Table(title=f"{escape(report.point_set)} set, the dispatched kernel: speedup min / median / geomean; points "
              "faster / within noise / slower (interval vs 1.00; '(k stock code)': k of them run a kernel the "
              "variant compiles exactly as stock, i.e. the bench's noise floor)", title_justify="left")  # fmt: skip
    for col in ("variant", "dtype", "mode", "n", "min", "median", "geomean", "faster", "noise", "slower", "flagged"):
        s.add_column(col, justify="left" if col in ("variant", "dtype", "mode") else "right")
    for row in report.summary:
        if row["scope"] != "dispatched":
            continue
        s.add_row(escape(row["variant"]), row["dtype"], row["mode"], str(row["n"]), f"{row['min']:.2f}",
                  fmt_speedup(row["median"]), f"{row['geomean']:.2f}", str(row["faster"]), str(row["noise"]),
                  _slower_cell(row), str(row["flagged"]))  # fmt: skip
    return s


def _slower_cell(row: dict) -> str:
    if not row["slower"]:
        return "0"
    k = row.get("slower_stock_code")
    return f"[red]{row['slower']}[/red]" + (f" ({k} stock code)" if k else "")


def print_bench(report: BenchReport, console: Console) -> None:
    for tab in bench_tables(report):
        console.print(tab)
    for m in report.mismatches:
        console.print(f"[red]MISMATCH[/red] {escape(m)}")
    for p in report.skipped_points:
        console.print(f"[yellow]skipped[/yellow] {escape(p)}")
    for w in report.warnings:
        console.print(f"[yellow]warning[/yellow] {escape(w)}")
    if report.flagged_rounds:
        console.print(f"[yellow]{report.flagged_rounds} of {len(report.rounds)} rounds ran power-capped or "
                      "throttled[/yellow] (see rounds[].smi in the JSON)")  # fmt: skip
    console.print(f"bench took {report.seconds:.0f} s")


def validate_summary(report: ValidateReport) -> str:
    worst = ", ".join(f"{k} {v:.1e}" for k, v in sorted(report.max_ref_error().items()))
    grouped = report.grouped_counts()
    ident = "; ".join(
        f"{n}: {c['identical']}/{c['checked']} bit-identical"
        + (f" ({grouped[n]['grouped']} by the grouped form)" if n in grouped else "")
        for n, c in report.identical_counts().items()
    )
    return (f"{len(report.results)} configurations ({report.matrix}) x {len(report.variants) - 1} variant(s): "
            f"{report.n_passed} passed, {report.n_failed} failed, {len(report.skipped)} skipped"
            + (f"; {ident}" if ident else "") + (f"; stock vs float64 reference (rel-L2): {worst}" if worst else ""))  # fmt: skip


def print_validate(report: ValidateReport, console: Console, err: Console, *, limit: int = 20) -> None:
    console.print(escape(validate_summary(report)), highlight=False, soft_wrap=True)
    groups = report.mismatch_groups()
    if groups:
        t = Table(title="mismatching configurations by variant / dtype / ALiBi / head / block", title_justify="left")
        t.add_column("where")
        t.add_column("configurations", justify="right")
        for k, v in sorted(groups.items()):
            t.add_row(escape(k), str(v))
        console.print(t)
    for line in report.failures[:limit]:
        err.print(f"[red]mismatch[/] {escape(line)}", highlight=False, soft_wrap=True)
    if report.strict:
        for line in report.skipped[:limit]:
            err.print(f"[yellow]skipped[/] {escape(line)}", highlight=False)
    if report.ok:
        console.print("[green]bit-identical to stock everywhere checked[/]")


def upstream_table(report: UpstreamReport) -> Table:
    share = f", shard {report.shard}: {report.selected} of its {report.collected} cases" if report.shard else ""
    t = Table(title=f"vLLM {escape(report.release)}'s own test {escape(report.test_id)} (unchanged{share}) per library",
              title_justify="left")  # fmt: skip
    for col in (
        "library",
        "passed",
        "failed",
        "skipped",
        "errors",
        "outputs",
        escape(f"== {report.baseline} bit for bit"),
    ):
        t.add_column(col, justify="left" if col == "library" else "right")
    for run in report.runs:
        same = report.identical.get(run.name)
        cell = "-" if same is None else f"{same['identical']}/{same['compared']}"
        if same is not None and same["identical"] != same["compared"]:
            cell = f"[red]{cell}[/red]"
        name = escape(run.name) + (" [red](cut at the time limit)[/red]" if run.cut else "")
        t.add_row(name, str(run.passed), f"[red]{run.failed}[/red]" if run.failed else "0", str(run.skipped),
                  str(run.errors), str(run.outputs), cell)  # fmt: skip
    return t


def print_upstream(report: UpstreamReport, console: Console, *, limit: int = 20) -> None:
    console.print(upstream_table(report))
    for name, ids in report.differing.items():
        for i in ids[:limit]:
            console.print(f"[red]differs[/] {escape(name)}: {escape(i)}", highlight=False)
    for line in report.notes:
        console.print(f"note: {escape(line)}", highlight=False)


def tune_table(report: TuneReport, top: int = 3) -> Table:
    """Per tuned instantiation: what was picked, and the best candidates (dispatched kernel, warm + cold);
    'slower' counts the points where a candidate ran its own code, '(+k stock code)' those where it ran
    stock's (the noise floor, not held against it); with an incumbent, it is shown too, and each
    candidate against it ('(+k same code)': slower points where both ran the same code, not held
    against it either)."""

    def text(name: object) -> str:  # a name from a saved JSON: its control characters as escapes
        return escape(printable(str(name)))

    against = f", against {report.incumbent}" if report.incumbent else ""
    table = Table(title=f"kvpatch tune (policy {report.policy}{text(against)}): per instantiation, the pick and "
                  "the best candidates")  # fmt: skip
    cols = ["instantiation", "picked", "candidate", "bit-identical", "slower", "worst", "geomean [interval]"]
    for col in cols + ([f"over {report.incumbent}: slower, geomean [interval]"] if report.incumbent else []):
        table.add_column(text(col))
    for inst, pick in report.picks.items():
        held = [s for s in pick.ranked if s.name == report.incumbent]
        for i, s in enumerate(pick.ranked[:top] + tuple(h for h in held if h not in pick.ranked[:top])):
            lo, hi = s.geomean_interval
            row = [text(inst) if i == 0 else "", text(pick.name) if i == 0 else "", text(s.name),
                   ("NO" if not s.bit_identical else "yes, excluded" if s.excluded else "yes"),
                   f"{s.slower}" + (f" (+{s.slower_stock_code} stock code)" if s.slower_stock_code else ""),
                   f"{s.worst:.3f}", f"{s.geomean:.3f} [{lo:.3f}..{hi:.3f}]"]  # fmt: skip
            if report.incumbent:
                v = report.versus_incumbent(inst, s)
                same = f" (+{v.slower_same_code} same code)" if v is not None and v.slower_same_code else ""
                row.append("-" if v is None else f"{v.slower}{same}, {v.geomean:.3f} [{v.geomean_interval[0]:.3f}.."
                           f"{v.geomean_interval[1]:.3f}]")  # fmt: skip
            table.add_row(*row)
    return table


def _tokens(n: int) -> str:
    """``8192`` -> ``'8k'``; ``1500`` -> ``'1500'``."""
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)
