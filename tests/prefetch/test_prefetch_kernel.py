"""The L2 prefetch kernel (kvpatch.prefetch.kernel): its generated source, the launch options it
takes, the SASS check every build passes (kvpatch.jit.sass), and (nvcc) a build for sm_90a and
sm_80 whose library loads and reports launch errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvpatch.arch import parse_arch_list
from kvpatch.errors import BuildError, UsageError
from kvpatch.jit.sass import check_prefetch_library, sass_functions
from kvpatch.prefetch import kernel as K

GOLDEN_KERNEL = Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "prefetch" / "l2_prefetch.cu"


def test_source_shows_each_form_literally():
    src = K.PrefetchKernelSpec().source()
    for hint in ("evict_last", "evict_normal", "evict_first"):  # chosen per launch
        assert f'asm volatile("createpolicy.fractional.L2::{hint}.b64 %0, 1.0;" : "=l"(policy));' in src
    assert (
        'asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(address), "r"(bytes), "l"(policy) : "memory");'
        in src
    )
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
    for bad in ({"threads": 48}, {"threads": 2048}, {"chunk": 8}, {"chunk": 4100}, {"chunk": 1 << 20}, {"hint": "last"},
                {"threads": True}, {"chunk": 4096.0}):  # fmt: skip
        with pytest.raises(UsageError):
            K.check_launch(**bad)


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
        K.build_prefetch_library("7.5;9.0a")  # refused before nvcc is looked for
    with pytest.raises(UsageError, match="8.0 or newer"):
        K.archs_for_capability(7, 5)
    assert K.archs_for_capability(9, 0) == "9.0a" and K.archs_for_capability(8, 9) == "8.9"


def test_a_library_is_found_by_path_the_environment_or_not_at_all(monkeypatch, tmp_path):
    monkeypatch.delenv(K.LIBRARY_ENV, raising=False)
    with pytest.raises(UsageError, match="KVPATCH_PREFETCH_LIB"):
        K.load_prefetch_library()
    junk = tmp_path / "libjunk.so"
    junk.write_bytes(b"not a library")
    monkeypatch.setenv(K.LIBRARY_ENV, str(junk))
    with pytest.raises(BuildError, match="cannot load the L2 prefetch library"):
        K.load_prefetch_library()


SASS_SAMPLE = """
\tcode for sm_90a
\t\tFunction : kern
        /*0860*/                   UBLKPF.L2 [UR12], UR10, desc[UR8] ;                  /* 0x000008000c0073bc */
\tcode for sm_80
\t\tFunction : kern
        /*06b0*/                   CCTL.E.PML2 [R12] ;                                   /* 0x000000000c00798f */
"""


def test_the_sass_check_counts_and_refuses_wrong_forms():
    archs = parse_arch_list("9.0a;8.0")
    lines = SASS_SAMPLE.splitlines()
    assert check_prefetch_library(lines, archs) == {"sm_90a": {"bulk": 1, "line": 0}, "sm_80": {"bulk": 0, "line": 1}}
    with pytest.raises(BuildError, match="sm_90a.*expected UBLKPF"):
        check_prefetch_library(SASS_SAMPLE.replace("UBLKPF.L2", "NOP").splitlines(), archs)
    with pytest.raises(BuildError, match="sm_90a.*expected UBLKPF"):  # a per-line prefetch on Hopper is the wrong form
        check_prefetch_library(
            SASS_SAMPLE.replace("\tcode for sm_80\n\t\tFunction : kern\n", "").splitlines(), parse_arch_list("9.0a")
        )
    with pytest.raises(BuildError, match="sm_80.*per-line"):
        check_prefetch_library(SASS_SAMPLE.replace("CCTL.E.PML2", "NOP").splitlines(), archs)
    with pytest.raises(BuildError, match="no SASS for sm_89"):
        check_prefetch_library(lines, parse_arch_list("8.9"))


def _sass_by_arch(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for fn in sass_functions(text.splitlines()):
        out.setdefault(fn.arch, []).extend(t for _, t in fn.instrs)
    return out


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
    sass = _sass_by_arch((library.parent / "kernel.sass").read_text())
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
    assert lib.config == "chunk=4096,line=128,hint=evict_last,threads=32" and lib.modes == ()
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
    with pytest.raises(UsageError, match="demote=True"):
        lib.run(0, 0, 8, 0)  # the default build has no run mode
