"""The pure parts of ``kvpatch plugin check`` (gpu_check, gpu_inputs) on CPU.

The matrix, the report, the bit comparison and the input layout are tested as they
are. The runner is driven eagerly (CUDA graphs need a GPU) against the stand-in
``_C`` of test_plugin_register: vLLM's kernel is standin.define_ops' CPU kernel,
the override's launcher standin.FakeLauncher; ``vllm._custom_ops`` is a stand-in giving
the trailing arguments their defaults as vLLM's wrappers do, and forward_decode a stand-in
applying vLLM's v1/v2 rule (kvpatch.gpu.dispatch) to the same ops.
"""

from __future__ import annotations

import contextlib
import math

import pytest

torch = pytest.importorskip("torch")

import standin as S  # noqa: E402

from kvpatch.config.defaults import DEFAULT_OVERRIDES  # noqa: E402
from kvpatch.gpu.dispatch import dispatched_kernel  # noqa: E402
from kvpatch.gpu.plugin_check import (  # noqa: E402
    Case,
    CaseResult,
    CheckReport,
    Timing,
    first_difference,
    matrix,
    run_cases,
)  # fmt: skip
from kvpatch.gpu.plugin_inputs import (  # noqa: E402
    LONG,
    SHAPES,
    custom_ops_call,
    forward_decode_call,
    long_cases,
    make_inputs,
    perturb,
)  # fmt: skip
from kvpatch.vllm_plugin import plugin  # noqa: E402


def test_matrix_selects_among_the_built_configs():
    built = ["fp16/auto/128/16", "fp16/fp8/128/16", "bf16/auto/80/16", "fp32/auto/256/32", "fp16/auto/128/8"]
    cases = matrix(built)
    assert {(c.dtype, c.kv_cache_dtype, c.head_size, c.block_size) for c in cases} == {
        ("fp16", "auto", 128, 16), ("fp16", "fp8", 128, 16), ("fp32", "auto", 256, 32)}  # fmt: skip
    assert len(cases) == 3 * 2 * 2  # ALiBi on/off, v1/v2
    assert cases == sorted(
        cases, key=lambda c: (c.dtype, c.kv_cache_dtype, c.head_size, c.block_size, c.kernel, c.alibi)
    )
    only = matrix(built, dtypes=["fp16"], kv_cache_dtypes=None, head_sizes=None, block_sizes=None, alibi=(True,),
                  kernels=("v2",))  # fmt: skip
    assert [c.label for c in only] == ["fp16/auto/128/8 v2 alibi", "fp16/auto/128/16 v2 alibi",
                                       "fp16/fp8/128/16 v2 alibi"]  # fmt: skip


def test_shapes_take_the_kernel_through_forward_decode():
    for kernel, (seqs, heads, _, max_len) in SHAPES.items():
        assert dispatched_kernel(seqs, heads, max_len) == kernel
    seqs, heads, kv_heads, max_len = LONG
    assert dispatched_kernel(seqs, heads, max_len) == "v1" and max_len == 8192 and heads // kv_heads == 4
    # the shipped table groups only launches of >= group_min_ctas CTAs of the grouped grid
    least = max(dict(rule).get("group_min_ctas", 1) for _, rule in DEFAULT_OVERRIDES)
    assert least > 1 and seqs * kv_heads >= least


def test_the_v1_cases_without_alibi_come_again_sized_for_8192_tokens():
    cases = matrix(["fp16/auto/128/16", "bf16/fp8/64/32"])
    again = long_cases(cases)
    assert [c.label for c in again] == ["bf16/fp8/64/32 v1 8192 tokens", "fp16/auto/128/16 v1 8192 tokens"]
    assert all(c.long and c.kernel == "v1" and not c.alibi for c in again) and long_cases(again) == []


def test_a_long_case_is_sized_for_8192_tokens_over_a_shared_pool_of_blocks():
    case = long_cases([Case("fp16", "auto", 64, 16, False, "v1")])[0]
    inp = make_inputs(case, device="cpu")
    seqs, heads, kv_heads, max_len = LONG
    per_seq = max_len // 16
    assert inp["query"].shape == (seqs, heads, 64) and inp["max_seq_len"] == max_len
    assert inp["key_cache"].shape == (2 * per_seq, kv_heads, 8, 16, 8) and inp["block_tables"].shape == (seqs, per_seq)
    assert 0 <= int(inp["block_tables"].min()) and int(inp["block_tables"].max()) < 2 * per_seq
    assert int(inp["seq_lens"].max()) == max_len


def test_first_difference():
    a = torch.tensor([[1.0, float("nan")], [3.0, 4.0]], dtype=torch.float16)
    assert first_difference(a, a.clone()) is None  # the same NaN is the same bits
    b = a.clone()
    b[1, 0] = 3.001
    assert first_difference(a, b) == "out[1, 0]: vLLM 3, kvpatch 3.00195 (1 of 4 elements differ)"
    assert first_difference(torch.tensor([0.0]), torch.tensor([-0.0])).startswith("out[0]")  # not the same bits
    assert "float32" in first_difference(a, a.float())


