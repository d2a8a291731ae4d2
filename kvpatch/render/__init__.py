"""Every table and summary kvpatch prints, in one place; imported by the CLI alone.

Result types carry data only; these functions turn them into rich renderables
(:mod:`.patching`, :mod:`.build`, :mod:`.measure`) or plain text (:mod:`.decode`: the
decode step's report, also written to a file; :mod:`.plugin`; :mod:`.serving`). User text (paths, markers) is escaped,
never read as rich markup.
"""

from .build import build_table
from .decode import decode_text, micro_prefetch_table, micro_table, stage_table, sweep_text
from .measure import (
    bench_summary_table,
    bench_tables,
    fmt_speedup,
    print_bench,
    print_upstream,
    print_validate,
    tune_table,
    upstream_table,
    validate_summary,
)  # fmt: skip
from .patching import config_summary, sites_table
from .plugin import check_lines, enable_lines, status_lines
from .serving import serving_lines

__all__ = [
    "bench_summary_table", "bench_tables", "build_table", "check_lines", "config_summary", "decode_text", "enable_lines", "fmt_speedup",
    "micro_prefetch_table", "micro_table", "print_bench", "print_upstream", "print_validate", "sites_table",
    "serving_lines", "stage_table", "status_lines", "sweep_text", "tune_table", "upstream_table", "validate_summary",
]  # fmt: skip
