"""``kvpatch build`` (kvpatch.commands.build, kvpatch.render.build_table) and ``--full``
(kvpatch.jit.full): options refused before anything runs, vLLM's own install's command line,
and the table a build prints."""

from __future__ import annotations

import io

import pytest
from jit_helpers import have_nvcc, kernel, variant_result
from rich.console import Console

from kvpatch.commands import build as Bc
from kvpatch.errors import UsageError
from kvpatch.jit import BuildResult, full_build_command, parse_arch_list, vllm_nvcc_flags
from kvpatch.render import build_table


def test_full_build_command(tmp_path):
    argv, env = full_build_command(tmp_path, parse_arch_list("8.0;9.0a"), 16, python="/py", base_env={"PATH": "/bin"})
    assert argv == ["/py", "-m", "pip", "install", "-v", "-e", str(tmp_path.resolve()), "--no-build-isolation"]
    assert env == {"PATH": "/bin", "TORCH_CUDA_ARCH_LIST": "8.0;9.0a", "MAX_JOBS": "16", "VLLM_TARGET_DEVICE": "cuda"}
    with pytest.raises(UsageError):
        full_build_command(tmp_path, [], 16)
    with pytest.raises(UsageError):
        full_build_command(tmp_path, parse_arch_list("9.0a"), 0)


@pytest.mark.parametrize("opts, message", [
    (dict(jobs=0), r"^invalid jobs 0: must be >= 1$"),
    (dict(full=True, dtypes=["fp16"], all_kernels=True), r"^--full runs vLLM's own build .*: --dtypes, --all do not apply$"),
    (dict(full=True, arch="sm_90"), "invalid arch 'sm_90'"),
])  # fmt: skip
def test_build_refuses_options_before_it_reads_the_tree(tmp_path, opts, message):
    with pytest.raises(UsageError, match=message):
        Bc.run(Bc.BuildOptions(tree=tmp_path / "no-tree", cwd=tmp_path, **opts))


def test_build_table_shows_every_kernel_and_vllms_flags():
    stock = variant_result("stock", (kernel(has_prefetch=False, expect_prefetch=False),))
    patched = variant_result("patched", (kernel(), kernel(kernel="v2", has_prefetch=False, registers=128)))
    out = io.StringIO()
    Console(file=out, width=200).print(build_table(BuildResult((stock, patched), 12.34, vllm_nvcc_flags())))
    text = out.getvalue()
    assert "kvpatch build (12.3 s)" in text
    rows = [line for line in text.splitlines() if "fp16/auto/128/16" in line]
    assert len(rows) == 3 and "FAIL" in rows[2] and "128" in rows[2] and "FAIL" not in rows[0] + rows[1]
    assert "vLLM's nvcc flags: -std=c++17 -O2 -g -DNDEBUG --expt-relaxed-constexpr -DENABLE_FP8" in text


def test_a_large_build_is_one_row_per_variant_plus_every_failed_kernel():
    """vLLM's full set is ~500 kernels a variant: one row each, and the kernel that failed its check."""
    heads = (32, 64, 80, 96, 112, 120, 128, 192, 256)
    stock = variant_result("stock", tuple(kernel(dtype=d, head_size=h, block_size=b, has_prefetch=False,
                                                 expect_prefetch=False)
                                          for d in ("fp16", "bf16") for h in heads for b in (8, 16, 32)))  # fmt: skip
    patched = variant_result("patched", tuple(kernel(dtype=d, head_size=h, block_size=b, registers=80 + h // 8,
                                                     has_prefetch=(d, h, b) != ("fp16", 64, 8))
                                              for d in ("fp16", "bf16") for h in heads for b in (8, 16, 32)))  # fmt: skip
    out = io.StringIO()
    Console(file=out, width=250).print(build_table(BuildResult((stock, patched), 700.0, vllm_nvcc_flags())))
    text = out.getvalue()
    lines = [line for line in text.splitlines() if "sm_90a" in line]
    assert len(lines) == 3, text  # two variants and the one failed kernel
    assert lines[0].split()[1:6] == ["stock", "│", "sm_90a", "│", "54"] and "ok" in lines[0]
    assert [c.strip() for c in lines[1].split("│")[1:-1]] == [
        "patched",
        "sm_90a",
        "54",
        "54",
        "53",
        "84-112",
        "0",
        "0",
        "1 FAIL",
    ]
    assert "v1 fp16/auto/64/8" in lines[2] and "FAIL" in lines[2]
    assert "every kernel is in --json" in text


