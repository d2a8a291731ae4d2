"""On a GPU (``-m gpu``): the decode step's arms, with every control, stay bit-identical, and the
prefetch library's run modes (the zero-row launch, the demote) and the weight-tail table work.

Libraries: ``KVPATCH_DECODE_LIBS`` names a folder ``bash scripts/gpu_decode.sh --prepare`` wrote
(``.gpu/decode`` by default); the tests skip without it, or without a GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MiB = 1 << 20


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    folder = Path(os.environ.get("KVPATCH_DECODE_LIBS", Path(__file__).resolve().parents[2] / ".gpu" / "decode"))
    if not (folder / "libs.txt").is_file():
        pytest.skip(f"no prepared libraries in {folder} (bash scripts/gpu_decode.sh --prepare)")
    from kvpatch.commands.decode import with_tail_copy
    from kvpatch.decode.prepare import unpack
    from kvpatch.gpu.launch import Kernels
    from kvpatch.prefetch.kernel import PrefetchLibrary

    files = unpack(folder, tmp_path_factory.mktemp("libs"))
    libs = {}
    for line in (folder / "libs.txt").read_text().split():
        name, _, rest = line.partition("=")
        file, _, prefix = rest.rpartition(":")
        libs[name] = Kernels(files[file], prefix)
    return with_tail_copy(libs, tmp_path_factory.mktemp("tail0")), PrefetchLibrary(files["libkvpatch_l2_prefetch.so"])


def test_every_arm_is_bit_identical_and_the_controls_run(prepared, tmp_path):
    from kvpatch.decode.bench import run_bench_decode
    from kvpatch.decode.picks import TAIL, control_arms
    from kvpatch.decode.options import WeightPrefetch

    libs, pf = prepared
    wpf = WeightPrefetch()  # evict_last: the guard is on
    report = run_bench_decode(libs, models=["llama-3.2-1b"], dtypes=["bf16"], batches=[1, 8], contexts=[1024], layers=2,
                              rounds=2, cycles=1, arms=control_arms(list(libs), wpf, tail=TAIL), prefetch_library=pf,
                              json_path=tmp_path / "d.json")  # fmt: skip
    assert report.summary()["all_identical"] and not report.skipped
    for p in report.points:
        assert p["guard"]["on"] and p["guard"]["demoted_bytes"] > 0 and p["aa"] is not None
        assert {"stock+zero", "stock+wpf", "tail", "tail+zero", "patched+wpf"} <= set(p["variants"])


def test_zero_rows_launch_and_demote_run(prepared):
    from kvpatch.prefetch.ranges import range_table

    _, pf = prepared
    w = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
    table = range_table([(w.data_ptr(), 4 * MiB)], "cuda")
    s = torch.cuda.current_stream().cuda_stream
    pf.run(table.data_ptr(), 0, 8, s, mode="prefetch")  # the zero-byte arm's launch
    pf.run(table.data_ptr(), 1, 8, s, mode="prefetch", hint="evict_last")
    pf.run(table.data_ptr(), 1, 64, s, mode="demote", threads=256)
    torch.cuda.synchronize()
