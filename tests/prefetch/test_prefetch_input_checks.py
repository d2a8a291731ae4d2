"""The weight-prefetch API's input: counts are ints (never coerced: '16' is not buckets 1 and
6), tensors come as a list (a tensor is not iterated row by row), launch options are checked
before ctypes sees them, and a machine without a GPU is said in one line. A library path that is
not a regular file is refused before dlopen (a FIFO blocked it forever); addresses, streams and
counts reach C only as ints the C type holds (ctypes wrapped 2**64 + 0x1000 to 0x1000, truncated
2.7 to 2 and passed a str as the address of its buffer)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from prefetch_helpers import FakeAPI, FakeLibrary, FakeTensor, MiB, controller, fake_cdll

from kvpatch.errors import UsageError


def _controller():
    from kvpatch.prefetch.controller import PrefetchController

    api = FakeAPI()
    return PrefetchController("cuda:0", api=api, library=FakeLibrary(api)), api


def test_prefetch_controller_checks_grid_and_batch_where_given() -> None:
    ctl, _ = _controller()
    w = FakeTensor(1 << 20, 1 << 16)
    for bad in (-3, 0, "8", True, 2.0):
        with pytest.raises(UsageError, match="prefetch grid"):
            ctl.add("p", 0, [w], grid=bad)
    ctl.add("p", 0, [w], batches={4: None, 16: None}, grid=5)
    assert ctl.table("p", 0, 3).grid == 5
    for bad in (0, -5, 1.5, "2", True):
        with pytest.raises(ValueError, match="batch must be"):
            ctl.fork("p", 0, bad)


def test_prefetch_controller_add_takes_counts_as_ints_only() -> None:
    """add() coerced with int(): batches='16' became buckets 1 and 6, a cap of 0.9 turned a
    batch off, {2.7: cap} became bucket 2; a tensor for the list gave one row per element."""
    from kvpatch.prefetch.controller import PrefetchController

    ctl, api = _controller()
    w = FakeTensor(1 << 20, 1 << 16)
    bad = [({"batches": "16"}, "batches must be"), ({"batches": 8}, "batches must be"),
           ({"batches": {2.7: 1 << 20}}, "batch must be an int"), ({"batches": {"4": 1 << 20}}, "batch must be an int"),
           ({"batches": {True: 1 << 20}}, "batch must be an int"), ({"batches": {1: 0.9}}, "must be an int"),
           ({"batches": {1: "32"}}, "must be an int"), ({"batches": {1: float("nan")}}, "must be an int"),
           ({"cap_bytes": 0}, "cap_bytes must be positive"), ({"cap_bytes": 1.5e6}, "cap_bytes must be an int")]  # fmt: skip
    for i, (kw, message) in enumerate(bad):
        with pytest.raises(ValueError, match=message):
            ctl.add("p", i, [w], **kw)
    with pytest.raises(ValueError, match="not a tensor"):
        ctl.add("p", 100, w)
    with pytest.raises(ValueError, match="expected tensors, got str"):
        ctl.add("p", 101, [w, "w"])
    ctl.add("p", 0, [w])  # nothing above was registered
    for batch in (0, -3, 2.5, "1", True):
        with pytest.raises(ValueError, match="batch must be"):
            ctl.fork("p", 0, batch)  # a window without buckets checks batch= too
    assert ctl.fork("p", 0, 7)
    for kw in ({"enabled": "false"}, {"enabled": 0}, {"grid": 2**31}, {"library": object()}):
        with pytest.raises(UsageError):
            PrefetchController("cuda:0", api=api, **({"library": FakeLibrary(api)} | kw))


def test_weight_ranges_refuses_a_tensor_for_a_list_and_odd_caps() -> None:
    from kvpatch.prefetch import weight_ranges

    w = FakeTensor(1 << 20, 4096)
    with pytest.raises(ValueError, match="not a tensor"):
        weight_ranges(w)
    with pytest.raises(ValueError, match="expected tensors, got str"):
        weight_ranges([w, "weight"])
    for cap in ("4096", 4096.0, float("nan"), True):
        with pytest.raises(ValueError, match="cap_bytes must be an int"):
            weight_ranges([w], cap)
    assert weight_ranges([w], 1024) == [(1 << 20, 1024)]


def test_prefetch_launch_options_are_checked_before_ctypes() -> None:
    from kvpatch.prefetch.kernel import check_launch

    with pytest.raises(UsageError, match="threads must be an int"):
        check_launch(threads="64")


@pytest.mark.slow  # imports torch
def test_a_range_at_address_0_is_refused() -> None:
    pytest.importorskip("torch")
    from kvpatch.prefetch.ranges import range_table

    with pytest.raises(ValueError, match="address 0"):
        range_table([(0, 4096)])


@pytest.mark.slow  # imports torch
def test_prefetch_controller_without_a_gpu_says_so() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("checks the machine without a GPU")
    from kvpatch.prefetch import PrefetchController

    with pytest.raises(UsageError, match="no CUDA GPU visible.*enabled=False"):
        PrefetchController("cuda")
    assert PrefetchController("cuda", enabled=False).fork("p", 0) is False


# --------------------------------------------------------------------------- library files


#: Loads ``sys.argv[1]`` every way the runtime dlopens a library it is given and prints what each
#: raised, one line each: run in its own process, as a blocked dlopen holds the GIL.
LOAD_EVERY_WAY = """
import os, sys
from kvpatch import abi
from kvpatch.prefetch import kernel as K
from kvpatch.prefetch.tail import WeightTail

