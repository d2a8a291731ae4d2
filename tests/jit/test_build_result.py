"""kvpatch.jit.result: what a build says about its kernels -- the SASS check (a prefetch missing
where the configuration wants one, or present where it does not), and the warnings against
stock (floating-point ops an ``issue=split`` build should share with stock; a key loop that
uses its loads right after issuing them), all surviving ``result.json``."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from jit_helpers import kernel, variant_result

from kvpatch.errors import BuildError
from kvpatch.jit import BuildResult, VariantResult


def test_problems_report_missing_and_unexpected_prefetch():
    kernels = (kernel(), kernel(kernel="v2"),
               kernel(kernel="reduce", block_size=0, kv_cache_dtype="", has_prefetch=False, expect_prefetch=False))  # fmt: skip
    result = variant_result("patched", kernels)
    assert result.problems() == []
    bad = replace(result, kernels=(kernel(has_prefetch=False), *kernels[1:]))
    assert bad.problems() == ["patched: v1 fp16/auto/128/16 sm_90a lacks UBLKPF in its SASS"]
    stray = replace(result, kernels=(*kernels[:2], replace(kernels[2], has_prefetch=True)))
    assert stray.problems() == ["patched: reduce fp16/128 sm_90a unexpectedly has UBLKPF in its SASS"]
    assert "found 2 kernels in the SASS, expected 3" in replace(result, kernels=kernels[:2]).problems()[0]
    BuildResult((result,), 0.0).check()
    with pytest.raises(BuildError, match=r"^SASS check failed: patched: v1 fp16/auto/128/16 sm_90a lacks UBLKPF in its "
                                         r"SASS \(\+1 more\)$"):  # fmt: skip
        BuildResult((bad, stray), 0.0).check()


def test_split_warnings_compare_floating_point_ops_with_stock():
    ops = (("FADD", 3), ("FFMA", 122))
    stock = variant_result("stock", (kernel(dtype="bf16", fp_ops=ops, has_prefetch=False),), "bf16/auto/128/16")
    same = replace(stock, name="split", kernels=(kernel(dtype="bf16", fp_ops=ops, split=True),))
    other = replace(same, name="other", kernels=(kernel(dtype="bf16", fp_ops=(("FFMA", 244),), split=True),))
    inline = replace(same, name="inline", kernels=(kernel(dtype="bf16", fp_ops=(("FFMA", 61),)),))
    moved = replace(
        same, name="moved", kernels=(kernel(dtype="bf16", fp_ops=(("FADD", 5), ("FFMA", 122)), split=True),)
    )
    result = BuildResult((stock, same, other, inline, moved), 0.0)
    assert result.split_warnings() == ["other: v1 bf16/auto/128/16 sm_90a: issue=split, but 244 FFMA in its SASS against "
                                       "stock's 122: expect outputs with ALiBi to differ (check with 'kvpatch validate')"]  # fmt: skip
    assert BuildResult((same, other), 0.0).split_warnings() == []  # no stock to compare with
    again = VariantResult.from_dict(json.loads(json.dumps(other.to_dict())))
    assert again.kernels == other.kernels


def test_schedule_warnings_compare_load_use_with_stock():
    stock = variant_result("stock", (kernel(has_prefetch=False, load_use=80.0),))
    close = replace(stock, name="close", kernels=(kernel(load_use=60.0),))
    near = replace(stock, name="near", kernels=(kernel(load_use=12.0),))
    unknown = replace(stock, name="unknown", kernels=(kernel(load_use=None),))
    off = replace(stock, name="off", kernels=(kernel(has_prefetch=False, expect_prefetch=False, load_use=5.0),))
    result = BuildResult((stock, close, near, unknown, off), 0.0)
    assert result.schedule_warnings() == ["near: v1 fp16/auto/128/16 sm_90a: its key loop uses each load 12 instructions "
                                          "after issuing it (median; stock's: 80): expect it slower than stock (measure with "
                                          "'kvpatch bench')"]  # fmt: skip
    assert BuildResult((close, near), 0.0).schedule_warnings() == []  # no stock to compare with
    again = VariantResult.from_dict(json.loads(json.dumps(near.to_dict())))
    assert again.kernels == near.kernels and again.kernels[0].load_use == 12.0


# --------------------------------------------------------------------------- the grouped form


def grouped(**kw):
    from kvpatch.jit.result import GroupedKernel

    base = dict(arch="sm_90a", kernel="v1", dtype="bf16", head_size=128, block_size=16, heads=4, lookahead=1,
                registers=130, spill_stores=0, spill_loads=0, has_prefetch=True, symbol="_Zgrouped")  # fmt: skip
    return GroupedKernel(**{**base, **kw})


def test_the_grouped_forms_kernels_are_checked_for_the_prefetch_and_warned_of_spills():
    kernels = (kernel(), kernel(kernel="v2"),
               kernel(kernel="reduce", block_size=0, kv_cache_dtype="", has_prefetch=False, expect_prefetch=False))  # fmt: skip
    result = replace(variant_result("patched", kernels), grouped=(grouped(), grouped(kernel="v2", lookahead=0,
                                                                                          has_prefetch=False)))  # fmt: skip
    assert result.problems() == [] and BuildResult((result,), 0.0).grouped_warnings() == []
    missing = replace(result, grouped=(grouped(has_prefetch=False),))
    assert missing.problems() == ["patched: grouped v1 bf16/128/16 x4 sm_90a lacks UBLKPF in its SASS"]
    stray = replace(result, grouped=(grouped(lookahead=0),))
    assert stray.problems() == ["patched: grouped v1 bf16/128/16 x4 sm_90a unexpectedly has UBLKPF in its SASS"]
    assert replace(result, grouped=(grouped(arch="sm_80", has_prefetch=False),)).problems() == []  # no UBLKPF below 9.0
    spills = replace(result, grouped=(grouped(head_size=256, registers=255, spill_stores=16),))
    assert BuildResult((spills,), 0.0).grouped_warnings() == [
        "patched: grouped v1 bf16/256/16 x4 sm_90a: 16 bytes spilled (255 registers): a smaller group may be faster there"
    ]
    # under launch bounds the spill may be theirs: the warning names them
    bounded = replace(result, grouped=(grouped(head_size=256, registers=128, spill_stores=164, ctas_per_sm=4),))
    assert BuildResult((bounded,), 0.0).grouped_warnings() == [
        "patched: grouped v1 bf16/256/16 x4 4/SM sm_90a: 164 bytes spilled (128 registers): a smaller "
        "group-ctas-per-sm or group may be faster there"
    ]
    # V vectors loaded a block ahead hold a block's more: the warning names group-v-loads first
    ahead = replace(result, grouped=(grouped(head_size=256, block_size=32, registers=255, spill_stores=344,
                                             v_loads="ahead"),))  # fmt: skip
    assert BuildResult((ahead,), 0.0).grouped_warnings() == [
        "patched: grouped v1 bf16/256/32 x4 v-ahead sm_90a: 344 bytes spilled (255 registers): group-v-loads = at-use "
        "(one block's V vectors fewer), a smaller group may be faster there"
    ]
    assert VariantResult.from_dict(json.loads(json.dumps(ahead.to_dict()))).grouped == ahead.grouped
    # and K vectors ahead name group-k-loads; both ahead name both, K first
    both = replace(result, grouped=(grouped(head_size=256, block_size=32, registers=255, spill_stores=128,
                                            k_loads="ahead", v_loads="ahead"),))  # fmt: skip
    assert BuildResult((both,), 0.0).grouped_warnings() == [
        "patched: grouped v1 bf16/256/32 x4 k-ahead v-ahead sm_90a: 128 bytes spilled (255 registers): group-k-loads = "
        "at-use (one block's K vectors fewer), group-v-loads = at-use (one block's V vectors fewer), a smaller group "
        "may be faster there"
    ]
    assert VariantResult.from_dict(json.loads(json.dumps(both.to_dict()))).grouped == both.grouped
    # a few bytes under launch bounds are what the bounds trade (the shipped table's bounded kernels)
    few = replace(result, grouped=(grouped(registers=128, spill_stores=8, spill_loads=8, ctas_per_sm=4),))
    assert BuildResult((few,), 0.0).grouped_warnings() == []
    assert BuildResult((replace(few, grouped=(grouped(registers=255, spill_stores=8),)),), 0.0).grouped_warnings()
    # result.json keeps them; a result.json of a kvpatch before the grouped form reads as none
    again = VariantResult.from_dict(json.loads(json.dumps(spills.to_dict())))
    assert again.grouped == spills.grouped
    old = spills.to_dict()
    del old["grouped"]
    assert VariantResult.from_dict(old).grouped == ()


def test_a_grouped_kernels_name_says_its_form():
    from kvpatch.jit.sass import describe_grouped

    name = ("void kvpatch_patched::kvpatch_grouped_v2_kernel<__nv_bfloat16, __nv_bfloat16, 256, 32, 128, 8, 1, 512>"
            "(float*, float*, __nv_bfloat16*)")  # fmt: skip
    assert describe_grouped(name) == {"kernel": "v2", "dtype": "bf16", "head_size": 256, "block_size": 32,
                                      "heads": 8, "lookahead": 1, "ctas_per_sm": 0, "logits": "shared"}  # fmt: skip
    # under launch bounds (group-ctas-per-sm): the same form, and the CTAs per SM it asks for
    bounded = ("void kvpatch_patched::kvpatch_grouped_v2_bounded_kernel<__nv_bfloat16, __nv_bfloat16, 128, 16, 128, 4, "
               "1, 512, 4>(float*, float*, __nv_bfloat16*)")  # fmt: skip
    assert describe_grouped(bounded) == {"kernel": "v2", "dtype": "bf16", "head_size": 128, "block_size": 16,
                                         "heads": 4, "lookahead": 1, "ctas_per_sm": 4, "logits": "shared"}  # fmt: skip
    # v1 with its logits in global memory (group-logits), with and without launch bounds
    glob = describe_grouped("void kvpatch_patched::kvpatch_grouped_v1_global_bounded_kernel<unsigned short, "
                            "unsigned short, 128, 16, 128, 2, 0, 4>(unsigned short*)")  # fmt: skip
    assert (glob["kernel"], glob["heads"], glob["ctas_per_sm"], glob["logits"]) == ("v1", 2, 4, "global")
    assert describe_grouped("void kvpatch_patched::kvpatch_grouped_v1_global_kernel<__nv_bfloat16, __nv_bfloat16, "
                            "64, 16, 128, 4, 1>(__nv_bfloat16*)")["logits"] == "global"  # fmt: skip
    v1 = describe_grouped("void kvpatch_patched::kvpatch_grouped_v1_bounded_kernel<unsigned short, unsigned short, "
                          "128, 32, 128, 4, 0, 3>(unsigned short*)")  # fmt: skip
    assert (v1["kernel"], v1["lookahead"], v1["ctas_per_sm"]) == ("v1", 0, 3)
    assert describe_grouped("void kvpatch_patched::kvpatch_grouped_v1_kernel<unsigned short, unsigned short, 64, "
                            "8, 128, 2, 0>(unsigned short*)")["dtype"] == "fp16"  # fmt: skip
    assert describe_grouped("void kvpatch_patched::paged_attention_v1_kernel<float, float, 64>(float*)") is None
