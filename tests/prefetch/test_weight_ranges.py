"""kvpatch.prefetch.ranges: the byte ranges a tensor's view touches, 16-byte aligned, capped
and merged, and the int64 table the prefetch kernel reads (CPU tensors stand in for CUDA ones)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvpatch.prefetch.ranges import range_table, tensor_span, total_bytes, weight_ranges  # noqa: E402


def base(n: int = 4096, dtype=None):
    """A CPU buffer whose address is 64-byte aligned, so offsets below are exact."""
    t = torch.empty(n, dtype=dtype or torch.float16)
    assert t.data_ptr() % 64 == 0
    return t


def test_contiguous_tensor_spans_numel_bytes():
    w = base(64 * 32).view(64, 32)
    assert weight_ranges([w]) == [(w.data_ptr(), 64 * 32 * 2)]


def test_transposed_view_spans_its_base_not_from_a_shifted_pointer():
    w = base(64 * 32).view(64, 32)
    # The same bytes whatever the order of dims.
    assert weight_ranges([w.t()]) == [(w.data_ptr(), 64 * 32 * 2)]
    assert weight_ranges([w.t().contiguous().t()]) != []  # a new buffer, still one span


def test_sliced_views_span_what_they_touch():
    buf = base(64 * 32)
    w = buf.view(64, 32)
    p = w.data_ptr()
    # rows 8..15: starts at row 8, 8 rows of 64 bytes
    assert weight_ranges([w[8:16]]) == [(p + 8 * 64, 8 * 64)]
    # a column slice: first row start .. last row's 8th element, end rounded up to 16
    span = (63 * 32 + 8) * 2
    assert weight_ranges([w[:, :8]]) == [(p, span)]
    assert tensor_span(w[:, :8]) == (p, p + span)
    # columns 4..11 of rows 2..3: start 2*64+8 rounded down, end rounded up
    lo, hi = p + 2 * 64 + 4 * 2, p + 3 * 64 + 12 * 2
    assert tensor_span(w[2:4, 4:12]) == (lo, hi)
    assert weight_ranges([w[2:4, 4:12]]) == [(lo - lo % 16, -(-hi // 16) * 16 - (lo - lo % 16))]


def test_step_slice_spans_first_to_last_element_not_numel():
    w = base(64 * 32).view(64, 32)
    v = w[::4]  # 16 rows, every 4th
    assert v.numel() * v.element_size() == 16 * 64
    assert weight_ranges([v]) == [(w.data_ptr(), (15 * 4 * 32 + 32) * 2)]


def test_storage_offset_is_in_data_ptr():
    buf = base(1024)
    v = buf[24:]  # 48 bytes in: aligned
    assert weight_ranges([v]) == [(buf.data_ptr() + 48, (1024 - 24) * 2)]
    odd = buf[3:11]  # bytes 6..22 -> 0..32
    assert weight_ranges([odd]) == [(buf.data_ptr(), 32)]


def test_alignment_rounds_start_down_and_end_up():
    buf = base(1024, torch.uint8)
    assert weight_ranges([buf[17:18]]) == [(buf.data_ptr() + 16, 16)]
    assert weight_ranges([buf[15:17]]) == [(buf.data_ptr(), 32)]
    for address, size in weight_ranges([buf[1:2], buf[100:333], buf[5:900:7]]):
        assert address % 16 == 0 and size % 16 == 0 and size > 0


def test_empty_tensors_are_skipped_and_order_is_kept():
    a, b = base(256), base(512)
    empty = torch.empty(0, 5, dtype=torch.float16)
    assert weight_ranges([b, empty, a[:0], a]) == [(b.data_ptr(), 1024), (a.data_ptr(), 512)]
    assert weight_ranges([]) == []


def test_cap_cuts_the_last_range_and_drops_the_rest():
    a, b, c = base(512), base(512), base(512)  # 1024 bytes each
    assert weight_ranges([a, b, c], cap_bytes=1500) == [(a.data_ptr(), 1024), (b.data_ptr(), 1500 // 16 * 16 - 1024)]
    assert total_bytes(weight_ranges([a, b, c], cap_bytes=1500)) == 1488
    assert weight_ranges([a, b, c], cap_bytes=1024) == [(a.data_ptr(), 1024)]
    assert weight_ranges([a, b, c], cap_bytes=10**9) == weight_ranges([a, b, c])
    assert weight_ranges([a], cap_bytes=17) == [(a.data_ptr(), 16)]


def test_overlapping_tensors_listed_twice_unless_merged():
    w = base(64 * 32).view(64, 32)
    p = w.data_ptr()
    top, bottom = w[:32], w[32:]
    assert weight_ranges([w, top]) == [(p, 4096), (p, 2048)]
    assert weight_ranges([w, top], merge=True) == [(p, 4096)]
    # adjacent slices of one fused weight become one range
    assert weight_ranges([top, bottom], merge=True) == [(p, 4096)]
    # a partial overlap keeps only the new bytes, in the order given
    assert weight_ranges([w[16:48], w[:32], w[40:]], merge=True) == [(p + 1024, 2048), (p, 1024), (p + 3072, 1024)]
    # unrelated tensors are untouched; the cap counts distinct bytes
    other = base(512)
    assert weight_ranges([w, top, other], cap_bytes=4096 + 512, merge=True) == [(p, 4096), (other.data_ptr(), 512)]


def test_errors():
    a = base(64)
    with pytest.raises(ValueError, match="positive"):
        weight_ranges([a], cap_bytes=0)
    with pytest.raises(ValueError, match="positive"):
        weight_ranges([a], cap_bytes=-16)
    with pytest.raises(ValueError, match="16-byte"):
        weight_ranges([a], cap_bytes=15)
    meta = torch.empty(64, dtype=torch.float16, device="meta")
    with pytest.raises(ValueError, match="a meta tensor has no memory to prefetch"):
        weight_ranges([a, meta])


class _FakeTensor:
    """A tensor-like with negative strides (numpy-style) and a chosen device."""

    def __init__(self, device="cuda:0", stride=(1,)):
        self.shape, self._stride, self.device = (4,), stride, device

    def stride(self):
        return self._stride

    def data_ptr(self):
        return 4096

    def element_size(self):
        return 2


def test_duck_typed_tensors_and_negative_strides():
    assert weight_ranges([_FakeTensor()]) == [(4096, 16)]
    with pytest.raises(ValueError, match="negative strides"):
        weight_ranges([_FakeTensor(stride=(-1,))])
    with pytest.raises(ValueError, match="different devices"):
        weight_ranges([_FakeTensor("cuda:0"), _FakeTensor("cuda:1")])


def test_range_table_layout():
    a, b = base(512), base(64)
    ranges = weight_ranges([a, b])
    table = range_table(ranges)
    assert table.dtype == torch.int64 and tuple(table.shape) == (2, 2) and table.is_contiguous()
    assert table.tolist() == [[a.data_ptr(), 1024], [b.data_ptr(), 128]]
    assert tuple(range_table([]).shape) == (0, 2)
    with pytest.raises(ValueError, match="multiples of 16"):
        range_table([(a.data_ptr() + 8, 16)])
    with pytest.raises(ValueError, match="multiples of 16"):
        range_table([(a.data_ptr(), 0)])
