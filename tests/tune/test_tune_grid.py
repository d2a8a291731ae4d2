"""The candidates ``kvpatch tune`` builds (the grid, ``--grid``) and the instantiations it
tunes (``--dtype``, ``--only``)."""

from __future__ import annotations

import itertools

import pytest

from kvpatch.errors import UsageError
from kvpatch.tune import GRID, candidates, parse_grid, tuned_instantiations


def test_the_grid_is_every_combination_uniform_and_shares_one_helper() -> None:
    grid = candidates()
    assert len(grid) == 12
    assert len({c.marker() for c in grid.values()}) == 12
    assert all(c.overrides == () for c in grid.values())
    assert grid["call_kvhead_la2"].scope == "kv-head" and grid["call_kvhead_la2"].lookahead == 2
    assert grid["inline_cta_la1"].issue == "inline"
    assert {c.issue for c in grid.values()} == {"inline", "call", "split"}
    # every candidate keeps the base's hint/align, so one helper serves all of them in a combined config
    assert {(c.cache_hint, c.align) for c in grid.values()} == {("none", 16)}


def test_parse_grid_replaces_or_adds_axes_and_names_the_gates() -> None:
    g = parse_grid("issue=inline,call; min-group=2; min-ctas=1,1024")
    assert dict(g) == {**dict(GRID), "issue": ("inline", "call"), "min_group": (2,), "min_ctas": (1, 1024)}
    cands = candidates(None, [g])
    assert len(cands) == 2 * 2 * 2 * 2
    c = cands["inline_kvhead_la2_mg2_ctas1024"]
    assert (c.issue, c.scope, c.lookahead, c.min_group, c.min_ctas) == ("inline", "kv-head", 2, 2, 1024)
    assert "call_cta_la1_mg2" in cands and cands["call_cta_la1_mg2"].min_ctas == 1
    # several grids: their union, the default one's names unchanged
    both = candidates(None, [GRID, g])
    assert len(both) == 12 + 16 and set(candidates()) < set(both)
    # read: a grid axis too, named _warp
    w = candidates(None, [parse_grid("issue=inline;scope=kv-head;lookahead=2;min-group=2;read=lane,warp")])
    assert (
        set(w) == {"inline_kvhead_la2_mg2", "inline_kvhead_la2_mg2_warp"}
        and w["inline_kvhead_la2_mg2_warp"].read == "warp"
    )
    assert w["inline_kvhead_la2_mg2"].read == "lane"
    for text, message in [("bogus=1", "KEY=V1,V2"), ("issue", "KEY=V1,V2"), ("issue=inline;issue=call", "twice"),
                          ("lookahead=1,1", "twice"), ("min-ctas=0", "min-ctas"), ("issue=fast", "invalid issue"),
                          (" ; ", "empty")]:  # fmt: skip
        with pytest.raises(UsageError, match=message):
            parse_grid(text)


def test_min_kv_mib_grid_pairs_only_with_the_call_form() -> None:
    """min-kv-mib is tested in the call helper: a grid that crosses it with inline and split
    builds it with call only (no duplicate of an ungated inline candidate under another name)."""
    cands = candidates(None, [parse_grid("issue=inline,call;scope=kv-head;lookahead=1;min-kv-mib=0,64")])
    assert sorted(cands) == ["call_kvhead_la1", "call_kvhead_la1_kv64", "inline_kvhead_la1"]
    assert cands["call_kvhead_la1_kv64"].min_kv_mib == 64 and cands["call_kvhead_la1"].min_kv_mib == 0


def test_the_tuned_instantiations_are_what_the_tuning_set_measures() -> None:
    """Every (dtype, head, block) tune names is one the tuning point set measures, with points
    where vLLM dispatches each of its two kernels (else that kernel could never be picked)."""
    from kvpatch.gpu import points as P

    tuned = tuned_instantiations()
    assert len(tuned) == len(set(tuned))
    points = P.point_set("tuning")
    assert set(tuned) == {(p.dtype, p.head_size, p.block_size) for p in points}
    dispatched = {(p.dtype, p.head_size, p.block_size, p.dispatched) for p in points}
    assert dispatched == {(*inst, k) for inst in tuned for k in ("v1", "v2")}


def test_dtype_and_only_narrow_the_instantiations() -> None:
    assert tuned_instantiations(["bf16"], ["*/256"]) == [("bf16", 256, 16), ("bf16", 256, 32)]
    assert tuned_instantiations(only=["fp16/128/16"]) == [("fp16", 128, 16)]
    assert set(tuned_instantiations(["fp16"])) | set(tuned_instantiations(["bf16"])) == set(tuned_instantiations())
    both = set(tuned_instantiations(only=["fp16/64", "*/*/32"]))
    assert both == {i for i in tuned_instantiations() if i[:2] == ("fp16", 64) or i[2] == 32}
    for dtypes, only, message in [([], ["fp16/80"], "pick no tuned instantiation"), ([], ["fp16/128/16/auto"], "invalid --only"),
                                  ([], ["fp16/128/16/*/v2"], "invalid --only"), (["fp32"], [], "pick no tuned"),
                                  ([], ["fp17"], "invalid selector")]:  # fmt: skip
        with pytest.raises(UsageError, match=message):
            tuned_instantiations(dtypes, only)


def test_the_build_spec_is_the_smallest_product_holding_the_instantiations(monkeypatch) -> None:
    """What tune builds: the dtypes, head and block sizes of the instantiations measured, auto cache."""
    from pathlib import Path

    from kvpatch import jit
    from kvpatch.commands.tune import tune_build_spec

    monkeypatch.setattr(jit, "make_spec", lambda root, variants, arch, **kw: kw)
    assert tune_build_spec(Path("."), [], "9.0a", only=["fp16/128/16", "fp16/256/16"]) == {
        "dtypes": ["fp16"], "head_sizes": [128, 256], "block_sizes": [16], "kv_cache_dtypes": ["auto"]}  # fmt: skip
    for dtypes in (["bf16"], None):
        spec = tune_build_spec(Path("."), [], "9.0a", dtypes=dtypes)
        built = set(itertools.product(spec["dtypes"], spec["head_sizes"], spec["block_sizes"]))
        assert built == set(tuned_instantiations(dtypes or ())) and spec["kv_cache_dtypes"] == ["auto"]
    assert tune_build_spec(Path("."), [], "9.0a", kv_cache_dtypes=("auto", "fp8"))["kv_cache_dtypes"] == ["auto", "fp8"]