def test_the_grouped_forms_kernels_have_rows_of_their_own_and_a_failed_one_says_so():
    from dataclasses import replace

    from kvpatch.jit.result import GroupedKernel

    def grouped(**kw):
        base = dict(arch="sm_90a", kernel="v1", dtype="bf16", head_size=128, block_size=16, heads=4, lookahead=1,
                    registers=130, spill_stores=0, spill_loads=0, has_prefetch=True, symbol="_Zg")  # fmt: skip
        return GroupedKernel(**{**base, **kw})

    patched = replace(variant_result("patched", (kernel(),)),
                      grouped=(grouped(), grouped(kernel="v2", registers=138, has_prefetch=False)))  # fmt: skip
    out = io.StringIO()
    Console(file=out, width=200).print(build_table(BuildResult((patched,), 1.0)))
    rows = [line for line in out.getvalue().splitlines() if "grouped" in line]
    assert len(rows) == 2, out.getvalue()
    assert "grouped v1 x4" in rows[0] and "bf16/auto/128/16" in rows[0] and "130" in rows[0] and "ok" in rows[0]
    assert "grouped v2 x4" in rows[1] and "138" in rows[1] and "FAIL" in rows[1]  # lookahead 1, no UBLKPF
    assert "/SM" not in rows[0] + rows[1]
    # a kernel under launch bounds (group-ctas-per-sm) says them in its row
    bounded = replace(patched, grouped=(grouped(kernel="v2", registers=128, ctas_per_sm=4),))
    out = io.StringIO()
    Console(file=out, width=200).print(build_table(BuildResult((bounded,), 1.0)))
    (row,) = [line for line in out.getvalue().splitlines() if "grouped" in line]
    assert "grouped v2 x4 4/SM" in row and "128" in row
    # a large build counts them per variant, and lists the one that failed
    many = replace(patched, kernels=tuple(kernel(head_size=h, block_size=b) for h in range(64) for b in (16, 32)))
    out = io.StringIO()
    Console(file=out, width=250).print(build_table(BuildResult((many,), 1.0)))
    lines = [line for line in out.getvalue().splitlines() if "sm_90a" in line]
    assert [c.strip() for c in lines[0].split("│")[1:-1]][-2:] == ["2", "1 FAIL"], out.getvalue()
    assert "grouped v2 bf16/128/16 x4" in lines[1] and "FAIL" in lines[1]


@pytest.mark.skipif(not have_nvcc(), reason="nvcc not found on PATH (set CUDA_HOME or PATH)")
def test_full_checks_the_arch_with_nvcc_before_pip_runs_the_trees_setup(tmp_path, monkeypatch):
    """Before: --full handed TORCH_CUDA_ARCH_LIST=99.0 to pip, which ran the tree's setup.py; a
    plain build refuses it in a second. After: refused the same way, nothing run."""
    from kvpatch.errors import BuildError
    from kvpatch.jit import HEADER

    tree = tmp_path / "vllm"
    (tree / HEADER).parent.mkdir(parents=True)
    (tree / HEADER).write_text("// a header\n")
    monkeypatch.setattr("kvpatch.jit.full.full_build_command", lambda *a, **k: pytest.fail("pip was to run"))
    with pytest.raises(BuildError, match="cannot compile for 99.0"):
        Bc.run(Bc.BuildOptions(tree=tree, cwd=tmp_path, full=True, arch="99.0"))
