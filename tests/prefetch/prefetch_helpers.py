"""Fakes for PrefetchController without a GPU: a tensor-like (a device, an address, a size), a
stream/event API that logs every call, and a library that logs every launch."""

from __future__ import annotations

from contextlib import contextmanager

from kvpatch.prefetch import PrefetchController

MiB = 1 << 20


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
    """Logs ``("launch", table, rows, grid, stream, *sorted options)`` for each launch."""

    def __init__(self, api):
        self.api = api

    def launch(self, table_ptr, rows, grid, stream_ptr, **options):
        self.api.log.append(("launch", table_ptr, rows, grid, stream_ptr, *sorted(options.items())))


def controller(**kw):
    """A controller on the fake API and library (``capability=`` the GPU's), its log cleared."""
    api = FakeAPI(kw.pop("capability", (9, 0)))
    ctl = PrefetchController("cuda:0", library=FakeLibrary(api), api=api, **kw)
    api.log.clear()
    return ctl, api


# --------------------------------------------------------------------------- one shared log


class LogStream:
    """A stream whose waits land in a shared ``log`` (by stream name only)."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait_event(self, event):
        self.log.append(("wait_event", self.name))

    def wait_stream(self, other):
        self.log.append(("wait_stream", self.name, other.name))


class LogEvent:
    def __init__(self, log):
        self.log = log

    def record(self, stream=None):
        self.log.append(("record", getattr(stream, "name", None)))


class LoggingAPI:
    """PrefetchController's stream/event adapter on ``device`` whose every call is a tuple in
    ``log`` (a list shared with :class:`LoggingLibrary`, and with whatever else a test passes it
    to); ``tables`` holds the ranges of every table made."""

    def __init__(self, log=None, device="cuda:0"):
        self.log = [] if log is None else log
        self.device = device
        self.tables: list[list[tuple[int, int]]] = []
        self.main = LogStream(self.log, "main")

    def normalize(self, device):
        return self.device

    def capability(self, device):
        return (9, 0)

    def new_stream(self, device, priority):
        return LogStream(self.log, "side")

    def new_event(self):
        return LogEvent(self.log)

    def current_stream(self, device):
        return self.main

    def handle(self, stream):
        return {"main": 0x1111, "side": 0x2222}[stream.name]

    def make_table(self, ranges, device):
        self.tables.append(list(ranges))
        return FakeTable(0x7000 + 0x100 * len(self.tables))

    @contextmanager
    def device_guard(self, device):
        yield


class LoggingLibrary:
    """A prefetch library with the demote build's run modes that logs each launch into ``log``."""

    modes = ("prefetch", "demote")
    config = "chunk=4096,line=128,hint=evict_last,threads=32,demote"

    def __init__(self, log):
        self.log = log

    def launch(self, table_ptr, rows, grid, stream, **options):
        self.log.append(("launch", table_ptr, rows, grid, stream, tuple(sorted(options.items()))))

    def run(self, table_ptr, rows, grid, stream, *, mode, **options):
        self.log.append(("run", mode, table_ptr, rows, grid, stream, tuple(sorted(options.items()))))


def logging_controller(device="cuda:0", **kw):
    """A PrefetchController on :class:`LoggingAPI` and :class:`LoggingLibrary`: every stream call
    and launch lands in ``api.log``."""
    api = LoggingAPI(device=device)
    return PrefetchController(device, library=LoggingLibrary(api.log), api=api, **kw), api


# --------------------------------------------------------------------------- what C receives


class FakeCLibrary:
    """What ``ctypes.CDLL`` gives for a prefetch library (``prefix=None``) or a weight-tail library
    (its ``prefix``): the launchers and the table setter are ctypes function pointers to Python
    callbacks, so each argument goes through ctypes' conversion exactly as it would on its way to
    C, and ``calls`` holds what the C side receives; the functions without arguments are plain
    Python. ``path`` is what ``ctypes.CDLL`` was given."""

    def __init__(self, path, prefix=None):
        import ctypes

        self.path, self.calls = path, []
        c_int, c_ll, c_ptr = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p

        def c_function(name, *argtypes):
            def body(*args):
                self.calls.append((name, *args))
                return 0

            setattr(self, name, ctypes.CFUNCTYPE(c_int, *argtypes)(body))

        if prefix is None:
            self.kvpatch_l2_prefetch_abi_version = lambda: 2
            self.kvpatch_l2_prefetch_config = lambda: b"chunk=4096,line=128,hint=evict_last,threads=32,demote"
            self.kvpatch_l2_prefetch_error_string = lambda code: b"error"
            c_function("kvpatch_l2_prefetch", c_ptr, c_int, c_int, c_ptr)
            c_function("kvpatch_l2_prefetch_ex", c_ptr, c_int, c_int, c_int, c_ll, c_int, c_ptr)
            c_function("kvpatch_l2_prefetch_run", c_ptr, c_int, c_int, c_int, c_ll, c_int, c_int, c_ptr)
        else:

            def set_table(rows, count, hint, chunk, stream):  # the rows as the C side reads them
                table = ctypes.cast(rows, ctypes.POINTER(c_ll))[: 3 * count] if count > 0 else []
                self.calls.append(("set", tuple(table), count, hint, chunk, stream))
                return 0

            setattr(
                self,
                f"{prefix}_set_weight_prefetch",
                ctypes.CFUNCTYPE(c_int, c_ptr, c_int, c_int, c_ll, c_ptr)(set_table),
            )
            setattr(self, f"{prefix}_weight_tail_max_rows", lambda: 4)


def fake_cdll(monkeypatch, prefix=None):
    """``ctypes.CDLL`` replaced by one that gives a :class:`FakeCLibrary`; returns the list of the
    libraries it gave."""
    import ctypes

    made = []

    def cdll(path, *args, **kwargs):
        made.append(FakeCLibrary(path, prefix))
        return made[-1]

    monkeypatch.setattr(ctypes, "CDLL", cdll)
    return made
