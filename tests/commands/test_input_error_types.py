"""The parsers and checks of user input below the commands (``gpu/``, ``decode/``) raise
:class:`~kvpatch.errors.UsageError` themselves, one line, exit 2: the commands call them without
a wrapper, so a bare ``ValueError`` from one of them would reach the user as a traceback."""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any, Callable

import pytest

from kvpatch.decode.models import model_shape
from kvpatch.decode.options import WeightPrefetch, parse_caps, parse_ints
from kvpatch.decode.windows import parse_windows
from kvpatch.errors import UsageError
from kvpatch.gpu import bench as B
from kvpatch.gpu import launch as Ln
from kvpatch.gpu import points as P
from kvpatch.gpu import validate as V
from kvpatch.gpu.dispatch import check_kernel
from kvpatch.gpu.inputs import check_kv_cache_dtype
from kvpatch.gpu.upstream import parse_shard

needs_torch = pytest.mark.skipif(find_spec("torch") is None, reason="run_bench imports torch first")
TIMING = {"reps": 1, "warmup": 0, "rounds": 1, "warm": True, "cold": True, "kernels": ("v1",)}

CASES: list[Any] = [
    pytest.param(lambda: Ln.parse_lib_specs(["x.so:p"]), "invalid library spec", id="lib-spec"),
    pytest.param(lambda: Ln.parse_lib_specs(["-a=x.so:p"]), "invalid library name", id="lib-name"),
    pytest.param(lambda: Ln.parse_lib_specs(["a=x.so:p", "a=y.so:q"]), "given twice", id="lib-twice"),
    pytest.param(lambda: Ln.order_variants([]), "no libraries", id="no-libs"),
    pytest.param(lambda: B.check_bench_options(**{**TIMING, "warm": False, "cold": False}), "neither", id="modes"),
    pytest.param(lambda: B.check_bench_options(**{**TIMING, "rounds": 0}), "rounds", id="rounds"),
    pytest.param(lambda: B.check_bench_options(**{**TIMING, "kernels": ("v3",)}), "'v3'", id="bench-kernel"),
    pytest.param(lambda: B.run_bench({"stock": object()}, [], device="cpu"), "no bench points", id="no-points",
                 marks=needs_torch),
    pytest.param(lambda: B.run_bench({"stock": object(), B.AA: object()}, P.quick_points(), aa=True, device="cpu"),
                 "A/A", id="aa-name", marks=needs_torch),
    pytest.param(lambda: P.make_points(dtypes=("fp8",)), "unknown dtype", id="points-dtype"),
    pytest.param(lambda: P.make_points(num_heads=30, num_kv_heads=8), "heads 30/8", id="points-heads"),
    pytest.param(lambda: P.make_points(batches=(0,)), "must be 1 to 1024 sequences", id="points-batch"),
    pytest.param(lambda: P.make_points(head_size=0), ">= 1", id="points-head-size"),
    pytest.param(lambda: P.point_set("everything"), "unknown point set", id="point-set"),
    pytest.param(lambda: V.validate_matrix(dtypes=("fp64",)), "unknown dtype", id="matrix-dtype"),
    pytest.param(lambda: V.validate_matrix(kv_cache_dtypes=("fp4",)), "kv cache dtype", id="matrix-kv"),
    pytest.param(lambda: V.validate_matrix(heads=((8, 3),)), "heads 8/3", id="matrix-heads"),
    pytest.param(lambda: V.validate_matrix(contexts=(0,)), "context", id="matrix-context"),
    pytest.param(lambda: check_kernel("v3"), "unknown kernel", id="kernel"),
    pytest.param(lambda: check_kv_cache_dtype("fp4"), "unknown kv cache dtype", id="kv-cache-dtype"),
    pytest.param(lambda: parse_shard("3/2"), "invalid shard", id="shard"),
    pytest.param(lambda: parse_ints("1,x", "--batches"), "invalid --batches", id="ints"),
    pytest.param(lambda: parse_ints("0"), ">= 1", id="ints-positive"),
    pytest.param(lambda: WeightPrefetch.parse("size=3"), "unknown weight-prefetch option", id="wpf-key"),
    pytest.param(lambda: WeightPrefetch.parse("grid"), "KEY=VALUE", id="wpf-item"),
    pytest.param(lambda: WeightPrefetch.parse("grid=x"), "an integer", id="wpf-int"),
    pytest.param(lambda: WeightPrefetch.parse("threads=" + "9" * 5000), "an integer", id="wpf-int-digits"),
    pytest.param(lambda: WeightPrefetch.parse("cap=8;oproj->gateup=8"), "either windows", id="wpf-both"),
    pytest.param(lambda: parse_caps("1:x"), "invalid cap", id="caps"),
    pytest.param(lambda: parse_caps("1:inf"), "a number of MiB", id="caps-finite"),
    pytest.param(lambda: parse_caps("9" * 5000 + ":8"), "BATCH:MIB", id="caps-batch-digits"),
    pytest.param(lambda: parse_windows("oproj->gateup"), "NAME=CAPS", id="windows"),
    pytest.param(lambda: parse_windows("oproj->gateup=x"), "invalid cap", id="window-caps"),
    pytest.param(lambda: model_shape("llama-4"), "unknown model", id="model"),
]  # fmt: skip


@pytest.mark.parametrize("call, says", CASES)
def test_bad_input_is_a_one_line_usage_error(call: Callable[[], Any], says: str) -> None:
    with pytest.raises(UsageError) as caught:
        call()
    e = caught.value
    assert type(e) is UsageError and not isinstance(e, ValueError) and e.exit_code == 2
    assert says in str(e) and str(e).strip() and "\n" not in str(e)


def test_an_fp8_cache_with_a_head_size_its_layout_cannot_hold_is_refused_or_left_out() -> None:
    """vLLM's fp8 key cache holds 16 elements per innermost row: head 120 cannot be laid out
    (vLLM builds the kernel but no cache for it). A bench point is refused in one line; a
    validate matrix leaves those cases out, and is refused when nothing else is left."""
    from kvpatch.gpu.points import make_points
    from kvpatch.gpu.validate import validate_matrix

    with pytest.raises(UsageError, match=r"^head size 120 with a fp8 cache of fp16: .* multiple of 16") as e:
        make_points(dtypes=("fp16",), head_size=120, kv_cache_dtype="fp8")
    assert "\n" not in str(e.value)
    assert make_points(dtypes=("fp16",), head_size=120, kv_cache_dtype="auto")
    cases = validate_matrix(head_sizes=(120, 128), kv_cache_dtypes=("auto", "fp8"))
    assert {(c.head_size, c.kv_cache_dtype) for c in cases} == {(120, "auto"), (128, "auto"), (128, "fp8")}
    with pytest.raises(UsageError, match="no instantiation to validate"):
        validate_matrix(head_sizes=(120,), kv_cache_dtypes=("fp8",))
