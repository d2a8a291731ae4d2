"""Byte ranges of weights, for the L2 prefetch kernel's (address, bytes) table.

Pure arithmetic over ``data_ptr()``, ``shape``, ``stride()`` and ``element_size()``:
it works on CPU tensors (the tests use them) and imports no torch.

A view's *span* is the storage it touches, from its first element to its last:
``data_ptr()`` already includes the storage offset, and the last element sits
``sum((size - 1) * stride)`` elements further on (torch has no negative strides). A
transposed view spans the same bytes as its base; a column slice ``w[:, :k]`` spans
from its first row's start to its last row's ``k``-th element (the bytes between the
rows' slices are prefetched too: one range per tensor, not one per row); a step
slice ``w[::2]`` spans from its first to its last row.

Ranges are 16-byte aligned for the bulk prefetch (start rounded down, end rounded
up). Both stay inside the allocation in practice: CUDA allocations start 256-byte
aligned and torch's caching allocator rounds blocks to 512 bytes, so the at most 15
extra bytes at either end belong to the same block.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from ..abi import exact_int
from ..errors import ArgumentError

#: Every range starts and ends on a multiple of this (``cp.async.bulk`` needs 16).
ALIGN = 16


def _align_down(x: int) -> int:
    return x - x % ALIGN


def _align_up(x: int) -> int:
    return -(-x // ALIGN) * ALIGN


def tensor_span(t: Any) -> tuple[int, int] | None:
    """``(start, end)`` byte addresses of the storage ``t`` touches (end exclusive),
    unaligned; ``None`` for an empty tensor."""
    shape = tuple(int(n) for n in t.shape)
    if any(n == 0 for n in shape):
        return None
    strides = tuple(int(s) for s in t.stride())
    if any(s < 0 for s in strides):  # not in torch; guard other array types
        raise ArgumentError(f"negative strides are not supported: {strides}")
    last = sum((n - 1) * s for n, s in zip(shape, strides))
    start = int(t.data_ptr())
    return start, start + (last + 1) * int(t.element_size())


def _device_of(t: Any) -> str:
    return str(getattr(t, "device", "cpu"))


def _subtract(span: tuple[int, int], covered: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``span`` outside the (sorted, disjoint) ``covered`` intervals."""
    pieces, (lo, hi) = [], span
    for c_lo, c_hi in covered:
        if c_hi <= lo or c_lo >= hi:
            continue
        if c_lo > lo:
            pieces.append((lo, c_lo))
        lo = max(lo, c_hi)
        if lo >= hi:
            break
    if lo < hi:
        pieces.append((lo, hi))
    return pieces


def _cover(covered: list[tuple[int, int]], span: tuple[int, int]) -> list[tuple[int, int]]:
    """``covered`` with ``span`` added, kept sorted and coalesced."""
    out: list[tuple[int, int]] = []
    lo, hi = span
    for c_lo, c_hi in sorted(covered):
        if c_hi < lo or c_lo > hi:
            out.append((c_lo, c_hi))
        else:
            lo, hi = min(lo, c_lo), max(hi, c_hi)
    out.append((lo, hi))
    return sorted(out)


def count(value: Any, what: str, *, minimum: int) -> int:
    """An int (a numpy or torch integer too; no bool, float or string) >= ``minimum``
    (ValueError otherwise): batch sizes and byte counts are never rounded here."""
    n = exact_int(value)
    if n is None:
        raise ArgumentError(f"{what} must be an int, not {value!r}")
    if n < minimum:
        raise ArgumentError(f"{what} must be {'positive' if minimum == 1 else f'>= {minimum}'}, not {n}")
    return n


def flag(value: Any, what: str) -> bool:
    """True or False itself (ValueError otherwise: ``merge="no"`` would read as true)."""
    if not isinstance(value, bool):
        raise ArgumentError(f"{what} must be True or False, not {value!r}")
    return value


