"""What a build reads and writes on the machine. The tree files a build reads itself (vLLM's launcher ``paged_attention_v1.cu``, every file the
header reaches by ``#include``) are read only as regular files of bounded size: a FIFO, a device
or a huge file there is one PatchError naming it (exit 4), never a read that blocks or never
ends. Each read runs in a thread the test gives up on (and unblocks) if it hangs. A full disk, a
full quota or a path too long while nvcc compiles or links (its tools say so, or writing the
object or the logs fails so) is said as that, exit 1 or 2, never as a failed build (exit 5)."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Callable

import pytest

from kvpatch.arch import Arch
from kvpatch.errors import BuildError, PatchError
from kvpatch.fsutil import DiskFullError, PathTooLongError
from kvpatch.jit import Toolchain, library, source_closure, vllm_kernel_set
from kvpatch.jit.library import Processes, build_libraries
from kvpatch.jit.prefetch_plan import PrefetchPlan
from kvpatch.source.includes import MAX_BYTES

HEADER_REL = "attention/attention_kernels.cuh"
HEADER_TEXT = '#include "attention_utils.cuh"\n#include "../cuda_compat.h"\n// the kernels\n'


def _within(seconds: float, fn: Callable[[], object], fifo: Path | None = None) -> object:
    """``fn()``'s result, or its exception raised here; the test fails if it runs longer than
    ``seconds`` (a reader blocked on ``fifo`` is released first, so the test run goes on)."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if fifo is not None:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the blocked reader sees end of file
        thread.join(5)
        pytest.fail(f"reading the tree's files blocked (> {seconds} s)")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


def _huge(path: Path, size: int) -> None:
    """A sparse file of ``size`` bytes (no disk used)."""
    with open(path, "wb") as f:
        f.truncate(size)


def _csrc(tmp_path: Path) -> Path:
    csrc = tmp_path / "csrc"
    (csrc / "attention").mkdir(parents=True)
    (csrc / "attention" / "attention_utils.cuh").write_text("// utils\n")
    (csrc / "cuda_compat.h").write_text("// compat\n")
    return csrc


def test_the_closure_reads_the_headers_includes(tmp_path: Path) -> None:
    files = source_closure(_csrc(tmp_path), HEADER_TEXT, HEADER_REL)
    assert files == {HEADER_REL: HEADER_TEXT, "attention/attention_utils.cuh": "// utils\n",
                     "cuda_compat.h": "// compat\n"}  # fmt: skip


def test_a_fifo_the_header_includes_is_refused_by_the_build(tmp_path: Path) -> None:
    csrc = _csrc(tmp_path)
    fifo = csrc / "attention" / "attention_utils.cuh"
    fifo.unlink()
    os.mkfifo(fifo)
    with pytest.raises(PatchError, match=r"attention_utils\.cuh \(included by attention/attention_kernels\.cuh\) "
                                         r"is a FIFO, not a regular file"):  # fmt: skip
        _within(10, lambda: source_closure(csrc, HEADER_TEXT, HEADER_REL), fifo)


def test_includes_past_the_bound_are_refused_by_the_build(tmp_path: Path) -> None:
    csrc = _csrc(tmp_path)
    _huge(csrc / "cuda_compat.h", MAX_BYTES + 1)
    with pytest.raises(PatchError, match=rf"cuda_compat\.h .* over {MAX_BYTES} bytes"):
        _within(30, lambda: source_closure(csrc, HEADER_TEXT, HEADER_REL))


def test_an_include_that_is_not_utf8_is_refused_by_the_build(tmp_path: Path) -> None:
    csrc = _csrc(tmp_path)
    (csrc / "cuda_compat.h").write_bytes(b"// \xff\n")
    with pytest.raises(PatchError, match=r"cuda_compat\.h \(included by .*\) is not UTF-8"):
        source_closure(csrc, HEADER_TEXT, HEADER_REL)


def _launcher(tmp_path: Path) -> Path:
    launcher = tmp_path / "vllm" / "csrc" / "attention" / "paged_attention_v1.cu"
    launcher.parent.mkdir(parents=True)
    return launcher


