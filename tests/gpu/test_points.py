"""kvpatch.gpu.points: bench points, their bytes and pools, and the named sets (what tune
sees and what it never sees)."""

from __future__ import annotations

import pytest

from kvpatch.config.selector import kernel_selector
from kvpatch.errors import UsageError
from kvpatch.gpu import bench as B
from kvpatch.gpu import points as P


def test_default_bench_points_dispatch_v2_at_10_of_12():
    pts = B.default_points()
    assert len(pts) == 24
    fp16 = [p for p in pts if p.dtype == "fp16"]
    assert [(p.batch, p.context) for p in fp16 if p.dispatched == "v1"] == [(64, 1024), (64, 4096)]
    assert sum(p.dispatched == "v2" for p in fp16) == 10


def test_bench_point_bytes():
    p = P.BenchPoint("fp16", 64, 16384)
    assert p.block_bytes == 2 * 8 * 128 * 16 * 2  # K and V, 8 KV heads, head 128, 16 tokens, 2 bytes
    assert p.num_blocks == 64 * 1024
    assert p.kv_bytes == 64 * 16384 * 4096  # 4.3 GB
    q = P.BenchPoint("fp16", 3, 17, kv_cache_dtype="fp8")
    assert q.blocks_per_seq == 2 and q.kv_bytes == 3 * 2 * (2 * 8 * 128 * 16)  # one byte an element
    assert "kv=fp8" in q.name and "kv=" not in p.name


def test_a_launch_sized_for_more_tokens_than_the_context_is_dispatched_by_that_size():
    p = P.BenchPoint("fp16", 64, 1024)
    assert p.max_seq_len == 1024 and p.dispatched == "v1" and "launch=" not in p.name
    graph = P.BenchPoint("fp16", 64, 1024, capture=8192)
    assert graph.max_seq_len == 8192 and graph.dispatched == "v1" and graph.name.endswith(" launch=8192")
    assert P.BenchPoint("fp16", 16, 512).dispatched == "v1"  # one partition
    assert P.BenchPoint("fp16", 16, 512, capture=8192).dispatched == "v2"  # 16 partitions, 512 query heads
    assert P.BenchPoint("fp16", 64, 1024, capture=16384).dispatched == "v2"  # past v1's 8192
    assert graph.kv_bytes == p.kv_bytes and graph.pool_key == p.pool_key  # the sequences' bytes, the same pool


def test_pool_blocks_sizing():
    pts = B.default_points()
    l2 = 60 * 2**20
    n = P.pool_blocks(pts, l2)
    assert n >= 1.2 * 65536
    assert n * pts[0].block_bytes >= 64 * l2
    assert 4.5e9 < n * pts[0].block_bytes < 6e9  # ~5 GB, like NOTES.md


def test_make_points_and_quick():
    assert len(P.quick_points()) == 8
    with pytest.raises(UsageError):
        P.make_points(dtypes=("fp8",))
    with pytest.raises(UsageError):
        P.make_points(num_heads=30, num_kv_heads=8)
    # a context beyond the longest of the models kvpatch knows is a typo: refused before any GPU work
    # (beyond int32's range it could not even be given to the kernels)
    assert P.make_points(dtypes=("fp16",), batches=(1,), contexts=(P.MAX_CONTEXT,))[0].context == 131072
    for bad in (0, P.MAX_CONTEXT + 1, 99999999999):
        with pytest.raises(UsageError, match=f"--contexts must be 1 to 131072 tokens .*, not {bad}"):
            P.make_points(contexts=(512, bad))


def test_point_sets():
    tuning = P.point_set("tuning")
    headline = P.point_set("headline")
    heldout = P.point_set("heldout")
    assert len(tuning) == 2 * 3 * 2 * 3 * 9 and len(headline) == 24
    assert {(p.num_heads, p.num_kv_heads) for p in tuning} == {(32, 8), (32, 32), (64, 8)}
    assert {p.seed for p in tuning} == {0} and {p.seed for p in headline} == {1}
    # every tuned instantiation gets both kernels: v1 at context 512 and at batch 32 x 2048
    per_inst = {}
    for p in tuning:
        per_inst.setdefault((p.dtype, p.head_size, p.block_size), []).append(p.dispatched)
    assert len(per_inst) == 12 and all(k.count("v1") == 12 and k.count("v2") == 15 for k in per_inst.values())
    assert kernel_selector("bf16", 64, 32, "fp8_e5m2", "v2") == "bf16/64/32/fp8/v2"
    assert len(heldout) == 8 * 2 * 12 and 0 not in {p.seed for p in heldout}
    # no published point is a tuning point: other batches and contexts, other seeds
    published = {(p.dtype, p.shape, p.batch, p.context) for p in headline + heldout}
    assert not published & {(p.dtype, p.shape, p.batch, p.context) for p in tuning}
    shapes = {(p.num_heads, p.num_kv_heads, p.head_size, p.block_size, p.kv_cache_dtype) for p in heldout}
    assert shapes == {(32, 8, 128, 16, "auto"), (32, 8, 64, 16, "auto"), (32, 8, 256, 16, "auto"),
                      (32, 8, 128, 32, "auto"), (64, 8, 128, 16, "auto"), (8, 1, 128, 16, "auto"),
                      (32, 32, 128, 16, "auto"), (32, 8, 128, 16, "fp8")}  # fmt: skip
    # tune never sees a held-out (shape, seed) pair
    assert not {(p.shape, p.seed) for p in heldout} & {(p.shape, p.seed) for p in tuning}
    with pytest.raises(UsageError):
        P.point_set("everything")
