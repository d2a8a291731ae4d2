"""kvpatch.prefetch on the CPU: weight_ranges, the range table, the prefetch kernel's
build and SASS (nvcc), and the controller's stream/event wiring (a fake stream API)."""

from __future__ import annotations

import pytest

from kvpatch.prefetch.ranges import range_table, tensor_span, total_bytes, weight_ranges

torch = pytest.importorskip("torch")


def base(n: int = 4096, dtype=None):
    """A CPU buffer whose address is 64-byte aligned, so offsets below are exact."""
    t = torch.empty(n, dtype=dtype or torch.float16)
    assert t.data_ptr() % 64 == 0
    return t


# --------------------------------------------------------------------------- weight_ranges


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
    with pytest.raises(ValueError, match="different devices"):
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


# --------------------------------------------------------------------------- the kernel

import json  # noqa: E402
from pathlib import Path  # noqa: E402
import shutil  # noqa: E402

from kvpatch.errors import BuildError, UsageError  # noqa: E402
from kvpatch.prefetch import kernel as K  # noqa: E402

needs_nvcc = [pytest.mark.nvcc, pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")]


def test_source_shows_each_form_literally():
    src = K.PrefetchKernelSpec().source()
    for hint in ("evict_last", "evict_normal", "evict_first"):  # chosen per launch
        assert f'asm volatile("createpolicy.fractional.L2::{hint}.b64 %0, 1.0;" : "=l"(policy));' in src
    assert 'asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(address), "r"(bytes), "l"(policy) : "memory");' in src
    assert 'asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(address), "r"(bytes) : "memory");' in src
    assert 'asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(address) : "memory");' in src
    assert 'asm volatile("prefetch.global.L2 [%0];" ::"l"(address) : "memory");' in src
    assert "constexpr long long kChunk = 4096;" in src and "constexpr long long kLine = 128;" in src
    assert "constexpr int kThreads = 32;" in src and "constexpr int kHint = 0;" in src
    plain = K.PrefetchKernelSpec(hint="none", chunk=8192, threads=128).source()
    assert "constexpr int kHint = 3;" in plain and "constexpr long long kChunk = 8192;" in plain
    assert "constexpr int kThreads = 128;" in plain
    for hint, code in K.HINT_CODES.items():  # each code selects its own branch in the kernel
        assert f"constexpr int kHint = {code};" in K.PrefetchKernelSpec(hint=hint).source()
    assert "if (hint == 0)" in src and "if (hint == 3)" in src  # evict_last and none, as coded


def test_launch_options_are_checked():
    K.check_launch(1024, (1 << 20) - 16, "none")  # the instruction's limit, config.MAX_SIZE
    K.check_launch()
    for bad in ({"threads": 48}, {"threads": 2048}, {"chunk": 8}, {"chunk": 4100}, {"chunk": 1 << 20}, {"hint": "last"}):
        with pytest.raises(UsageError):
            K.check_launch(**bad)


GOLDEN_KERNEL = Path(__file__).parent / "fixtures" / "golden" / "prefetch" / "l2_prefetch.cu"


def test_default_source_matches_golden():
    """The whole generated file, pinned (regenerate: python -c "from kvpatch.prefetch.kernel
    import PrefetchKernelSpec; print(PrefetchKernelSpec().source(), end='')" > this file)."""
    assert K.PrefetchKernelSpec().source() == GOLDEN_KERNEL.read_text(encoding="utf-8")


def test_spec_and_arch_errors():
    with pytest.raises(UsageError, match="hint"):
        K.PrefetchKernelSpec(hint="evict_sometimes")
    for chunk in (0, 24, K.MAX_CHUNK + 16):
        with pytest.raises(UsageError, match="multiple of 16"):
            K.PrefetchKernelSpec(chunk=chunk)
    with pytest.raises(UsageError, match="sm_80 or newer"):
        K.build_prefetch_library("7.5;9.0a")
    with pytest.raises(UsageError, match="8.0 or newer"):
        K.archs_for_capability(7, 5)
    assert K.archs_for_capability(9, 0) == "9.0a" and K.archs_for_capability(8, 9) == "8.9"


SASS_SAMPLE = """
\tcode for sm_90a
\t\tFunction : kern
        /*0860*/                   UBLKPF.L2 [UR12], UR10, desc[UR8] ;                  /* 0x000008000c0073bc */
\tcode for sm_80
\t\tFunction : kern
        /*06b0*/                   CCTL.E.PML2 [R12] ;                                   /* 0x000000000c00798f */
"""


def test_check_sass_counts_and_refuses_wrong_forms():
    from kvpatch import build as B

    archs = B.parse_arch_list("9.0a;8.0")
    assert K.check_sass(SASS_SAMPLE, archs) == {"sm_90a": {"bulk": 1, "line": 0}, "sm_80": {"bulk": 0, "line": 1}}
    with pytest.raises(BuildError, match="sm_90a.*expected UBLKPF"):
        K.check_sass(SASS_SAMPLE.replace("UBLKPF.L2", "NOP"), archs)
    with pytest.raises(BuildError, match="sm_80.*per-line"):
        K.check_sass(SASS_SAMPLE.replace("CCTL.E.PML2", "NOP"), archs)
    with pytest.raises(BuildError, match="no SASS for sm_89"):
        K.check_sass(SASS_SAMPLE, B.parse_arch_list("8.9"))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    cache = tmp_path_factory.mktemp("prefetch-cache")
    return cache, K.build_prefetch_library("9.0a;8.0", cache=cache)


@pytest.mark.nvcc
def test_build_sm90a_has_ublkpf_and_sm80_the_per_line_prefetch(built):
    cache, library = built
    assert library.is_file() and library.parent.parent == cache / "builds"
    result = json.loads((library.parent / "result.json").read_text())
    assert result["sass"]["sm_90a"]["bulk"] >= 1 and result["sass"]["sm_90a"]["line"] == 0
    assert result["sass"]["sm_80"]["line"] >= 1 and result["sass"]["sm_80"]["bulk"] == 0
    sass = K.sass_by_arch((library.parent / "kernel.sass").read_text().splitlines())
    # The hinted bulk form carries the policy descriptor, the 'none' form has none (both
    # are in the code: the hint is a launch argument); evict_last per line is PML2.
    bulk = [i.split(" ", 1)[1] if i.startswith("@") else i for i in sass["sm_90a"]]
    assert any(i.startswith("UBLKPF.L2 [UR") and "desc[UR" in i for i in bulk)
    assert any(i.startswith("UBLKPF.L2 [UR") and "desc[" not in i for i in bulk)
    line = [i.split(" ", 1)[1] if i.startswith("@") else i for i in sass["sm_80"]]
    assert any(i.startswith("CCTL.E.PML2 [R") for i in line) and any(i.startswith("CCTL.E.PF2 [R") for i in line)
    assert "CCTL" not in " ".join(sass["sm_90a"])


@pytest.mark.nvcc
def test_build_is_cached_by_content(built):
    cache, library = built
    mtime = library.stat().st_mtime_ns
    assert K.build_prefetch_library("9.0a;8.0", cache=cache) == library
    assert library.stat().st_mtime_ns == mtime
    other = K.build_prefetch_library("8.0", K.PrefetchKernelSpec(hint="none"), cache=cache)
    assert other != library
    assert json.loads((other.parent / "result.json").read_text())["spec"].endswith("hint=none,threads=32")


@pytest.mark.nvcc
def test_library_loads_and_reports_launch_errors(built):
    _, library = built
    lib = K.PrefetchLibrary(library)
    assert lib.config == "chunk=4096,line=128,hint=evict_last,threads=32"
    with pytest.raises(RuntimeError, match="kvpatch_l2_prefetch failed: .*error 1\\)"):
        lib.launch(0x1000, 1, 0, 0)  # grid 0: cudaErrorInvalidValue, before any CUDA call
    lib.launch(0, 0, 8, 0)  # no rows: nothing to do, no CUDA call
    with pytest.raises(UsageError, match="32-bit"):
        lib.launch(0x1000, 1, 2**32 + 8, 0)  # ctypes would pass 8
    lib.launch(0, 0, 8, 0, threads=256, chunk=16384, hint="none")  # the run-time options, same path
    with pytest.raises(RuntimeError, match="error 1\\)"):
        lib.launch(0x1000, 1, 0, 0, threads=64)
    with pytest.raises(UsageError, match="threads"):
        lib.launch(0, 0, 8, 0, threads=33)


# --------------------------------------------------------------------------- the controller

import gc  # noqa: E402
import weakref  # noqa: E402
from contextlib import contextmanager  # noqa: E402

from kvpatch.prefetch import PrefetchController  # noqa: E402
from kvpatch.prefetch.controller import default_grid  # noqa: E402


class FakeTensor:
    """Enough of a tensor for weight_ranges: a device, an address, a contiguous shape."""

    def __init__(self, address: int, nbytes: int, device: str = "cuda:0"):
        self.device, self._address, self.shape = device, address, (nbytes // 2,)

    def data_ptr(self):
        return self._address

    def stride(self):
        return (1,)

    def element_size(self):
        return 2


class FakeAPI:
    """Logs every stream/event call as a tuple in ``self.log``."""

    def __init__(self, capability=(9, 0)):
        self.log: list[tuple] = []
        self.cap = capability
        self.main = FakeStream(self, "main")
        self.tables: list[list[tuple[int, int]]] = []
        self.events = 0

    def normalize(self, device):
        return "cuda:0" if str(device) in ("cuda", "cuda:0") else str(device)

    def capability(self, device):
        return self.cap

    def new_stream(self, device, priority):
        self.log.append(("new_stream", device, priority))
        return FakeStream(self, "side")

    def new_event(self):
        self.events += 1
        return FakeEvent(self, f"event{self.events - 1}")

    def current_stream(self, device):
        return self.main

    def handle(self, stream):
        return {"main": 0x1111, "side": 0x2222}[stream.name]

    def make_table(self, ranges, device):
        self.tables.append(list(ranges))
        return FakeTable(0x7000 + 0x100 * len(self.tables))

    @contextmanager
    def device_guard(self, device):
        self.log.append(("device", device))
        yield


class FakeStream:
    def __init__(self, api, name):
        self.api, self.name = api, name

    def wait_event(self, event):
        self.api.log.append(("wait_event", self.name, event.name))

    def wait_stream(self, other):
        self.api.log.append(("wait_stream", self.name, other.name))


class FakeEvent:
    def __init__(self, api, name):
        self.api, self.name = api, name

    def record(self, stream):
        self.api.log.append(("record", self.name, stream.name))


class FakeTable:
    def __init__(self, address):
        self.address = address

    def data_ptr(self):
        return self.address


class FakeLibrary:
    def __init__(self, api):
        self.api = api

    def launch(self, table_ptr, rows, grid, stream_ptr, **options):
        self.api.log.append(("launch", table_ptr, rows, grid, stream_ptr, *sorted(options.items())))


def controller(**kw):
    api = FakeAPI(kw.pop("capability", (9, 0)))
    ctl = PrefetchController("cuda:0", library=FakeLibrary(api), api=api, **kw)
    api.log.clear()
    return ctl, api


MiB = 1 << 20


def test_fork_records_on_current_then_side_waits_then_launches_on_side():
    ctl, api = controller()
    w1, w2 = FakeTensor(0x10000000, 4 * MiB), FakeTensor(0x20000000, 2 * MiB)
    ctl.add("attn", 0, [w1, w2], cap_bytes=5 * MiB)
    assert api.tables == [[(0x10000000, 4 * MiB), (0x20000000, MiB)]]
    assert ctl.fork("attn", 0) is True
    assert api.log == [
        ("record", "event0", "main"),
        ("wait_event", "side", "event0"),
        ("device", "cuda:0"),
        ("launch", 0x7100, 2, 5, 0x2222),  # table, rows, grid (5 MiB -> 5 CTAs), the side stream
    ]
    assert ctl.pending
    api.log.clear()
    ctl.join()
    assert api.log == [("wait_stream", "main", "side")] and not ctl.pending
    ctl.join()  # nothing forked since: no call
    assert api.log == [("wait_stream", "main", "side")]


def test_launch_knobs_reach_every_launch_and_bad_ones_are_refused():
    ctl, api = controller(grid=132, threads=128, chunk=16384, hint="evict_normal")
    w = FakeTensor(0x10000000, 4 * MiB)
    ctl.add("attn", 0, [w], cap_bytes=MiB)
    ctl.add("attn", 1, [w], cap_bytes=MiB, grid=7)  # add(grid=) wins over the controller's
    ctl.fork("attn", 0)
    ctl.fork("attn", 1)
    launches = [e for e in api.log if e[0] == "launch"]
    opts = (("chunk", 16384), ("hint", "evict_normal"), ("threads", 128))
    assert [e[3] for e in launches] == [132, 7] and all(e[5:] == opts for e in launches)
    plain, api2 = controller()
    plain.add("attn", 0, [w], cap_bytes=MiB)
    plain.fork("attn", 0)
    assert [e for e in api2.log if e[0] == "launch"][0][5:] == ()  # no knobs: the library's defaults
    for bad in ({"grid": 0}, {"grid": 2.5}, {"threads": 40}, {"chunk": 10}, {"hint": "sticky"}):
        with pytest.raises(UsageError):
            controller(**bad)


def test_unknown_window_does_not_launch_and_tables_are_immutable():
    ctl, api = controller()
    assert ctl.fork("attn", 3) is False and api.log == []
    ctl.add("attn", 0, [FakeTensor(0x1000, 4096)])
    with pytest.raises(ValueError, match="already added"):
        ctl.add("attn", 0, [FakeTensor(0x1000, 4096)])
    ctl.join()
    assert api.log == []


def test_per_batch_caps_buckets_and_off():
    ctl, api = controller()
    w = FakeTensor(0x10000000, 64 * MiB)
    ctl.add("attn", 1, [w], batches={1: 32 * MiB, 2: 32 * MiB, 4: 8 * MiB, 8: 0})
    assert api.tables == [[(0x10000000, 32 * MiB)], [(0x10000000, 8 * MiB)]]  # one table per distinct cap
    assert ctl.table("attn", 1, 1) is ctl.table("attn", 1, 2)
    assert ctl.table("attn", 1, 3).bytes == 8 * MiB  # bucket: the smallest key >= 3
    for batch, launched in ((1, True), (3, True), (4, True), (5, False), (8, False), (16, False)):
        api.log.clear()
        assert ctl.fork("attn", 1, batch) is launched, batch
        assert any(e[0] == "launch" for e in api.log) is launched
    with pytest.raises(ValueError, match="pass batch="):
        ctl.fork("attn", 1)
    # an iterable of batches: the one cap for those, nothing above
    ctl.add("mlp", 1, [w], cap_bytes=MiB, batches=range(1, 5))
    assert ctl.table("mlp", 1, 4).bytes == MiB and ctl.table("mlp", 1, 5) is None
    # an "off" bucket between two others stays off (batch 3 does not fall through to 8)
    ctl.add("gap", 1, [w], batches={1: MiB, 4: 0, 8: 2 * MiB})
    assert [ctl.fork("gap", 1, b) for b in (1, 2, 3, 4, 5, 8, 9)] == [True, False, False, False, True, True, False]
    # cap 0 without batches: never launches
    ctl.add("off", 1, [w], batches={1: 0})
    assert ctl.fork("off", 1, 1) is False


def test_add_refuses_tensors_on_another_device():
    ctl, _ = controller()
    with pytest.raises(ValueError, match="cuda:1.*prefetches on cuda:0"):
        ctl.add("attn", 0, [FakeTensor(0x1000, 4096), FakeTensor(0x2000, 4096, "cuda:1")])
    with pytest.raises(ValueError, match="cpu"):
        ctl.add("attn", 0, [torch.empty(64)])
    with pytest.raises(ValueError, match="positive"):
        ctl.add("attn", 0, [FakeTensor(0x1000, 4096)], cap_bytes=-1)


def test_tables_keep_their_tensors_alive():
    ctl, _ = controller()
    w = FakeTensor(0x1000, 4096)
    alive = weakref.ref(w)
    ctl.add("attn", 0, [w])
    del w
    gc.collect()
    assert alive() is not None and ctl.table("attn", 0).tensors[0] is alive()


def test_disabled_is_a_no_op_everywhere():
    api = FakeAPI()
    ctl = PrefetchController("cuda:0", enabled=False, library=FakeLibrary(api), api=api)
    ctl.add("attn", 0, [FakeTensor(0x1000, 4096, "cuda:7")])
    assert ctl.fork("attn", 0) is False and ctl.fork("attn", 0, 1) is False
    ctl.join()
    assert ctl.table("attn", 0) is None
    assert api.log == [] and api.tables == [] and ctl.stream is None


def test_priority_capability_and_one_event_per_window():
    api = FakeAPI()
    PrefetchController("cuda", library=FakeLibrary(api), api=api, priority="high")
    PrefetchController("cuda", library=FakeLibrary(api), api=api, priority="normal")
    PrefetchController("cuda", library=FakeLibrary(api), api=api, priority=-2)
    assert [e[2] for e in api.log if e[0] == "new_stream"] == [-(1 << 16), 0, -2]
    with pytest.raises(UsageError, match="priority"):
        PrefetchController("cuda", library=FakeLibrary(api), api=api, priority="urgent")
    with pytest.raises(UsageError, match="8.0 or newer.*7.5"):
        PrefetchController("cuda", library=FakeLibrary(api), api=FakeAPI((7, 5)))
    ctl, api = controller(capability=(8, 0))
    ctl.add("a", 0, [FakeTensor(0x1000, 4096)])
    ctl.add("a", 1, [FakeTensor(0x1000, 4096)])
    ctl.fork("a", 0), ctl.fork("a", 1), ctl.fork("a", 0)
    assert [e[1] for e in api.log if e[0] == "record"] == ["event0", "event1", "event0"]
    assert ctl.launches == 3


# --------------------------------------------------------------------------- the decode step (CPU)

from kvpatch.prefetch import decode as D  # noqa: E402
from kvpatch.prefetch.models import MODELS, ModelShape  # noqa: E402
from kvpatch.prefetch.report import DecodeReport
from kvpatch.render import decode_point_line, decode_text  # noqa: E402

TINY = ModelShape("tiny", hidden=64, heads=4, kv_heads=2, head_size=16, intermediate=96)


class ReferenceKernels:
    """PagedAttention in torch, reading vLLM's cache layouts (written from the layout
    description, not from kvpatch's writer): key [blocks, kv, head/x, block, x],
    value [blocks, kv, head, block]."""

    configs = ("bf16/auto/16/16",)

    def __init__(self):
        self.calls = []

    def _attend(self, out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size):
        nb, kv, hx, bs, x = key_cache.shape
        for s in range(query.shape[0]):
            n = int(seq_lens[s])
            blocks = block_tables[s, : -(-n // bs)].long()
            k = key_cache[blocks].permute(0, 3, 1, 2, 4).reshape(-1, kv, hx * x)[:n].float()
            v = value_cache[blocks].permute(0, 3, 1, 2).reshape(-1, kv, hx * x)[:n].float()
            for h in range(query.shape[1]):
                g = h // (query.shape[1] // num_kv_heads)
                p = torch.softmax((k[:, g] @ query[s, h].float()) * scale, dim=0)
                out[s, h] = (p @ v[:, g]).to(out.dtype)

    def v1(self, out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len, alibi, kv_dtype, k_scale, v_scale):
        self.calls.append("v1")
        self._attend(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size)

    def v2(self, out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len, alibi, kv_dtype, k_scale, v_scale):
        self.calls.append("v2")
        self._attend(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size)


def test_dispatch_rule_caps_and_names():
    assert D.dispatched_kernel(1, 32, 512) == "v1"  # one partition
    assert D.dispatched_kernel(1, 32, 1024) == "v2" and D.dispatched_kernel(17, 32, 4096) == "v1"  # 17*32 > 512
    assert D.dispatched_kernel(16, 32, 1024) == "v2"  # 16*32 = 512, not > 512
    assert D.dispatched_kernel(64, 32, 16384) == "v2"  # > 8192
    assert D.parse_caps("1:32,4:32,8:16") == {1: 32 << 20, 4: 32 << 20, 8: 16 << 20}
    assert D.parse_caps("24") == 24 << 20 and D.parse_caps("off") == 0 and D.parse_caps("0.5") == 1 << 19
    assert D.parse_caps("default") == {b: c << 20 for b, c in D.DEFAULT_CAPS_MIB.items()}
    for bad in ("x:3", "0:3", "4:-1", "abc"):
        with pytest.raises(ValueError):
            D.parse_caps(bad)
    caps = {1: 32, 4: 16, 8: 0}
    assert [D.cap_for_batch(caps, b) for b in (1, 2, 4, 5, 8, 16)] == [32, 16, 16, 0, 0, 0]
    assert D.cap_for_batch(7, 64) == 7
    assert D.variant_names(["patched", "stock"]) == ["stock", "patched", "stock+wpf", "patched+wpf"]
    with pytest.raises(ValueError, match="stock"):
        D.variant_names(["patched"])
    assert D.parse_lib_arg("patched=/a:b/lib.so:kvpatch_patched") == ("patched", "/a:b/lib.so", "kvpatch_patched")
    m = MODELS["llama-3.1-8b"]
    assert (m.hidden, m.heads, m.kv_heads, m.head_size, m.intermediate) == (4096, 32, 8, 128, 14336)
    assert m.layer_weight_bytes(2) == 2 * (6144 * 4096 + 4096 * 4096 + 2 * 14336 * 4096 + 4096 * 14336 + 2 * 4096)
    assert MODELS["llama-3.2-1b"].head_size == 64


@pytest.fixture
def tiny_step():
    weights = D.DecodeWeights(TINY, "bf16", layers=2, device="cpu", seed=3)
    return D.DecodeStep(weights, batch=3, context=37, seed=5)  # 37 tokens: 3 blocks, the last partly filled


def test_step_writes_the_new_token_where_vllm_reads_it(tiny_step):
    st, s = tiny_step, TINY
    F = torch.nn.functional
    w = st.w.per_layer[0]
    h = F.rms_norm(st.x0, (s.hidden,), w["norm1"], s.rms_eps)
    qkv = F.linear(h, w["qkv"])
    k_new = qkv[:, s.q_size : s.q_size + s.kv_size].reshape(3, s.kv_heads, s.head_size)
    v_new = qkv[:, s.q_size + s.kv_size :].reshape(3, s.kv_heads, s.head_size)
    st.step(ReferenceKernels())
    pos = 36
    for seq in range(3):
        block = int(st.block_tables[0][seq, pos // 16])
        # key_cache[block, kv, d // x, pos % 16, d % x] holds k[kv, d]
        k = st.key_caches[0][block, :, :, pos % 16, :].reshape(s.kv_heads, s.head_size)
        v = st.value_caches[0][block, :, :, pos % 16]
        assert torch.equal(k, k_new[seq]) and torch.equal(v, v_new[seq])


def test_step_matches_a_contiguous_reference_model(tiny_step):
    """The whole step against a plain model with contiguous K/V (gathered before the step,
    the new token appended), so block tables, slots and layouts must all agree."""
    st, s = tiny_step, TINY
    F = torch.nn.functional
    kv = []
    for layer in range(2):
        per_seq = []
        for seq in range(3):
            blocks = st.block_tables[layer][seq].long()
            k = st.key_caches[layer][blocks].permute(0, 3, 1, 2, 4).reshape(-1, s.kv_heads, s.head_size)[:36].clone()
            v = st.value_caches[layer][blocks].permute(0, 3, 1, 2).reshape(-1, s.kv_heads, s.head_size)[:36].clone()
            per_seq.append((k, v))
        kv.append(per_seq)
    lib = ReferenceKernels()
    st.step(lib)
    assert lib.calls == ["v1", "v1"]  # 37 tokens: one partition
    x = st.x0
    for layer, w in enumerate(st.w.per_layer):
        qkv = F.linear(F.rms_norm(x, (s.hidden,), w["norm1"], s.rms_eps), w["qkv"])
        attn = torch.empty(3, s.heads, s.head_size, dtype=x.dtype)
        for seq in range(3):
            q = qkv[seq, : s.q_size].view(s.heads, s.head_size).float()
            k_new = qkv[seq, s.q_size : s.q_size + s.kv_size].view(s.kv_heads, s.head_size)
            v_new = qkv[seq, s.q_size + s.kv_size :].view(s.kv_heads, s.head_size)
            k = torch.cat([kv[layer][seq][0], k_new[None]]).float()
            v = torch.cat([kv[layer][seq][1], v_new[None]]).float()
            for h in range(s.heads):
                p = torch.softmax((k[:, h // 2] @ q[h]) * s.head_size**-0.5, dim=0)
                attn[seq, h] = (p @ v[:, h // 2]).to(x.dtype)
        x = x + F.linear(attn.view(3, -1), w["o_proj"])
        gu = F.linear(F.rms_norm(x, (s.hidden,), w["norm2"], s.rms_eps), w["gate_up"])
        x = x + F.linear(F.silu(gu[:, :96]) * gu[:, 96:], w["down"])
    assert torch.isfinite(st.out).all()
    assert torch.equal(st.out, x)


def test_step_forks_each_layer_before_attention_and_joins_once(tiny_step):
    st = tiny_step
    api = FakeAPI()
    api.normalize = lambda device: "cpu"
    ctl = PrefetchController("cpu", library=FakeLibrary(api), api=api)
    st.add_prefetch(ctl, {1: 1 << 20, 4: 4096, 8: 0})
    assert [len(t) for t in api.tables] == [3, 1, 3, 1]  # per layer: uncapped-ish 1 MiB holds all three, 4 KiB one
    w0 = st.w.per_layer[0]
    assert api.tables[0][0][0] == w0["o_proj"].data_ptr()  # o_proj first: it runs right after attention
    api.log.clear()

    class Spy(ReferenceKernels):
        def _attend(self, *a, **k):
            api.log.append(("attention",))
            super()._attend(*a, **k)

    st.step(Spy(), ctl)
    kinds = [e[0] for e in api.log if e[0] in ("record", "launch", "attention", "wait_stream")]
    assert kinds == ["record", "launch", "attention", "record", "launch", "attention", "wait_stream"]
    assert [e[3] for e in api.log if e[0] == "launch"] == [default_grid(1 << 20)] * 2 and not ctl.pending
    # batch 3 uses the B<=4 bucket (4 KiB); at batch 9 nothing would launch
    assert ctl.table("attn", 0, 3).bytes == 4096 and ctl.table("attn", 0, 9) is None


def _fake_point(batch, speed):
    def var(us, ratio):
        return {"step_us": {"median": us, "min": us * 0.99, "max": us * 1.01}, "tokens_per_s": batch / us * 1e6,
                "speedup": {"median": ratio, "min": ratio - 0.01, "max": ratio + 0.01}, "attention_share": 0.4}
    return {"model": "llama-3.1-8b", "dtype": "bf16", "batch": batch, "context": 1024, "kernel": "v2", "layers": 8,
            "cap_bytes": 32 << 20, "all_identical": True, "power_capped_rounds": 0,
            "variants": {"stock": var(1000.0, 1.0), "patched": var(1000 / speed, speed),
                         "stock+wpf": var(950.0, 1000 / 950), "patched+wpf": var(900.0, 1000 / 900)}}


def test_report_text_json_and_plot(tmp_path):
    rep = DecodeReport(variants=["stock", "patched", "stock+wpf", "patched+wpf"], layers=8, rounds=5, mode="warm",
                       caps_bytes={"1": 32 << 20, "8": 16 << 20}, env={"gpu": "NVIDIA H200", "l2_bytes": 60 << 20},
                       points=[_fake_point(1, 1.2), _fake_point(4, 0.95)],
                       skipped=[{"model": "llama-3.1-8b", "dtype": "bf16", "batch": 64, "context": 16384, "reason": "too big"}])
    text = decode_text(rep)
    assert "1.200 [1.190..1.210]" in text and "0.950 [0.940..0.960]" in text
    assert "patched: geomean 1.068x, worst 0.950x; faster at 1, slower at 1, within noise at 0 of 2 points" in text
    assert "B<=1: 32 MiB, B<=8: 16 MiB, off above B=8" in text
    assert "skipped llama-3.1-8b bf16 B=64 ctx=16384: too big" in text
    assert rep.summary()["best_variant_counts"] == {"patched+wpf": 1, "patched": 1}
    rep.save_json(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["summary"]["all_identical"] and DecodeReport.from_dict(data).points == rep.points
    assert decode_text(data) == text  # the saved JSON renders the same
    line = decode_point_line(rep, rep.points[0])
    assert "stock 1000.0 us" in line and "patched 1.200x" in line and line.endswith("identical")
    pytest.importorskip("matplotlib")
    assert (tmp_path / "r.png").exists() is False
    rep.plot(tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 1000


def test_a_point_is_faster_or_slower_only_when_its_whole_interval_is():
    rep = DecodeReport(variants=["stock", "patched", "stock+wpf", "patched+wpf"], layers=8, rounds=5, mode="warm",
                       caps_bytes=0, env={}, points=[_fake_point(1, 1.005), _fake_point(4, 0.995), _fake_point(16, 1.02)])
    s = rep.summary()["patched"]
    assert (s["faster"], s["slower"], s["noise"]) == (1, 0, 2)
    assert "off" in decode_text(rep)


# --------------------------------------------------------------------------- options, fork/join, sweep picks, CLI

import subprocess  # noqa: E402
import sys  # noqa: E402

from kvpatch.prefetch import sweep as S  # noqa: E402
from kvpatch.prefetch.options import WeightPrefetch  # noqa: E402


def test_weight_prefetch_text_form_round_trips_and_refuses_bad_values():
    w = WeightPrefetch.parse("cap=1:32,4:16,8:0;grid=132;threads=128;chunk=16384;hint=evict_normal;fork=qkv;join=oproj;priority=normal")
    assert w.caps == {1: 32 * MiB, 4: 16 * MiB, 8: 0} and (w.grid, w.threads, w.chunk, w.hint) == (132, 128, 16384, "evict_normal")
    assert (w.fork, w.join, w.priority) == ("qkv", "oproj", "normal") and [w.cap(b) for b in (1, 3, 8, 9)] == [32 * MiB, 16 * MiB, 0, 0]
    assert WeightPrefetch.parse(w.label()) == w
    assert WeightPrefetch().label() == "cap=1:32,2:32,4:32,8:16" and WeightPrefetch.parse("grid=auto", w).grid is None
    assert w.controller_options() == {"priority": "normal", "grid": 132, "threads": 128, "chunk": 16384, "hint": "evict_normal"}
    assert WeightPrefetch(caps=0).off() and WeightPrefetch(caps={1: 0}).off() and not w.off()
    for bad in ("cap=x", "grid=0", "grid=x", "threads=33", "chunk=8", "hint=last", "fork=mlp", "join=never", "size=3", "cap"):
        with pytest.raises((ValueError, UsageError)):
            WeightPrefetch.parse(bad)


def _spy_step(tiny_step, fork, join):
    api = FakeAPI()
    api.normalize = lambda device: "cpu"
    ctl = PrefetchController("cpu", library=FakeLibrary(api), api=api)
    tiny_step.add_prefetch(ctl, 1 << 20)
    api.log.clear()

    class Spy(ReferenceKernels):
        def _attend(self, *a, **k):
            api.log.append(("attention",))
            super()._attend(*a, **k)

    linear = torch.nn.functional.linear

    def spy_linear(x, w, *a):  # which GEMM runs when: qkv / o_proj / gate_up / down
        names = {id(t): n for n, t in tiny_step.w.per_layer[0].items()} | {id(t): n for n, t in tiny_step.w.per_layer[1].items()}
        api.log.append(("gemm", names.get(id(w))))
        return linear(x, w, *a)

    torch.nn.functional.linear = spy_linear
    try:
        tiny_step.step(Spy(), ctl, fork=fork, join=join)
    finally:
        torch.nn.functional.linear = linear
    return [e[0] if e[0] != "gemm" else e[1] for e in api.log if e[0] in ("launch", "attention", "wait_stream", "gemm")]


def test_fork_and_join_points(tiny_step):
    layer = ["qkv", "launch", "attention", "o_proj", "gate_up", "down"]
    assert _spy_step(tiny_step, "attn", "step") == layer * 2 + ["wait_stream"]
    qkv_first = ["launch", "qkv", "attention", "o_proj", "gate_up", "down"]
    assert _spy_step(tiny_step, "qkv", "step") == qkv_first * 2 + ["wait_stream"]
    per_layer = ["qkv", "launch", "attention", "wait_stream", "o_proj", "gate_up", "down"]
    assert _spy_step(tiny_step, "attn", "oproj") == per_layer * 2  # the final join has nothing pending
    with pytest.raises(ValueError, match="fork"):
        tiny_step.step(ReferenceKernels(), None, fork="mlp")


def _sweep_point(batch, ratios):
    """ratios: {variant: (median, min, max)} of speedup_vs_library."""
    variants = {"stock": {"speedup_vs_library": {"median": 1.0, "min": 1.0, "max": 1.0}}}
    for n, (med, lo, hi) in ratios.items():
        variants[n] = {"speedup_vs_library": {"median": med, "min": lo, "max": hi}}
    return {"batch": batch, "context": 1024, "variants": variants, "all_identical": True}


def test_pick_knobs_takes_a_knob_only_when_it_beats_g132():
    configs = S.stage1_configs()
    r = {f"stock+wpf:{n}": (1.0, 0.99, 1.01) for n in configs}
    r["stock+wpf:g132"] = (1.02, 1.01, 1.03)
    r["stock+wpf:g132none"] = (1.05, 1.04, 1.06)
    r["stock+wpf:g132qkv"] = (1.0205, 1.01, 1.03)  # within MIN_GAIN of g132: not taken
    r["stock+wpf:g132t128"] = (1.03, 1.02, 1.04)
    points = [_sweep_point(b, r) for b in (1, 4)] + [_sweep_point(8, {n: (0.5, 0.5, 0.5) for n in r})]
    best, why = S.pick_knobs(points, configs)
    assert (best.grid, best.threads, best.hint, best.fork) == (132, 128, "none", "attn"), why
    assert why["chosen"] == {"launch": "g132t128", "hint": "g132none"}


def test_pick_caps_turns_a_batch_off_unless_faster_beyond_the_spread():
    def r(cap_ratio):
        return {f"{lib}+wpf:cap{c}": v for c, v in cap_ratio.items() for lib in ("stock", "patched")}

    points = [
        _sweep_point(1, r({8: (1.01, 1.0, 1.02), 16: (1.04, 1.03, 1.05)})),
        _sweep_point(4, r({8: (1.002, 0.99, 0.998), 16: (0.99, 0.98, 1.0)})),  # best geomean > 1 but slower beyond spread
        _sweep_point(8, r({8: (0.99, 0.98, 1.0), 16: (0.98, 0.97, 0.99)})),
    ]
    caps, why = S.pick_caps(points, (8, 16))
    assert caps == {1: 16 * MiB, 4: 0, 8: 0}, why
    assert why["4"]["best_cap_mib"] == 8 and why["1"]["reason"] == "faster"


def _cli(*args):
    code = "import sys; from kvpatch.cli import run; sys.argv = ['kvpatch', *sys.argv[1:]]; run()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


def test_cli_bench_decode_help_and_bad_cap():
    done = _cli("bench-decode", "--help")
    assert done.returncode == 0, done.stderr
    for opt in ("--lib", "--models", "--dtypes", "--batches", "--contexts", "--layers", "--rounds", "--cap", "--grid",
                "--threads", "--chunk", "--hint", "--fork", "--join", "--wpf", "--cold", "--micro", "--json", "--plot"):
        assert opt in done.stdout, opt
    bad = _cli("bench-decode", "--lib", "stock=/nonexistent.so:p", "--cap", "1:x")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().count("\n") == 0 and "invalid cap" in bad.stderr, bad.stderr
    hint = _cli("bench-decode", "--lib", "stock=/nonexistent.so:p", "--hint", "sticky")
    assert hint.returncode == 2 and "hint" in hint.stderr and hint.stderr.strip().count("\n") == 0


def test_decode_time_rounds_balances_order_and_keeps_each_launchers_times(monkeypatch):
    """The decode step's timing loop on the CPU (host events stand in for CUDA events):
    every launcher follows every launcher equally often, and each median is its own."""
    torch = pytest.importorskip("torch")
    import time

    from kvpatch.gpu.timing import HostEvent, carryover_order
    from kvpatch.prefetch import timing as PT

    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing=True: HostEvent())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(PT, "smi", lambda *a, **k: None)
    order = []
    launchers = {name: (lambda i=i: (order.append(i), time.sleep(0.02 * i * i))) for i, name in enumerate("abc")}
    flushes = []
    medians, clocks = PT.time_rounds(launchers, rounds=2, reps=3, device="cpu", flush=lambda: flushes.append(1),
                                     flushed=["c"])
    timed = [order[3:12], order[15:24]]  # after each round's 3 warm-up launches
    assert timed[0] == carryover_order(3) and sorted(timed[1]) == sorted(timed[0]) and timed[1] != timed[0]
    assert len(flushes) == 2 * 3
    # medians (us) of 0, 20 and 80 ms sleeps, with margins a loaded machine's stalls stay inside
    assert medians["a"][0] < 20_000 <= medians["b"][0] < 80_000 <= medians["c"][0] and len(clocks) == 2


def test_measure_point_keeps_every_controller_alive_while_its_graph_replays(monkeypatch) -> None:
    """A CUDA graph holds no Python reference to the controller whose forks it captured.
    measure_point dropped each controller but the last: the graphs of the others replayed
    prefetches from freed device range tables (the weight-prefetch sweep's stage 1)."""
    import gc
    import weakref

    import kvpatch.prefetch.controller as C
    import kvpatch.prefetch.decode as D
    from kvpatch.prefetch.models import ModelShape
    from kvpatch.prefetch.options import WeightPrefetch
    from kvpatch.prefetch.step import DecodeStep

    class Ctl(C.PrefetchController):
        def __init__(self, device, library=None, **kw):
            api = FakeAPI()
            super().__init__("cuda:0", library=FakeLibrary(api), api=api, **kw)

    class Graph:  # what capture returns: no reference to what the captured work used
        def __init__(self, fn):
            defaults = fn.__defaults__ or ()
            ctl = defaults[1] if len(defaults) > 1 else None
            self.ctl = weakref.ref(ctl) if isinstance(ctl, C.PrefetchController) else None

        def replay(self):
            if self.ctl is not None:
                replays.append(self.ctl() is not None)

    replays: list[bool] = []

    def time_rounds(launchers, **kw):
        gc.collect()
        for replay in launchers.values():
            replay()
        return {n: [1.0] for n in launchers}, []

    monkeypatch.setattr(C, "PrefetchController", Ctl)
    monkeypatch.setattr(D, "capture", lambda fn, device: (fn(), Graph(fn))[1])
    monkeypatch.setattr(D, "time_rounds", time_rounds)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)

    class Weights:
        layers, dtype_name = 3, "bf16"
        shape = ModelShape("tiny", hidden=64, heads=4, kv_heads=2, head_size=16, intermediate=96)

        def prefetch_tensors(self, i):
            return [FakeTensor(0x10000000 + i * 0x100000, 4096)]

    class Step:
        batch, context, kernel, w = 1, 16, "v1", Weights()
        out = torch.zeros(4)
        add_prefetch = DecodeStep.add_prefetch

        def step(self, lib, ctl=None, fork="attn", join="step"):
            if ctl is not None:
                for i in range(self.w.layers):
                    ctl.fork("attn", i, self.batch)
                ctl.join()

        def attention_only(self, lib):
            pass

    wpf = WeightPrefetch()
    variants = [("stock", "stock", None), ("a+wpf", "stock", wpf), ("b+wpf", "stock", wpf), ("c+wpf", "stock", wpf)]
    try:
        D.measure_point(Step(), variants, {"stock": object()}, None, "cpu", rounds=1, reps=3, round_seconds=0.1,
                        flush=lambda: None, cold=False)  # fmt: skip
    except (AttributeError, KeyError, TypeError):
        pass  # the report's environment needs a GPU; the replays are what this test reads
    assert len(replays) >= 6 and all(replays), replays