def test_a_fifo_as_the_launcher_is_refused_when_its_kernel_set_is_read(tmp_path: Path) -> None:
    launcher = _launcher(tmp_path)
    os.mkfifo(launcher)
    with pytest.raises(PatchError, match=r"paged_attention_v1\.cu is a FIFO, not a regular file"):
        _within(10, lambda: vllm_kernel_set(tmp_path / "vllm"), launcher)


def test_a_launcher_past_the_bound_is_refused_when_its_kernel_set_is_read(tmp_path: Path) -> None:
    _huge(_launcher(tmp_path), MAX_BYTES + 1)
    with pytest.raises(PatchError, match=rf"paged_attention_v1\.cu is {MAX_BYTES + 1} bytes"):
        _within(30, lambda: vllm_kernel_set(tmp_path / "vllm"))


# --------------------------------------------------------------------------- a full disk while building


def _plan(tmp_path: Path) -> PrefetchPlan:
    return PrefetchPlan("// kernel\n", "marker", (Arch(9, 0, "a"),), "release 13.0", tmp_path / "cache")


def _nvcc(fail_at: str, log: str) -> Callable[..., tuple[int, str]]:
    """A stand-in for nvcc's runs: the compile writes its object, and the step ``fail_at``
    ("compile" or "link") exits 1 printing ``log``."""

    def run(self: Processes, argv: list[str], cwd: Path) -> tuple[int, str]:
        step = "compile" if "-c" in argv else "link"
        if step == fail_at:
            return 1, log
        (cwd / argv[argv.index("-o") + 1]).write_bytes(b"\0")
        return 0, ""

    return run


def _build(plan: PrefetchPlan) -> None:
    build_libraries([plan], tc=Toolchain(Path("nvcc"), "release 13.0", ()), tools=None, jobs=1)  # type: ignore[arg-type]


#: What the tools nvcc runs print when the disk, the quota or a name runs out (as GNU as and ld do).
LOGS = {
    "link": "/usr/bin/ld: final link failed: {words}\ncollect2: error: ld returned 1 exit status\n",
    "compile": "/tmp/tmpxft_0001.s: Assembler messages:\n/tmp/tmpxft_0001.s: Fatal error: l2_prefetch.o.tmp: {words}\n",
}


@pytest.mark.parametrize("step", ["compile", "link"])
@pytest.mark.parametrize("words, kind, code", [("No space left on device", DiskFullError, 1),
                                               ("Disk quota exceeded", DiskFullError, 1),
                                               ("File name too long", PathTooLongError, 2)])  # fmt: skip
def test_a_full_disk_while_nvcc_builds_is_said_so_not_a_failed_build(step: str, words: str, kind: type, code: int,
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    plan = _plan(tmp_path)
    monkeypatch.setattr(Processes, "run", _nvcc(step, LOGS[step].format(words=words)))
    with pytest.raises(kind) as caught:
        _build(plan)
    message = str(caught.value)
    assert caught.value.exit_code == code and not isinstance(caught.value, BuildError)
    assert message.startswith(words) and str(plan.dir) in message, message
    assert ("linking libkvpatch_l2_prefetch.so" if step == "link" else "compiling l2_prefetch.cu") in message
    assert "\n" not in message


def test_a_build_that_fails_for_its_code_is_still_a_failed_build(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(Processes, "run", _nvcc("link", "/usr/bin/ld: undefined reference to `kvpatch_x'\n"))
    with pytest.raises(BuildError, match="linking libkvpatch_l2_prefetch.so failed: .*undefined reference"):
        _build(_plan(tmp_path))


@pytest.mark.parametrize("code, kind", [(errno.ENOSPC, DiskFullError), (errno.ENAMETOOLONG, PathTooLongError)])
def test_a_full_disk_writing_a_compiled_shard_is_said_so(code: int, kind: type, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    real = library.write_if_different

    def write(path: Path, text: str) -> object:
        if Path(path).name == "ptxas.log":
            raise OSError(code, os.strerror(code), str(path))
        return real(path, text)

    monkeypatch.setattr(Processes, "run", _nvcc("none", ""))
    monkeypatch.setattr(library, "write_if_different", write)
    with pytest.raises(kind, match=rf"^{os.strerror(code)} compiling l2_prefetch\.cu: .*ptxas\.log"):
        _build(_plan(tmp_path))