os.environ[K.LIBRARY_ENV] = path = sys.argv[1]
for name, load in (("PrefetchLibrary", lambda: K.PrefetchLibrary(path)),
                   ("$KVPATCH_PREFETCH_LIB", lambda: K.load_prefetch_library(capability=(9, 0))),
                   ("WeightTail", lambda: WeightTail(path, "kvp")), ("abi.load", lambda: abi.load(path, "kvp"))):
    try:
        load()
    except Exception as e:
        print(name, type(e).__name__, e, sep="|", flush=True)
"""


def _load_every_way(path: Path, cwd: Path) -> list[list[str]]:
    """``[loader, error type, message]`` per loader (:data:`LOAD_EVERY_WAY`), the test failed if it hangs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPATCH_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    try:
        proc = subprocess.run([sys.executable, "-c", LOAD_EVERY_WAY, str(path)], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading {path} hung (> 60 s)")
    assert proc.returncode == 0, proc.stderr
    return [line.split("|") for line in proc.stdout.splitlines()]


@pytest.mark.slow  # a new process per case (a hang fails it instead of the run)
@pytest.mark.parametrize("kind, words", [("fifo", "a FIFO"), ("socket", "a socket"), ("device", "a character device"),
                                         ("directory", "a directory")])  # fmt: skip
def test_a_library_that_is_not_a_regular_file_is_one_line_before_dlopen(kind, words, tmp_path, monkeypatch) -> None:
    """Before: ctypes.CDLL of a FIFO blocked forever (dlopen opens it for reading, holding the
    GIL), a socket, a device or a directory gave dlopen's error. After: every loader says it in
    one UsageError line naming the path, before dlopen."""
    monkeypatch.chdir(tmp_path)  # a socket's path is limited to ~108 bytes: bound by its short name
    path = tmp_path / "lib.so"
    keep = []
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        keep.append(socket.socket(socket.AF_UNIX))
        keep[0].bind(path.name)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    try:
        got = _load_every_way(path, tmp_path)
    finally:
        for s in keep:
            s.close()
    library = {"PrefetchLibrary": "L2 prefetch", "$KVPATCH_PREFETCH_LIB": "L2 prefetch", "WeightTail": "weight-tail",
               "abi.load": "launcher"}  # fmt: skip
    assert got == [[name, "UsageError", f"the {what} library {str(path)!r} is {words}, not a library file"]
                   for name, what in library.items()]  # fmt: skip


@pytest.mark.slow  # a new process
def test_a_missing_library_is_one_line(tmp_path) -> None:
    got = _load_every_way(tmp_path / "absent.so", tmp_path)
    assert [error for _, error, _ in got] == ["BuildError", "BuildError", "BuildError", "AbiError"]
    assert all(re.fullmatch(r"cannot load the .* library .*/absent\.so: no such file", m) for _, _, m in got), got


def test_a_relative_library_path_is_the_file_under_the_working_directory(tmp_path, monkeypatch) -> None:
    """Before: PrefetchLibrary('./lib.so') asked dlopen for 'lib.so', which searches the library
    path, not the working directory. After: dlopen gets the absolute path of the file checked."""
    from kvpatch.prefetch.kernel import PrefetchLibrary

    made = fake_cdll(monkeypatch)
    monkeypatch.chdir(tmp_path)
    Path("lib.so").write_bytes(b"")
    PrefetchLibrary("./lib.so")
    assert made[0].path == str(tmp_path / "lib.so")


# --------------------------------------------------------------------------- what C receives


def test_prefetch_launches_pass_only_addresses_and_counts_the_c_types_hold(tmp_path, monkeypatch) -> None:
    """Before: launch(2**64 + 0x1000, 2.7, 4, 2**64) reached C as table 0x1000, rows 2, stream 0;
    '3' was a row count and a str a table (its buffer's address). After: a UsageError naming the
    argument, and nothing reaches C."""
    from kvpatch.prefetch.kernel import PrefetchLibrary

    made = fake_cdll(monkeypatch)
    (tmp_path / "lib.so").write_bytes(b"")
    lib = PrefetchLibrary(tmp_path / "lib.so")
    c = made[0].calls
    lib.launch(0x7000, 3, 4, 2**64 - 1)
    lib.launch(0x7000, 3, 4, 0, threads=64)
    lib.run(0x7000, 0, 4, 0x2222, mode="demote")
    assert c == [("kvpatch_l2_prefetch", 0x7000, 3, 4, 2**64 - 1),
                 ("kvpatch_l2_prefetch_ex", 0x7000, 3, 4, 64, 0, -1, None),
                 ("kvpatch_l2_prefetch_run", 0x7000, 0, 4, 0, 0, -1, 1, 0x2222)]  # fmt: skip
    c.clear()
    good = {"table_ptr": 0x7000, "rows": 3, "grid": 4, "stream_ptr": 0x2222}
    bad = [("table_ptr", 2**64 + 0x1000), ("table_ptr", -1), ("table_ptr", "0x7000"), ("table_ptr", b"\0" * 8),
           ("table_ptr", 28672.0), ("table_ptr", None), ("rows", 2.7), ("rows", "3"), ("rows", True), ("rows", 2**32 + 3),
           ("grid", 4.0), ("grid", 2**31), ("stream_ptr", 2**64), ("stream_ptr", -1), ("stream_ptr", "x"),
           ("stream_ptr", False)]  # fmt: skip
    for name, value in bad:
        args = {**good, name: value}
        for call, kw in ((lib.launch, {}), (lib.launch, {"hint": "none"}), (lib.run, {"mode": "prefetch"})):
            with pytest.raises(UsageError, match=f"^prefetch launch: {name} must be "):
                call(**args, **kw)
    assert c == []


def test_weight_tail_rows_and_stream_reach_c_only_as_ints_it_holds(tmp_path, monkeypatch) -> None:
    """Before: WeightTail.set truncated a float address (int(x)), a NaN was a bare ValueError, and
    a stream 'x', 2**70 or -1 went on to ctypes. After: a UsageError, and nothing reaches C."""
    from kvpatch.prefetch.tail import WeightTail

    made = fake_cdll(monkeypatch, prefix="kvp")
    (tmp_path / "lib.so").write_bytes(b"")
    tail = WeightTail(tmp_path / "lib.so", "kvp")
    c, K = made[0].calls, 1 << 20
    tail.set([(K, 2 * K, 4096)], stream=2**64 - 1)
    assert c == [("set", (K, 2 * K, 4096), 1, 1, 65536, 2**64 - 1)]
    c.clear()
    for rows in ([(K, 2 * K + 0.9, 4096)], [(K, 2 * K, float("nan"))], [(K, "2097152", 4096)], [(True, 2 * K, 4096)],
                 [(2**64 + K, 2 * K, 4096)]):  # fmt: skip
        with pytest.raises(UsageError, match=r"^weight-tail row .*: each value must be a 64-bit int, not "):
            tail.set(rows)
    for stream in ("x", 2**70, -1, 1.0, None):
        with pytest.raises(UsageError, match="^weight-tail stream must be an address"):
            tail.set([(K, 2 * K, 4096)], stream=stream)
    with pytest.raises(UsageError, match="^weight-tail stream"):
        tail.clear(stream=-1)
    assert c == [] and tail.rows == ((K, 2 * K, 4096),)


# --------------------------------------------------------------------------- the controller's arguments


def test_hinted_ranges_takes_a_list_of_known_hint_names() -> None:
    """Before: hinted_ranges('evict_last') made a set of characters and a misspelled hint matched
    nothing: both silently []. After: a str (as add's batches) and an unknown name are UsageErrors."""
    ctl, _ = controller()
    ctl.add("p", 0, [FakeTensor(0x10000000, MiB)], hint="evict_last")
    assert ctl.hinted_ranges(["evict_last"]) == ctl.hinted_ranges() == [(0x10000000, MiB)]
    assert ctl.hinted_ranges(("evict_first", "none")) == []
    with pytest.raises(UsageError, match=r"^hinted_ranges: hints must be a list of hint names .*not 'evict_last'$"):
        ctl.hinted_ranges("evict_last")
    with pytest.raises(UsageError, match="^hinted_ranges: hints must be"):
        ctl.hinted_ranges(None)
    with pytest.raises(
        UsageError, match="^hinted_ranges: unknown hint 'evict_lst': choose from evict_last, evict_normal"
    ):
        ctl.hinted_ranges(["evict_lst"])


def test_add_refuses_what_it_would_ignore_or_never_launch() -> None:
    """Before: cap_bytes beside a {batch: cap} mapping was ignored (64 MiB prefetched under a 1 MiB
    cap), merge='no' was true, no tensors or no batches registered a window that never launches
    (and took its key), an unhashable point was a bare TypeError. After: UsageErrors, nothing
    registered."""
    ctl, api = controller()
    w = FakeTensor(0x10000000, 64 * MiB)
    bad = [(("p", 0, [w]), {"cap_bytes": MiB, "batches": {1: None}}, "cap_bytes=1048576 beside batches="),
           (("p", 0, [w]), {"merge": "no"}, "merge must be True or False, not 'no'"),
           (("p", 0, [w]), {"merge": 1}, "merge must be True or False"),
           (("p", 0, []), {}, "no tensors"), (("p", 0, iter([])), {}, "no tensors"),
           (("p", 0, [w]), {"batches": {}}, "names no batch"), (("p", 0, [w]), {"batches": []}, "names no batch"),
           ((["p"], 0, [w]), {}, "must be hashable"), (("p", {0: 1}, [w]), {}, "must be hashable"),
           (("p", float("nan"), [w]), {}, "NaN equals nothing")]  # fmt: skip
    for args, kw, message in bad:
        with pytest.raises(UsageError, match=message):
            ctl.add(*args, **kw)
    assert api.tables == [] and ctl.table("p", 0) is None
    ctl.add("p", 0, [w], batches={1: MiB, 8: 0})  # the key is still free; a cap of 0 still turns a bucket off
    ctl.add("q", 0, [w], cap_bytes=MiB, batches=[1, 8], merge=True)  # cap_bytes with batch sizes: one cap
    assert api.tables == [[(0x10000000, MiB)], [(0x10000000, MiB)]]


@pytest.mark.slow  # imports torch
def test_prefetch_controller_device_is_checked_in_one_line() -> None:
    """Before (CPU torch): 'junk' and 'cuda:-1' were RuntimeErrors, None and ['cuda'] TypeErrors,
    0 'Cannot access accelerator device'. After: a UsageError naming the device, and an index or
    'cuda:N' without a GPU the same line 'cuda' gives."""
    torch = pytest.importorskip("torch")
    from kvpatch.prefetch import PrefetchController

    for device in ("junk", "cuda:-1", "cuda:x", None, ["cuda"], True, -1, 1.0):
        with pytest.raises(
            UsageError, match=f"^PrefetchController: device must be .*, not {device!r}$".replace("[", "\\[")
        ):
            PrefetchController(device)
    with pytest.raises(UsageError, match="needs a CUDA device, not cpu"):
        PrefetchController(torch.device("cpu"))
    if torch.cuda.is_available():
        return
    for device in ("cuda", 0, 3, "cuda:1", torch.device("cuda", 2)):
        with pytest.raises(UsageError, match="^PrefetchController: no CUDA GPU visible .*enabled=False"):
            PrefetchController(device)


@pytest.mark.slow  # imports torch
def test_a_cuda_index_beyond_the_gpus_is_one_line(monkeypatch) -> None:
    """Before: 'cuda:3' on a one-GPU machine reached torch.cuda.get_device_capability (its own
    error). After: a UsageError saying how many GPUs torch sees."""
    torch = pytest.importorskip("torch")
    from kvpatch.prefetch.cuda_api import TorchCudaAPI

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert TorchCudaAPI().normalize("cuda:0") == TorchCudaAPI().normalize(0) == "cuda:0"
    for device in ("cuda:3", 1, torch.device("cuda", 1)):
        with pytest.raises(UsageError, match=r"^PrefetchController: no CUDA GPU cuda:\d: torch sees 1$"):
            TorchCudaAPI().normalize(device)


def test_every_refusal_of_the_runtime_is_a_kvpatch_error_and_names_what_was_given() -> None:
    """Before: some refusals were a plain ValueError (a caller catching KvpatchError missed them
    beside the UsageErrors of the same call), a module or None for the tensor list was a bare
    TypeError, an unhashable window key at fork() or table() too, and a sparse tensor reached
    torch's RuntimeError. After: each a UsageError (those that were ValueErrors still are)."""
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    from kvpatch.errors import ArgumentError, KvpatchError
    from kvpatch.prefetch import weight_ranges

    ctl, _ = _controller()
    w = FakeTensor(1 << 20, 1 << 16)
    for tensors, message in ((None, "not NoneType"), (5, "not int"), (torch.nn.Linear(4, 4), "list(module.parameters())"),
                             ([torch.randn(4, 4).to_sparse()], "sparse or nested")):  # fmt: skip
        with pytest.raises(ArgumentError, match=re.escape(message)):
            weight_ranges(tensors)
    with pytest.raises(KvpatchError, match="must be hashable"):
        ctl.fork(["p"], 0)
    with pytest.raises(KvpatchError, match="must be hashable"):
        ctl.table({}, 0)
    with pytest.raises(ArgumentError, match="cap_bytes must be positive"):
        ctl.add("p", 0, [w], cap_bytes=0)
    ctl.add("p", 0, [w], batches=[8])
    with pytest.raises(ArgumentError, match="already added"):
        ctl.add("p", 0, [w])
    assert issubclass(ArgumentError, ValueError) and issubclass(ArgumentError, UsageError)
    # a numpy integer is an int wherever an int is taken; a bool or a one-element array never
    ctl.add("q", 0, [w], grid=np.int64(4))
    assert ctl.table("q", 0).grid == 4
    for batch in (torch.tensor(True), torch.tensor([5]), np.array([5])):
        with pytest.raises(ArgumentError, match="batch must be an int"):
            ctl.fork("p", 0, batch)


def test_the_libraries_refuse_what_is_no_path_or_no_name_in_one_line() -> None:
    """Before: PrefetchLibrary(None) and WeightTail(None, ...) were Path()'s TypeError, and a list
    for a hint was 'unhashable'. After: a UsageError naming what was given."""
    from kvpatch.prefetch.kernel import PrefetchLibrary, check_launch
    from kvpatch.prefetch.tail import WeightTail

    with pytest.raises(UsageError, match="the L2 prefetch library must be a path"):
        PrefetchLibrary(None)
    with pytest.raises(UsageError, match="the weight-tail library must be a path"):
        WeightTail(None, "kvp")
    with pytest.raises(UsageError, match="hint"):
        check_launch(hint=[])


def test_the_range_functions_refuse_what_they_would_misread() -> None:
    """Before: weight_ranges took merge='no' as true and merged; a meta tensor (no memory) gave a
    range at its made-up address; range_table's refusal of a float crashed in its own message
    (ValueError: Unknown format code 'x'). After: a one-line ArgumentError each."""
    from kvpatch.errors import ArgumentError
    from kvpatch.prefetch.ranges import range_table, weight_ranges

    w = FakeTensor(0x10000000, 64 * MiB)
    with pytest.raises(ArgumentError, match="^weight_ranges: merge must be True or False, not 'no'$"):
        weight_ranges([w, w], merge="no")
    assert weight_ranges([w, w], merge=True) == [(0x10000000, 64 * MiB)]
    torch = pytest.importorskip("torch")
    with pytest.raises(ArgumentError, match="^weight_ranges: a meta tensor has no memory to prefetch"):
        weight_ranges([torch.empty(1024, device="meta")])
    for bad in [(16.5, 16), (16, "16"), (None, 16)]:
        with pytest.raises(ArgumentError, match=r"^bad range \(.*\): addresses and sizes are ints$"):
            range_table([bad])
    assert range_table([(16, 32)]).tolist() == [[16, 32]]
