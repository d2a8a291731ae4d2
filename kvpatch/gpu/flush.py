"""The one L2 flush every measurement uses (kernel bench, decode step, micro-benchmarks).

:class:`L2Flush` makes "cold" cold: it READS and WRITES a buffer of at least twice the L2
(``buf.add_(1)``), then READS it once more (a sum), so the L2 ends full of clean lines of
that buffer: what the timed kernel reads is gone from L2, and no dirty line is left to be
written back while it runs. A flush that only writes (``zero_()``, or ``add_`` alone) leaves
the L2 full of dirty lines, whose write-back the next kernel pays for: on an H200 the same
o_proj GEMM read 19.0 us after such a flush and 15.5 us after this one.

torch is imported inside the methods only.
"""

from __future__ import annotations

from typing import Any


class L2Flush:
    """Evict the L2 before a cold launch: read+write then read a buffer of >= 2x L2.

    ``nbytes`` defaults to 3x the L2 (at least 2x L2 + 1 MiB). The buffer is float32;
    its values only count up, so it never turns into a pattern the hardware could
    skip. Call the object to flush (asynchronously, on the current stream)."""

    def __init__(self, device: Any, l2_bytes: int, nbytes: int | None = None) -> None:
        import torch

        if nbytes is not None and nbytes < 2 * l2_bytes:
            raise ValueError(f"an L2 flush buffer must be >= 2x the L2 ({2 * l2_bytes} bytes), not {nbytes}")
        self.nbytes = int(nbytes or max(3 * l2_bytes, 2 * l2_bytes + 2**20))
        self.buf = torch.zeros(self.nbytes // 4, dtype=torch.float32, device=device)
        self.sink = torch.zeros((), dtype=torch.float32, device=device)

    def __call__(self) -> None:
        import torch

        self.buf.add_(1.0)  # read + write every line
        torch.sum(
            self.buf, dim=0, out=self.sink
        )  # read it again: the dirty lines are written back here, not in the kernel

    @property
    def method(self) -> str:
        return f"buf.add_(1) then sum(buf) over {self.nbytes} bytes (read+write, then read)"
