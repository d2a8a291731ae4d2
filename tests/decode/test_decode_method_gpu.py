"""On a GPU (``-m gpu``): the decode step's arms, with every control, stay bit-identical, and the
prefetch library's run modes (the zero-row launch, the demote) and the weight-tail table work.

Libraries: ``KVPATCH_DECODE_LIBS`` names a folder ``bash scripts/gpu_decode.sh --prepare`` wrote
(``.gpu/decode`` by default); the tests skip without it, or without a GPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from decode_helpers import prepared_libs  # noqa: E402

MiB = 1 << 20


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepared_libs(tmp_path_factory)


def test_every_arm_is_bit_identical_and_the_controls_run(prepared, tmp_path):
    from kvpatch.decode.bench import run_bench_decode
    from kvpatch.decode.options import WeightPrefetch
    from kvpatch.decode.picks import TAIL, control_arms

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
