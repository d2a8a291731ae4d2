"""On a CUDA GPU: a trimmed validate and a small bench of built kernel libraries.

Libraries come from ``KVPATCH_TEST_LIBS=name=path.so:prefix,...`` (stock first or
named ``stock``), e.g. built with ``kvpatch build`` (fp16/bf16, head 128, block 16).
Skipped without CUDA torch or without that variable.
"""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.gpu

ENV = "KVPATCH_TEST_LIBS"


def _skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    if not os.environ.get(ENV):
        return f"{ENV} is not set (name=path.so:prefix,...: libraries built by kvpatch build)"
    return None


@pytest.fixture(scope="module")
def libs():
    why = _skip_reason()
    if why:
        pytest.skip(why)
    from kvpatch.gpu import launch as L

    return L.load_libs(L.parse_lib_specs([os.environ[ENV]]))


def _trimmed_matrix(libs):
    """fp16/bf16, head 128, block 16 (the default build), both kernels, GQA and MHA,
    ALiBi on/off, contexts ending mid-block and spanning v2 partitions; plus fp8 if built."""
    from kvpatch.gpu import validate as V

    stock = next(iter(libs.values()))
    kvs = ["auto"] + (["fp8"] if any("/fp8/" in c for c in getattr(stock, "configs", ())) else [])
    return V.validate_matrix(dtypes=("fp16", "bf16"), kv_cache_dtypes=kvs, head_sizes=(128,), block_sizes=(16,),
                             heads=((8, 2), (4, 4)), contexts=(1, 17, 1500))  # fmt: skip


def test_validate_trimmed(libs, tmp_path):
    from kvpatch.gpu import validate as V
    from kvpatch.gpu.reference import REF_TOLERANCE

    rep = V.run_validate(libs, _trimmed_matrix(libs), seed=1234)
    (tmp_path / "validate.json").write_text(rep.to_json())
    assert rep.n_passed > 0, "nothing validated: " + "; ".join(rep.skipped[:5])
    assert rep.failures == [], "\n".join(rep.failures[:20])
    worst = rep.max_ref_error()
    assert all(e < REF_TOLERANCE[k] for k, e in worst.items() if not k.startswith("fp32")), worst
    # fp32: within each case's tolerance (wider with ALiBi's large biases: reference.ref_tolerance)
    assert all(r.ref_error < r.tolerance for r in rep.results if r.status != "skip"), worst


def test_validate_detects_a_corrupted_output(libs):
    """The harness itself: a wrapper that flips one output bit must be caught."""
    import torch

    from kvpatch.gpu import validate as V

    stock_name = "stock" if "stock" in libs else next(iter(libs))
    stock = libs[stock_name]

    class Flip:
        configs = getattr(stock, "configs", None)

        def v1(self, out, *a):
            stock.v1(out, *a)
            out.view(torch.int16).view(-1)[7] ^= 1

        def v2(self, out, *a):
            stock.v2(out, *a)
            out.view(torch.int16).view(-1)[7] ^= 1

    cases = [c for c in _trimmed_matrix(libs) if c.context == 17][:2]
    rep = V.run_validate({stock_name: stock, "flip": Flip()}, cases, seed=7)
    assert rep.n_failed == len(cases)
    assert all(f.startswith("flip: ") and "differs" in f for f in rep.failures)


def test_bench_shows_the_flushed_l2_and_times_the_kernel_not_the_host(libs, tmp_path):
    """What the bench exists to show, on stock's kernel at two sizes of KV: a batch whose KV fits
    in L2 (1 x 1024 tokens: 4 MiB) runs slower cold (the L2 flushed before each launch) than warm;
    a batch 64x larger (256 MiB) takes longer than the small one warm and cold (its time is its
    bytes, not a launch gap); no point reads its unique KV faster than twice the copy rate. (On the
    H200, benchmarks/evidence/headline/0.10.2: v1 26.8 us warm, 38.1 us cold at batch 1; 153 us
    at batch 64.) The A/A control launches stock's code and gives stock's outputs."""
    from kvpatch.gpu import bench as B
    from kvpatch.gpu.points import make_points
    from kvpatch.gpu.timing import l2_bytes_of

    stock_name = "stock" if "stock" in libs else next(iter(libs))
    pts = make_points(dtypes=("fp16",), batches=(1, 64), contexts=(1024,))
    rep = B.run_bench(libs, pts, reps=20, warmup=3, rounds=3, pool_l2_multiple=4.0, copy_bytes=256 << 20,
                      kernels=("v1",), aa=True)  # fmt: skip
    assert rep.ok, rep.mismatches
    assert rep.settings["lead"]["host_bound"] == 0, rep.settings["lead"]
    assert pts[0].kv_bytes < l2_bytes_of("cuda") < pts[1].kv_bytes
    t = {(r.point.batch, r.mode): r.variants for r in rep.results}
    small_warm, small_cold = t[(1, "warm")][stock_name], t[(1, "cold")][stock_name]
    assert small_cold.median_us > 1.2 * small_warm.median_us, (small_warm.median_us, small_cold.median_us)
    for mode in ("warm", "cold"):
        assert t[(64, mode)][stock_name].median_us > 2 * t[(1, mode)][stock_name].median_us
    assert all(v.copy_fraction < 2.0 for r in rep.results for v in r.variants.values())
    assert all(r.variants[B.AA].outputs_match for r in rep.results)
    d = json.loads(rep.to_json())
    assert d["env"]["gpu"]["name"]
    assert d["rounds"] and all("smi" in w for w in d["rounds"])  # nvidia-smi windows (None without nvidia-smi)
    pytest.importorskip("matplotlib")
    from kvpatch.gpu.plot import plot_bench

    plot_bench(d, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").stat().st_size > 10_000