def test_report():
    case = Case("fp16", "auto", 128, 16, True, "v2")
    r = CheckReport(results=[CaseResult(case, "custom_ops", "eager", True),
                             CaseResult(case, "forward_decode", "graph replayed", False, "out[0, 1, 2]: ...")],
                    timings=[Timing("fp16 128/16 v1 64x1024", 30.0, 24.0)])  # fmt: skip
    assert not r.ok and r.first_failure.path == "forward_decode"
    assert r.summary() == [
        "1/2 outputs bit-identical to vLLM's kernel (1 cases)",
        "first difference: fp16/auto/128/16 v2 alibi via forward_decode, graph replayed: out[0, 1, 2]: ...",
        "fp16 128/16 v1 64x1024: vLLM 30.0 us, kvpatch 24.0 us (1.250x)",
    ]
    d = r.to_dict()
    assert (
        d["ok"] is False and d["results"][1]["label"].endswith("graph replayed") and d["timings"][0]["speedup"] == 1.25
    )
    assert CheckReport().ok is False and math.isnan(Timing("x", 1.0, 0.0).speedup)


@pytest.mark.parametrize("kv", ["auto", "fp8", "fp8_e5m2"])
def test_inputs_are_laid_out_as_vllms(kv):
    case = Case("bf16", kv, 64, 16, True, "v2")
    inp = make_inputs(case, device="cpu")
    seqs, heads, kv_heads, max_len = SHAPES["v2"]
    x = 16 if kv != "auto" else 8
    assert inp["key_cache"].shape[1:] == (kv_heads, 64 // x, 16, x) and inp["value_cache"].shape[1:] == (
        kv_heads,
        64,
        16,
    )
    assert inp["key_cache"].dtype == (torch.uint8 if kv != "auto" else torch.bfloat16)
    assert inp["query"].shape == (seqs, heads, 64) and inp["alibi_slopes"].shape == (heads,)
    assert int(inp["seq_lens"].max()) == max_len and inp["block_tables"].dtype == torch.int32
    assert sorted(inp["block_tables"].flatten().tolist()) == list(range(inp["key_cache"].shape[0]))
    again = make_inputs(case, device="cpu")
    assert torch.equal(again["query"], inp["query"])  # seeded: both sides see the same inputs
    q = inp["query"].clone()
    perturb(inp, 1)
    assert not torch.equal(q, inp["query"])
    assert make_inputs(case, device="cpu", scale_by_value=True)["k_scale"] == 1.0


@pytest.fixture
def standin_ops(tmp_path):
    ns = S.unique_namespace()
    keep = S.define_ops(ns, S.TENSOR_SCALES)
    bundle = S.make_bundle(tmp_path / "bundle")

    def setup(value):
        launcher = S.FakeLauncher(S.SMALL_SET.labels(), value=value)
        target = S.make_target(ns, bundle, launcher)
        assert plugin.register(target).registered
        reg = plugin.registration(target)

        @contextlib.contextmanager
        def switch(ours):
            (reg.resume if ours else reg.suspend)()
            try:
                yield
            finally:
                reg.resume()

        raw = S.ops(ns)

        class ops:  # noqa: N801 - vllm._custom_ops' two wrappers: the trailing arguments' defaults
            paged_attention_v1 = staticmethod(lambda *a: raw.paged_attention_v1(*a, 0, 0, 0, 64, 0))
            paged_attention_v2 = staticmethod(lambda *a: raw.paged_attention_v2(*a, 0, 0, 0, 64, 0))

        def forward_decode(query, key_cache, value_cache, block_tables, seq_lens, max_seq_len, *rest):
            kernel = dispatched_kernel(query.shape[0], query.shape[1], max_seq_len)
            inp = dict(zip(["query", "key_cache", "value_cache", "block_tables", "seq_lens", "max_seq_len",
                            "kv_cache_dtype", "num_kv_heads", "scale", "alibi_slopes", "k_scale", "v_scale"],
                           [query, key_cache, value_cache, block_tables, seq_lens, max_seq_len, *rest]))  # fmt: skip
            inp["block_size"] = value_cache.shape[3]
            return custom_ops_call(ops, kernel)(inp)

        calls = {
            "custom_ops": lambda k: custom_ops_call(ops, k),
            "forward_decode": lambda k: forward_decode_call(forward_decode),
        }
        return launcher, calls, switch

    yield setup
    del keep


def test_run_cases_finds_a_difference(standin_ops):
    launcher, calls, switch = standin_ops(S.OURS)
    cases = matrix(S.SMALL_SET.labels(), head_sizes=(32,), alibi=(False,))
    results = run_cases(cases, calls, switch, device="cpu", graphs=False)
    assert len(results) == len(cases) * 2 and not any(r.equal for r in results)
    assert results[0].difference.startswith("out[0, 0, 0]: vLLM 1, kvpatch 2 (")
    assert len(launcher.calls) == len(results)  # each case's override side reached the launcher once


def test_run_cases_all_equal(standin_ops):
    launcher, calls, switch = standin_ops(S.STOCK)  # a launcher that computes what vLLM's kernel does
    cases = matrix(S.SMALL_SET.labels())
    results = run_cases(cases, calls, switch, device="cpu", graphs=False)
    report = CheckReport(results=results)
    assert (
        report.ok
        and report.summary()[0]
        == f"{len(results)}/{len(results)} outputs bit-identical to vLLM's kernel ({len(cases)} cases)"
    )
    assert {k for k, _ in launcher.calls} == {"v1", "v2"}


def test_run_cases_reports_an_exception(standin_ops):
    launcher, calls, switch = standin_ops(S.OURS)
    launcher.rc = 700
    results = run_cases(matrix(S.SMALL_SET.labels())[:1], calls, switch, device="cpu", graphs=False)
    assert results[0].error.startswith("kvpatch: RuntimeError: kvpatch paged_attention_v1 failed")