def tensor_list(tensors: Iterable[Any], what: str) -> list[Any]:
    """``tensors`` as a list, each one a tensor (ValueError otherwise; ``what`` starts the
    message). A tensor itself is refused: iterating it walks its rows, surely not what was meant."""
    if hasattr(tensors, "data_ptr"):
        raise ArgumentError(f"{what}: pass a list of tensors, not a tensor (wrap it: [w])")
    if isinstance(tensors, (str, bytes)) or not isinstance(tensors, Iterable):
        hint = " (a module's: list(module.parameters()))" if hasattr(tensors, "parameters") else ""
        raise ArgumentError(f"{what}: pass a list of tensors{hint}, not {type(tensors).__name__}")
    out = list(tensors)
    odd = sorted({type(t).__name__ for t in out if not hasattr(t, "data_ptr")})
    if odd:
        raise ArgumentError(f"{what}: expected tensors, got {', '.join(odd)}")
    spread = [
        t
        for t in out
        if str(getattr(t, "layout", "torch.strided")) != "torch.strided" or getattr(t, "is_nested", False)
    ]
    if spread:
        raise ArgumentError(
            f"{what}: a sparse or nested tensor ({spread[0].layout}) is no one span of memory to prefetch"
        )
    if any(_device_of(t) == "meta" for t in out):
        raise ArgumentError(f"{what}: a meta tensor has no memory to prefetch (load the weights first)")
    return out


def weight_ranges(
    tensors: Iterable[Any], cap_bytes: int | None = None, *, merge: bool = False
) -> list[tuple[int, int]]:
    """``(address, bytes)`` of each tensor's span, in the order given.

    * Each span is 16-byte aligned: start rounded down, end rounded up.
    * Empty tensors are skipped.
    * ``cap_bytes`` (``None``: no cap) limits the total: it is rounded down to a
      multiple of 16, and the range that crosses it is cut there; later tensors get
      nothing. Order the tensors as the kernels read them so the cap keeps the first
      bytes needed.
    * ``merge=True``: a byte is listed at most once. Each span loses the parts that
      earlier ranges already cover (a fused weight passed with its own slices, a
      tied embedding passed twice), and a piece that continues the previous range
      exactly is merged into it (``w[:n]`` then ``w[n:]`` become one range). The
      tensors' order is kept, and the cap counts distinct bytes. Without it (the
      default) there is one range per non-empty tensor, overlaps included.

    Raises ``ValueError`` for tensors on different devices, a cap below 16 bytes
    (zero or negative included) or negative strides.
    """
    tensors = tensor_list(tensors, "weight_ranges")
    merge = flag(merge, "weight_ranges: merge")
    devices = sorted({_device_of(t) for t in tensors})
    if len(devices) > 1:
        raise ArgumentError(
            f"weight_ranges: tensors are on different devices ({', '.join(devices)}); one table serves one device"
        )
    remaining: int | None = None
    if cap_bytes is not None:
        cap_bytes = count(cap_bytes, "weight_ranges: cap_bytes", minimum=1)
        remaining = _align_down(cap_bytes)
        if remaining == 0:
            raise ArgumentError(f"weight_ranges: cap_bytes {cap_bytes} is below the {ALIGN}-byte granule")
    ranges: list[tuple[int, int]] = []
    covered: list[tuple[int, int]] = []
    for t in tensors:
        span = tensor_span(t)
        if span is None:
            continue
        aligned = (_align_down(span[0]), _align_up(span[1]))
        pieces = _subtract(aligned, covered) if merge else [aligned]
        if merge:
            covered = _cover(covered, aligned)
        for lo, hi in pieces:
            size = hi - lo
            if remaining is not None:
                size = min(size, remaining)
                remaining -= size
            if merge and ranges and ranges[-1][0] + ranges[-1][1] == lo:
                ranges[-1] = (ranges[-1][0], ranges[-1][1] + size)
            else:
                ranges.append((lo, size))
            if remaining == 0:
                return ranges
    return ranges


def total_bytes(ranges: Iterable[tuple[int, int]]) -> int:
    """Bytes a table covers (overlaps counted twice)."""
    return sum(size for _, size in ranges)


def range_table(ranges: Sequence[tuple[int, int]], device: Any = "cpu") -> Any:
    """The kernel's table: a contiguous int64 tensor ``[rows, 2]`` of (address, bytes)
    on ``device`` (``[0, 2]`` for no ranges). Imports torch."""
    import torch

    for address, size in ranges:
        a, n = exact_int(address), exact_int(size)
        if a is None or n is None:
            raise ArgumentError(f"bad range ({address!r}, {size!r}): addresses and sizes are ints")
        if a <= 0 or a >= 2**63 or n <= 0 or a % ALIGN or n % ALIGN:
            raise ArgumentError(f"bad range ({a:#x}, {n}): addresses and sizes must be positive multiples of {ALIGN} "
                             "(address 0: a meta tensor, or no storage?)")  # fmt: skip
    table = torch.tensor([list(r) for r in ranges], dtype=torch.int64).reshape(len(ranges), 2)
    return table.to(device).contiguous()
