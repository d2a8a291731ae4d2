"""Shared fixtures: the small fixture headers, git trees made from them, the release
cache for the network tests, and an nvcc helper for the PTX checks."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

import pytest
from rich.console import Console

from kvpatch.errors import FetchError
from kvpatch.source.releases import HEADER  # imports nothing: conftest loads without GitPython too

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "golden"

#: The fixture headers (see tests/fixtures/): the stock shape, and the same code laid out
#: differently (Allman braces, tabs, line breaks and comments inside statements).
STOCK = "attention_kernels.cuh"

#: The names kvpatch.patch.sites must find in each loop, in the fixtures and in every vLLM
#: release alike.
LOOP_NAMES = {
    "loop_var": "block_idx",
    "stride_expr": "NUM_WARPS",
    "end_expr": "end_block_idx",
    "block_table_var": "block_table",
    "block_number_var": "physical_block_number",
    "block_stride_expr": "kv_block_stride",
    "head_offset_expr": "kv_head_idx * kv_head_stride",
}

REFORMATTED = "attention_kernels_reformatted.cuh"


def in_thread(fn: Callable[[], object], timeout: float) -> tuple[bool, BaseException | None]:
    """Run ``fn`` in a daemon thread: (finished within ``timeout``, what it raised). A call that
    blocks (a FIFO read) leaves the thread behind instead of the test run."""
    box: list = [None]

    def body() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box[0] = e

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive(), box[0]


def fixture_text(name: str = STOCK) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def golden_diff(name: str) -> str:
    """A golden file: the unified diff the fixture header gets from one configuration."""
    return (GOLDEN / f"{name}.diff").read_text(encoding="utf-8")


@functools.cache
def golden_text(name: str) -> str:
    """The patched fixture header a golden diff describes (the diff applied to the fixture)."""
    return apply_unified_diff(fixture_text(), golden_diff(name))


def apply_unified_diff(text: str, diff: str) -> str:
    """``text`` with a one-file unified diff applied; its context and removed lines are checked."""
    old = text.splitlines(keepends=True)
    out: list[str] = []
    pos = 0
    lines = diff.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        m = re.match(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", lines[i])
        i += 1
        if not m:
            continue
        start = int(m.group(1)) - (0 if m.group(2) == "0" else 1)
        out += old[pos:start]
        pos = start
        while i < len(lines) and not lines[i].startswith("@@"):
            line = lines[i]
            i += 1
            tag, body = line[:1], line[1:]
            if tag == "\\":  # "No newline at end of file": the line before has none
                out[-1] = out[-1].removesuffix("\n")
                continue
            if tag in (" ", "-"):
                assert old[pos] == body, f"the golden diff does not apply at line {pos + 1}"
                pos += 1
            if tag in (" ", "+"):
                out.append(body)
    return "".join(out + old[pos:])


def git(cwd: Path, *args: str, text: bool = True) -> str | bytes:
    """git with a fixed identity and none of the user's configuration."""
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "kvpatch-tests",
        "GIT_AUTHOR_EMAIL": "tests@kvpatch",
        "GIT_COMMITTER_NAME": "kvpatch-tests",
        "GIT_COMMITTER_EMAIL": "tests@kvpatch",
    }
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=text, check=True)
    return proc.stdout


def make_tree(root: Path, header_text: str, *, commit: bool = True) -> Path:
    """A vLLM-shaped tree at ``root`` holding ``header_text`` as the attention header."""
    header = root / HEADER
    header.parent.mkdir(parents=True, exist_ok=True)
    header.write_bytes(header_text.encode("utf-8"))
    if commit:
        git(root, "init", "-q", "-b", "main")
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", "stock")
    return root


@pytest.fixture(scope="session")
def header_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Where the stock fixture header sits in a tmp tree (the path libclang is told about;
    the text parsed is always the one passed in, so tests may parse other texts there)."""
    return str(make_tree(tmp_path_factory.mktemp("fixture-tree"), fixture_text(), commit=False) / HEADER)


@pytest.fixture
def git_tree(tmp_path: Path) -> Path:
    """A git work tree whose committed header is the stock fixture."""
    return make_tree(tmp_path / "vllm", fixture_text())


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The directory kvpatch runs in (where it keeps .kvpatch/state.json)."""
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def applied(git_tree: Path, work: Path) -> Path:
    """The fixture tree, patched with the default configuration from ``work``."""
    from cli.cli_helpers import run_cli

    assert run_cli("apply", "--tree", str(git_tree), cwd=work).returncode == 0
    return git_tree


