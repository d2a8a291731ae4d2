"""The prefetch kernel's opt-in demote mode and zero-row launch (PrefetchKernelSpec(demote=True)),
and the controller's zero-byte forks, per-window hints and hinted ranges (a fake library)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from prefetch_helpers import FakeTensor, LoggingAPI, logging_controller

from kvpatch.errors import UsageError
from kvpatch.prefetch import kernel as K
from kvpatch.prefetch.controller import PrefetchController

GOLDEN_KERNEL = Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "prefetch" / "l2_prefetch.cu"
MiB = 1 << 20


def test_default_source_is_unchanged_and_has_no_demote():
    src = K.PrefetchKernelSpec().source()
    assert src == GOLDEN_KERNEL.read_text(encoding="utf-8")
    assert "applypriority" not in src and "kvpatch_l2_prefetch_run" not in src and "demote" not in src


def test_demote_source_has_the_ptx_the_export_and_no_discard():
    spec = K.PrefetchKernelSpec(demote=True)
    src = spec.source()
    assert spec.marker == "chunk=4096,line=128,hint=evict_last,threads=32,demote"
    assert f"// {spec.marker}" in src and f'return "{spec.marker}";' in src
    # one applypriority per 128-byte line, the only size the ISA allows, under an sm_80 guard
    assert src.count('asm volatile("applypriority.global.L2::evict_normal [%0], 128;"') == 1
    guard = src.index('__CUDA_ARCH__ >= 800\n  asm volatile("applypriority')
    assert guard > 0
    assert "discard.global" not in src.replace("(discard.global.L2 is not an", "")
    run = src[src.index("int kvpatch_l2_prefetch_run(") :]
    assert "mode < 0 || mode > 1" in run
    # mode 0 launches the prefetch kernel whatever the rows (no early return on rows == 0) ...
    prefetch_branch = run[run.index("} else {") : run.index("return static_cast<int>(cudaGetLastError());")]
    assert "kvpatch_l2_prefetch_kernel<<<" in prefetch_branch
    assert (
        run.index("if (mode == 1) {")
        < run.index("if (rows == 0) return static_cast<int>(cudaSuccess);")
        < run.index("} else {")
    )
    # ... while the old exports keep their rows == 0 early return
    ex = src[src.index("int kvpatch_l2_prefetch_ex(") : src.index("int kvpatch_l2_prefetch(")]
    assert "if (rows == 0) return static_cast<int>(cudaSuccess);" in ex
    # the rest of the default source is there, unchanged, around the additions
    default = K.PrefetchKernelSpec().source().replace("hint=evict_last,threads=32", "hint=evict_last,threads=32,demote")
    kept = [line for line in default.splitlines()]
    assert all(line in src.splitlines() for line in kept)


def test_demote_spec_is_checked():
    with pytest.raises(UsageError, match="demote"):
        K.PrefetchKernelSpec(demote="yes")


def _sass_functions(text):
    from kvpatch.jit.sass import sass_functions

    return {(arch, sym): [t for _, t in instrs] for arch, sym, instrs, _ in sass_functions(text.splitlines()) if sym}


@pytest.fixture(scope="module")
def demote_build(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    cache = tmp_path_factory.mktemp("demote-cache")
    return K.build_prefetch_library("9.0a;8.0", K.PrefetchKernelSpec(demote=True), cache=cache)


@pytest.mark.nvcc
def test_demote_compiles_to_cctl_dml2_on_sm90a_and_sm80(demote_build):
    text = (demote_build.parent / "kernel.sass").read_text()
    funcs = _sass_functions(text)
    for arch in ("sm_90a", "sm_80"):
        demote = [ins for (a, sym), ins in funcs.items() if a == arch and "demote" in sym]
        prefetch = [ins for (a, sym), ins in funcs.items() if a == arch and "l2_prefetch_kernel" in sym]
        assert len(demote) == 1 and len(prefetch) == 1
        assert any(re.match(r"CCTL\.E\.DML2 \[R\d+", i.split(" ", 1)[1] if i.startswith("@") else i) for i in demote[0])
        assert not any("DML2" in i for i in prefetch[0])  # the prefetch kernel is as before
    assert any(
        "UBLKPF.L2" in i for (a, s), ins in funcs.items() if a == "sm_90a" and "l2_prefetch_kernel" in s for i in ins
    )
    from kvpatch.arch import parse_arch_list

    assert K.check_demote_sass(text.splitlines(), parse_arch_list("9.0a;8.0")) == {"sm_90a": 1, "sm_80": 1}
    with pytest.raises(Exception, match="DML2"):
        K.check_demote_sass(text.replace("CCTL.E.DML2", "NOP").splitlines(), parse_arch_list("9.0a"))


@pytest.mark.nvcc
def test_demote_library_loads_with_its_modes_and_checks_its_arguments(demote_build):
    lib = K.PrefetchLibrary(demote_build)
    assert lib.modes == ("prefetch", "demote") and lib.config.endswith(",demote")
    with pytest.raises(RuntimeError, match=r"\(demote\) failed: .*error 1\)"):
        lib.run(0x1000, 1, 0, 0, mode="demote")  # grid 0: cudaErrorInvalidValue before any CUDA call
    with pytest.raises(UsageError, match="unknown prefetch mode"):
        lib.run(0, 0, 8, 0, mode="discard")
    lib.run(0, 0, 8, 0, mode="demote")  # no rows: nothing to demote, no CUDA call
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    if not gpu:  # a zero-row prefetch is launched: without a GPU, the launch itself fails
        with pytest.raises(RuntimeError, match=r"\(prefetch\) failed"):
            lib.run(0, 0, 8, 0, mode="prefetch")
        lib.launch(0, 0, 8, 0)  # the old export still does nothing for no rows


def test_default_library_has_no_run_mode(tmp_path):
    class Lib:
        modes = ()

        def launch(self, *a, **k):
            pass

    api = LoggingAPI()
    with pytest.raises(UsageError, match="demote=True"):
        PrefetchController("cuda:0", library=Lib(), api=api, zero_bytes=True)


# --------------------------------------------------------------------------- controller


def test_zero_byte_forks_launch_the_same_kernel_and_grid_with_no_rows():
    w = FakeTensor(0x10000000, 12 * MiB)
    real, api_r = logging_controller()
    zero, api_z = logging_controller(zero_bytes=True)
    for ctl in (real, zero):
        ctl.add("oproj->gateup", 3, [w], cap_bytes=12 * MiB, hint="evict_normal")
        ctl.fork("oproj->gateup", 3)
        ctl.join()
    launch = [e for e in api_r.log if e[0] == "launch"]
    run = [e for e in api_z.log if e[0] == "run"]
    assert launch == [("launch", 0x7100, 1, 12, 0x2222, (("hint", "evict_normal"),))]
    assert run == [("run", "prefetch", 0x7100, 0, 12, 0x2222, (("hint", "evict_normal"),))]  # same table, grid: 0 rows
    # the same events, waits and join around the launch
    strip = lambda log: [e for e in log if e[0] not in ("launch", "run")]  # noqa: E731
    assert (
        strip(api_r.log)
        == strip(api_z.log)
        == [("record", "main"), ("wait_event", "side"), ("wait_stream", "main", "side")]
    )
    assert zero.launches == real.launches == 1


def test_window_hint_overrides_the_controllers_and_hinted_ranges_merge():
    ctl, api = logging_controller(hint="evict_first")
    a, b = FakeTensor(0x10000000, 4 * MiB), FakeTensor(0x10000000 + 4 * MiB, 4 * MiB)
    c = FakeTensor(0x30000000, 2 * MiB)
    ctl.add("gateup->down", 0, [a], batches={1: 2 * MiB, 8: 4 * MiB}, hint="evict_last")
    ctl.add("down->qkv", 0, [b], cap_bytes=MiB, hint="evict_last")
    ctl.add("norm->qkv", 0, [c], cap_bytes=MiB)  # the controller's evict_first
    ctl.fork("norm->qkv", 0)
    ctl.fork("gateup->down", 0, 4)
    hints = [e[-1] for e in api.log if e[0] == "launch"]
    assert hints == [(("hint", "evict_first"),), (("hint", "evict_last"),)]
    # batch 4 takes the 8-bucket (4 MiB of a), which runs into b's first MiB: one range
    assert ctl.hinted_ranges(("evict_last",), batch=4) == [(0x10000000, 5 * MiB)]
    assert ctl.hinted_ranges(("evict_last",), batch=1) == [(0x10000000, 2 * MiB), (0x10000000 + 4 * MiB, MiB)]
    assert ctl.hinted_ranges(("evict_first",)) == [(0x30000000, MiB)]
    assert ctl.hinted_ranges(("evict_normal",)) == []
    bare, _ = logging_controller()
    bare.add("attn", 0, [c], cap_bytes=MiB)  # no hint anywhere: the library's default, evict_last
    assert bare.hinted_ranges() == [(0x30000000, MiB)]


def test_a_bad_window_hint_is_refused():
    ctl, _ = logging_controller()
    with pytest.raises(UsageError, match="hint"):
        ctl.add("w", 0, [FakeTensor(0x1000, 4096)], hint="evict_sometimes")
