"""What the L2 weight-prefetch kernel (:mod:`kvpatch.prefetch.kernel`) prefetches, checked by
running its generated source on the host.

The kernel's code is compiled verbatim with g++: ``__CUDA_ARCH__`` is set (800: the per-line
prefetch of sm_80/89; 900: Hopper's bulk prefetch), the CUDA qualifiers are empty, ``asm`` is
defined away and ``volatile(...)`` records the ``address`` and ``bytes`` in scope. Every
thread of a small grid is run in turn over a table of rows, and the recorded prefetches must
cover each row's bytes exactly: every 128-byte line once (sm_80), every 16 bytes once with
no overlap (sm_90).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kvpatch.prefetch.kernel import PrefetchKernelSpec

CXX = shutil.which("g++") or shutil.which("c++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++) on PATH")

PREFETCH_HARNESS = r"""
#include <cstdint>
#include <cstdio>

struct Dim { unsigned x = 0, y = 1, z = 1; };
static Dim blockIdx, threadIdx, gridDim, blockDim;
// make_policy's asm sees these (no row); prefetch_unit's parameters shadow them
static const unsigned long long address = 0;
static const unsigned bytes = 0;
static void kvpatch_record(unsigned long long a, unsigned n) {
  if (a != 0) std::printf("%llu %u\n", a, n);
}
#define __CUDA_ARCH__ @ARCH@
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__
#define asm
#define volatile(...) (kvpatch_record(address, bytes))
@KERNEL@
#undef volatile
#undef asm

int main() {
  const long long table[] = {@ROWS@};
  const int rows = sizeof(table) / sizeof(table[0]) / 2;
  gridDim.x = @GRID@;
  blockDim.x = @THREADS@;
  for (unsigned b = 0; b < gridDim.x; ++b)
    for (unsigned t = 0; t < blockDim.x; ++t) {
      blockIdx.x = b;
      threadIdx.x = t;
      kvpatch_l2_prefetch_kernel(table, rows, @CHUNK@, 3);
    }
}
"""


def _prefetched(tmp_path: Path, arch: int, rows: list[tuple[int, int]], *, chunk: int = 256, grid: int = 3,
                threads: int = 32) -> list[tuple[int, int]]:  # fmt: skip
    """(address, bytes) of every prefetch the generated kernel issues, run on the host."""
    src = PrefetchKernelSpec().source()
    kernel = src[src.index("namespace {") : src.index("}  // namespace") + len("}  // namespace")]
    code = (PREFETCH_HARNESS.replace("@ARCH@", str(arch)).replace("@KERNEL@", kernel)
            .replace("@ROWS@", ", ".join(f"{a}LL, {n}LL" for a, n in rows))
            .replace("@GRID@", str(grid)).replace("@THREADS@", str(threads)).replace("@CHUNK@", str(chunk)))  # fmt: skip
    (tmp_path / "pf.cpp").write_text(code)
    subprocess.run([CXX, "-std=c++17", "-O0", "-o", str(tmp_path / "pf"), str(tmp_path / "pf.cpp")], check=True,
                   capture_output=True, text=True)  # fmt: skip
    out = subprocess.run([str(tmp_path / "pf")], check=True, capture_output=True, text=True).stdout
    return [tuple(map(int, line.split())) for line in out.splitlines()]  # type: ignore[misc]


# rows 16-byte aligned, at every offset within a 128-byte line, short and long
PREFETCH_ROWS = [(1 << 20 | 16, 256), (2 << 20 | 64, 4096), (3 << 20 | 112, 32), (4 << 20, 128), (5 << 20 | 48, 16),
                 (6 << 20 | 80, 100 * 16)]  # fmt: skip


def test_the_per_line_prefetch_covers_every_line_a_row_touches(tmp_path: Path) -> None:
    """sm_80/89: one prefetch per 128-byte line. Counted from the row's own address, a row
    that does not start on a line missed its last line (256 bytes at offset 16: 2 of 3)."""
    got = _prefetched(tmp_path, 800, PREFETCH_ROWS)
    lines = [a for a, _ in got]
    assert len(lines) == len(set(lines)), "a line prefetched twice"
    assert all(a % 128 == 0 for a in lines)
    want = sorted({line for a, n in PREFETCH_ROWS for line in range(a // 128 * 128, a + n, 128)})
    assert sorted(lines) == want


def test_the_bulk_prefetch_covers_every_row_exactly(tmp_path: Path) -> None:
    got = _prefetched(tmp_path, 900, PREFETCH_ROWS, chunk=256)
    covered = sorted(got)
    assert all(n % 16 == 0 and 0 < n <= 256 for _, n in covered)
    spans = sorted((a, a + n) for a, n in covered)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start, "two prefetches overlap"
    want = sorted(byte for a, n in PREFETCH_ROWS for byte in range(a, a + n, 16))
    assert sorted(byte for a, n in covered for byte in range(a, a + n, 16)) == want