# --------------------------------------------------------------------------- releases


@pytest.fixture(scope="session")
def release_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``$KVPATCH_CACHE`` if set, else a directory in pytest's cache (kept between runs)."""
    env = os.environ.get("KVPATCH_CACHE")
    if env:
        return Path(env).expanduser()
    cache = getattr(request.config, "cache", None)
    if cache is not None:
        return Path(cache.mkdir("kvpatch-cache"))
    return tmp_path_factory.mktemp("kvpatch-cache")


@pytest.fixture(scope="session")
def vllm_release(release_cache: Path) -> Callable[[str], Path]:
    """``get(version)`` -> the cached release tree; skips only when there is no network."""
    trees: dict[str, Path] = {}

    def get(version: str) -> Path:
        if version not in trees:
            try:
                from kvpatch.source.fetch import fetch_release

                trees[version] = fetch_release(
                    version, cache=release_cache, console=Console(stderr=True), git_timeout=30
                )
            except FetchError as e:
                if str(e).startswith("no network"):
                    pytest.skip(f"vLLM {version} is not cached and cannot be fetched: {e}")
                raise
        return trees[version]

    return get


# --------------------------------------------------------------------------- reformatting


def clang_format_binary() -> str | None:
    """clang-format on PATH, or the one ``pip install clang-format`` put beside python."""
    found = shutil.which("clang-format")
    if found:
        return found
    beside = Path(sys.executable).parent / "clang-format"
    return str(beside) if beside.is_file() else None


CLANG_FORMAT_STYLE = (
    "{BasedOnStyle: LLVM, ColumnLimit: 120, BreakBeforeBraces: Allman, IndentWidth: 4, SortIncludes: Never}"
)


def reformat_with_clang_format(text: str) -> str:
    binary = clang_format_binary()
    if binary is None:
        pytest.skip("clang-format is not installed (pip install clang-format)")
    proc = subprocess.run(
        [binary, f"--style={CLANG_FORMAT_STYLE}", "--assume-filename=attention_kernels.cuh"],
        input=text, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return proc.stdout


def reformat_without_clang_format(text: str) -> str:
    """Double the indentation and move the ``{`` of ``... ) {`` lines onto a line of its own.

    Only code lines are touched: not preprocessor lines, macro continuations or lines
    holding a ``//`` comment, so the token stream stays the same.
    """
    out: list[str] = []
    previous = ""
    for line in text.split("\n"):
        stripped = line.lstrip(" ")
        indent = " " * (2 * (len(line) - len(stripped)))
        code = not stripped.startswith("#") and not previous.endswith("\\") and "//" not in line
        if code and stripped.endswith(") {") and not stripped.startswith(("}", "/*", "*")):
            out.append(indent + stripped[:-2])
            out.append(indent + "{")
        else:
            out.append(indent + stripped if stripped else "")
        previous = line
    return "\n".join(out)


_STATEMENT_STARTS = re.compile(r"^(\s*)(for \(|if \(|const int64_t physical_block_number|const cache_t\s*\*)")


def insert_comments(text: str) -> str:
    """Put a comment line and a blank line before loops, ifs and the lines kvpatch reads."""
    out: list[str] = []
    previous = ""
    for line in text.split("\n"):
        m = _STATEMENT_STARTS.match(line)
        if m and not previous.rstrip().endswith("\\"):
            out.append(f"{m.group(1)}// kvpatch-tests: a comment between statements")
            out.append("")
        out.append(line)
        previous = line
    return "\n".join(out)


REFORMATTERS = {
    "clang-format": reformat_with_clang_format,
    "python": reformat_without_clang_format,
}

#: The release whose header is reformatted (and compiled by test_nvcc).
REFORMAT_RELEASE = "0.10.2"


@pytest.fixture(scope="session", params=sorted(REFORMATTERS))
def reformatted_header(request: pytest.FixtureRequest, vllm_release: Callable[[str], Path]) -> tuple[Path, str, str]:
    """(release tree, stock header text, the same header reformatted with comments and blank
    lines added), for clang-format (skipped when not installed) and a pure-Python reformat."""
    tree = vllm_release(REFORMAT_RELEASE)
    stock = (tree / HEADER).read_text(encoding="utf-8")
    return tree, stock, insert_comments(REFORMATTERS[request.param](stock))


# --------------------------------------------------------------------------- nvcc

#: The translation unit: the header plus the address of one v1 and one v2 instantiation
#: per query dtype (head 128, block 16, auto cache), so a prefetch missing from any
#: dtype's kernels (fp16's inline asm, bf16's and fp32's helper call) shows in the PTX.
TRANSLATION_UNIT = """\
#include <cstdint>
#include "attention_kernels.cuh"
#define KVPATCH_TEST_KERNELS(T)                                                        \\
  (void*)&vllm::paged_attention_v1_kernel<T, T, 128, 16, 128,                          \\
                                          vllm::Fp8KVCacheDataType::kAuto, false>,     \\
  (void*)&vllm::paged_attention_v2_kernel<T, T, 128, 16, 128,                          \\
                                          vllm::Fp8KVCacheDataType::kAuto, false, 512>
void* kvpatch_test_kernels[] = {
  KVPATCH_TEST_KERNELS(uint16_t),
  KVPATCH_TEST_KERNELS(__nv_bfloat16),
  KVPATCH_TEST_KERNELS(float),
};
"""

ARCHS = {
    "sm_90a": "arch=compute_90a,code=sm_90a",
    "sm_80": "arch=compute_80,code=sm_80",
    "sm_100": "arch=compute_100,code=sm_100",
    "sm_120": "arch=compute_120,code=sm_120",
}


class CompileError(Exception):
    pass


@pytest.fixture(scope="session")
def nvcc_ptx(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path, str, str], str]:
    """``ptx(csrc, header_text, arch)``: compile the TU against ``header_text`` placed over
    ``csrc/attention/attention_kernels.cuh``, through ptxas (a cubin), and return the PTX.

    It compiles as ``kvpatch build`` does: vLLM's flags and kvpatch's torch stub headers.
    Raises :class:`CompileError` with nvcc's output when it fails.
    """
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH: the PTX checks need the CUDA toolkit")
    from kvpatch.jit.flags import vllm_nvcc_flags  # not at import time: see HEADER above
    from kvpatch.jit.plan import stub_headers

    root = tmp_path_factory.mktemp("nvcc")
    stubs = root / "stubs"
    for name, text in stub_headers().items():
        (stubs / name).parent.mkdir(parents=True, exist_ok=True)
        (stubs / name).write_text(text)
    count = [0]

    def ptx(csrc: Path, header_text: str, arch: str) -> str:
        count[0] += 1
        work = root / f"tu{count[0]}"
        (work / "keep").mkdir(parents=True)
        # The header's siblings ("attention_dtypes.h", "../cuda_compat.h") are found
        # through -I<csrc>/attention, so only the header itself is written here.
        (work / "attention_kernels.cuh").write_text(header_text, encoding="utf-8")
        (work / "tu.cu").write_text(TRANSLATION_UNIT)
        cmd = [
            nvcc, *vllm_nvcc_flags(), "-cubin", f"-gencode={ARCHS[arch]}", "--keep", "--keep-dir", str(work / "keep"),
            f"-I{work}", f"-I{csrc / 'attention'}", f"-I{csrc}", f"-I{stubs}",
            str(work / "tu.cu"), "-o", str(work / "tu.cubin"),
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(proc.stdout + proc.stderr)
        (found,) = (work / "keep").glob("*.ptx")
        return found.read_text()

    return ptx


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that fetches a release or runs nvcc is slow by nature: it leaves the fast subset
    (``-m "not slow"``) without each one saying so twice."""
    for item in items:
        if item.get_closest_marker("network") or item.get_closest_marker("nvcc"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _clean_plugin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """A test of tests/vllm_plugin/ starts with no override registered, no kill switch and no
    bundle directory from the environment, and ends with its registrations dropped. (Here and
    not in a conftest of that folder: a second module named ``conftest`` would shadow this one
    for the tests that import its helpers.)"""
    if "vllm_plugin" not in Path(str(request.path)).parts:
        yield
        return
    monkeypatch.delenv("KVPATCH_DISABLE", raising=False)
    monkeypatch.setenv("KVPATCH_PLUGIN_DIR", str(request.getfixturevalue("tmp_path") / "no-bundle-here"))
    yield
    try:
        from kvpatch.vllm_plugin import plugin
    except ImportError:  # torch-less environments skip before this matters
        return
    plugin.reset()
