"""kvpatch.jit.build with nvcc: stock and patched kernels of a real release compiled into two
libraries, their SASS checked (``UBLKPF`` exactly where the configuration prefetches), the
content-keyed cache (hits, damaged entries rebuilt, older entries read again), the warnings
against stock, and the libraries loaded without torch (kvpatch.gpu.launch).

The builds need nvcc and the SASS tools (``nvidia-cuda-cuobjdump``, ``nvidia-cuda-nvdisasm``);
they are small specs (one dtype, head size 128, block size 16: about 3 s a variant on 2 cores)
in a cache shared by the session.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from jit_helpers import (  # noqa: F401  (fixtures)
    ALL_DTYPES,
    NVCC_MARKS,
    build_cache,
    stock_and_patched,
    tree_0102,
    tree_064,
    variants_0102,
)

from kvpatch.config import make_config
from kvpatch.errors import BuildError
from kvpatch.gpu.launch import Kernels
from kvpatch.jit import (
    HEADER,
    BuildResult,
    Variant,
    build,
    make_spec,
    parse_arch_list,
    patched_variants,
    vllm_nvcc_flags,
)
from kvpatch.jit.sass import sass_functions
from kvpatch.progress import Recorder

pytestmark = NVCC_MARKS


@pytest.fixture(scope="module")
def spec_9a(tree_0102, variants_0102):
    # head 64 block 16: the default has all three forms there (fp16 v1 inline asm, bf16 a call
    # to the helper, fp16 v2 and fp32 off)
    return make_spec(tree_0102, variants_0102, "9.0a", dtypes=ALL_DTYPES, head_sizes=[64])


@pytest.fixture(scope="module")
def built_9a(spec_9a, build_cache) -> BuildResult:
    return build(spec_9a, cache=build_cache)


def test_unsupported_arch_is_a_clear_error(spec_9a, build_cache):
    spec = replace(spec_9a, archs=tuple(parse_arch_list("7.0")))
    with pytest.raises(BuildError, match=r"cannot compile for 7.0; it supports .*7\.5"):
        build(spec, cache=build_cache)


def test_build_sm90a_prefetch_only_in_patched(built_9a, tree_0102):
    stock, patched = built_9a.variants
    assert built_9a.problems() == []
    # the default at head 64 block 16: fp16 v1 inline asm, bf16 v1 and v2 a call to the helper
    # (so an empty helper fails this), fp16 v2 off (no candidate was never-slower), fp32 off (not tuned)
    on = {("v1", "fp16"), ("v1", "bf16"), ("v2", "bf16")}
    assert [(k.kernel, k.dtype, k.has_prefetch) for k in patched.kernels] == [
        (kernel, dtype, (kernel, dtype) in on) for kernel in ("v1", "v2", "reduce") for dtype in ALL_DTYPES
    ]
    assert all(k.has_prefetch == k.expect_prefetch for k in patched.kernels)
    assert not any(k.has_prefetch for k in stock.kernels)
    assert "UBLKPF" in patched.read_sass() and "UBLKPF" not in stock.read_sass()
    # one translation unit of vLLM's form; the patched header's grouped form launches from its own
    assert [len(v.cubins) for v in (stock, patched)] == [1, 2]
    for v in (stock, patched):
        assert v.library.is_file() and {c.name.split(".")[-2] for c in v.cubins} == {"sm_90a"}
        assert all(k.registers > 0 and k.arch == "sm_90a" for k in v.kernels)
        assert {k.kernel for k in v.kernels} == {"v1", "v2", "reduce"}
        assert v.steps and not v.cached
    # the tree itself is untouched
    assert subprocess.run(["git", "status", "--porcelain"], cwd=tree_0102, capture_output=True, text=True).stdout == ""


def test_build_sm80_has_no_prefetch(tree_0102, variants_0102, build_cache):
    spec = make_spec(tree_0102, [variants_0102[1]], "8.0", dtypes=["fp16"])
    (patched,) = build(spec, cache=build_cache).variants
    assert [(k.arch, k.kernel, k.has_prefetch, k.expect_prefetch) for k in patched.kernels] == [
        ("sm_80", "v1", False, False),
        ("sm_80", "v2", False, False),
        ("sm_80", "reduce", False, False),
    ]
    assert "UBLKPF" not in patched.read_sass()


def test_variants_have_distinct_symbols(built_9a):
    stock, patched = built_9a.variants
    assert {k.symbol for k in stock.kernels}.isdisjoint(k.symbol for k in patched.kernels)
    assert all("kvpatch_stock" in k.symbol for k in stock.kernels)
    assert all("kvpatch_patched" in k.symbol for k in patched.kernels)
    if shutil.which("nm"):
        exported = {
            v.name: subprocess.run(
                ["nm", "-D", "--defined-only", str(v.library)], capture_output=True, text=True
            ).stdout
            for v in (stock, patched)
        }
        assert "kvpatch_stock_paged_attention_v1" in exported["stock"]
        assert "kvpatch_patched_paged_attention_v2" in exported["patched"]
        assert "kvpatch_stock" not in exported["patched"] and "paged_attention_v1_kernel" not in exported["stock"]


def test_repeat_build_is_a_cache_hit(built_9a, spec_9a, build_cache):
    mtimes = [v.library.stat().st_mtime_ns for v in built_9a.variants]
    log = Recorder()
    again = build(spec_9a, cache=build_cache, progress=log)
    assert [v.cached for v in again.variants] == [True, True]
    assert [line.split(":")[0] for line in log.lines] == ["stock", "patched"] and all("cached" in x for x in log.lines)
    assert [v.library.stat().st_mtime_ns for v in again.variants] == mtimes
    assert [v.kernels for v in again.variants] == [v.kernels for v in built_9a.variants]
    data = json.loads(json.dumps(again.to_dict()))  # the CLI's --json
    assert data["vllm_flags"] == list(vllm_nvcc_flags())
    for v in data["variants"]:
        assert v["compile_flags"][: len(vllm_nvcc_flags())] == list(vllm_nvcc_flags())
        assert "release" in v["nvcc"] and v["library_bytes"] > 0 and len(v["library_sha256"]) == 64


@pytest.mark.parametrize("damage", ["empty", "truncated", "changed"])
def test_damaged_cached_library_is_rebuilt(damage, tree_0102, variants_0102, tmp_path):
    spec = make_spec(tree_0102, variants_0102[:1], "9.0a", dtypes=["fp16"])
    (first,) = build(spec, cache=tmp_path).variants
    good = first.library.read_bytes()
    recorded = json.loads((first.dir / "result.json").read_text())
    assert recorded["library_bytes"] == len(good)
    if damage == "empty":
        first.library.write_bytes(b"")
    elif damage == "truncated":
        first.library.write_bytes(good[: len(good) // 2])
    else:
        first.library.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    log = Recorder()
    (again,) = build(spec, cache=tmp_path, progress=log).variants
    said = "\n".join(log.lines)
    assert not again.cached and "damaged" in said and "rebuilding" in said
    assert ("sha256" in said) == (damage == "changed")  # same size: the digest says why
    assert again.library.read_bytes() == good
    (third,) = build(spec, cache=tmp_path).variants
    assert third.cached


def test_what_is_planted_in_a_cached_build_is_replaced_never_read_or_written_through(tree_0102, variants_0102,
                                                                                     tmp_path):  # fmt: skip
    """Before: a FIFO at result.json hung the build with its lock held (/dev/zero filled memory),
    a link at a source file had the generated source written into the file it named, and a
    truncated object of an interrupted build was linked again and again (nvlink: internal error).
    After: each is rebuilt as damage is; a link's target is left as it was."""
    import os

    spec = make_spec(tree_0102, variants_0102[:1], "9.0a", dtypes=["fp16"])
    (first,) = build(spec, cache=tmp_path).variants
    victim = tmp_path / "victim.txt"
    victim.write_text("not kvpatch's")
    (first.dir / "result.json").unlink()
    os.mkfifo(first.dir / "result.json")
    source = next(first.dir.glob("launcher_*.cu"))
    source.unlink()
    source.symlink_to(victim)
    shard = next(first.dir.glob("launcher_*.o"))
    shard.write_bytes(shard.read_bytes()[:100])
    (again,) = build(spec, cache=tmp_path).variants
    assert not again.cached and again.kernels == first.kernels  # the shard compiled again: a library as good
    assert victim.read_text() == "not kvpatch's" and not source.is_symlink()
    assert (first.dir / "result.json").is_file() and build(spec, cache=tmp_path).variants[0].cached
    # a directory where the library goes is no build to reuse or rename over: said, with the entry to delete
    (first.dir / "result.json").unlink()
    first.library.unlink()
    first.library.mkdir()
    with pytest.raises(BuildError, match=rf"{first.library.name} is a directory, not the library: delete the cache"):
        build(spec, cache=tmp_path)
    assert not list(first.dir.glob("*.so.tmp"))


def test_a_build_cache_this_user_cannot_write_is_said_as_that(tree_0102, variants_0102, tmp_path, monkeypatch):
    """Before: "<key>.lock: Permission denied", exit 1, with no word of the cache. After: the
    cache, why it must be writable and what to do (a BuildError, exit 5)."""
    from kvpatch.jit import library

    def refused(path, **kw):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(library, "hold_lock", refused)
    spec = make_spec(tree_0102, variants_0102[:1], "9.0a", dtypes=["fp16"])
    with pytest.raises(BuildError, match=r"^the build cache .* is not writable by this user .*set KVPATCH_CACHE"):
        build(spec, cache=tmp_path)


def test_a_cached_build_without_load_use_gets_it_from_its_sass(tree_0102, variants_0102, tmp_path):
    """A build cached by a kvpatch that did not record the key loop's load-use distance is read
    again from its kept SASS, once (FP op counts too): the numbers equal a fresh build's and
    result.json keeps them."""
    spec = make_spec(tree_0102, variants_0102[:1], "9.0a", dtypes=["fp16"])
    (first,) = build(spec, cache=tmp_path).variants
    assert all(k.load_use for k in first.kernels if k.kernel != "reduce")
    path = first.dir / "result.json"
    old = json.loads(path.read_text())
    for k in old["kernels"]:
        del k["load_use"]
        k["fp_ops"] = [["FFMA", 1]]  # what an older kvpatch counted is read again too
    path.write_text(json.dumps(old))
    (again,) = build(spec, cache=tmp_path).variants
    assert again.cached and again.kernels == first.kernels
    assert [k["load_use"] for k in json.loads(path.read_text())["kernels"]] == [k.load_use for k in first.kernels]


def test_sass_check_fails_the_build(tree_0102, variants_0102, build_cache):
    liar = Variant("liar", variants_0102[0].header, expect_prefetch=True)
    spec = make_spec(tree_0102, [liar], "9.0a", dtypes=["fp16"])
    with pytest.raises(BuildError, match=r"^SASS check failed: liar: v1 fp16/auto/128/16 sm_90a lacks UBLKPF in its SASS "
                                         r"\(\+1 more\)$"):  # fmt: skip
        build(spec, cache=build_cache)
    (unchecked,) = build(spec, cache=build_cache, check=False).variants
    assert unchecked.cached and len(unchecked.problems()) == 2


def test_nvcc_failure_is_one_line(tree_0102, variants_0102, build_cache):
    broken = Variant("broken", variants_0102[0].header + "\n#error kvpatch-test-breakage\n")
    spec = make_spec(tree_0102, [broken], "9.0a", dtypes=["fp16"])
    with pytest.raises(BuildError, match="nvcc failed for 'broken': .*kvpatch-test-breakage") as e:
        build(spec, cache=build_cache)
    assert "\n" not in str(e.value)


def test_runtime_loads_without_torch(built_9a, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # an import of torch fails from here on
    stock, patched = built_9a.variants
    k = Kernels(stock.library, stock.prefix)
    p = Kernels.from_build(patched)
    assert k.configs == ("fp16/auto/64/16", "bf16/auto/64/16", "fp32/auto/64/16") == p.configs
    assert not k.scale_by_value
    assert k.error_string(-1) == "configuration not built into this library"
    with pytest.raises(RuntimeError, match="no kvpatch_patched_abi_version"):
        Kernels(stock.library, "kvpatch_patched")


def test_build_064_takes_scales_by_value(tree_064, build_cache):
    stock, _ = stock_and_patched(tree_064)
    spec = make_spec(tree_064, [stock], "9.0a", dtypes=["bf16"])
    (built,) = build(spec, cache=build_cache).variants
    assert Kernels(built.library, built.prefix).scale_by_value
    assert "          a.k_scale,\n          a.v_scale," in (built.dir / "launcher_0.cu").read_text()


def _build_gated_and_plain(tree: Path, cache, issue: str, **gate):
    """Stock and two uniform patched builds of fp16 head 128 block 16 (v1, v2): 'plain' (kv-head
    scope, min-group 2, read=warp, ``issue``) and 'gated', the same with the ``gate`` settings."""
    path = tree / HEADER
    base = make_config(inherit_rules=False, fp16="none", bf16="none", fp32="none", rules="none", issue=issue,
                       scope="kv-head", min_group=2, read="warp")  # fmt: skip
    variants = patched_variants(
        path.read_text(encoding="utf-8"), str(path), {"gated": replace(base, **gate), "plain": base}
    )
    spec = make_spec(tree, variants, "9.0a", dtypes=["fp16"], head_sizes=[128], block_sizes=[16])
    return build(spec, cache=cache)


def test_build_warns_where_ptxas_schedules_the_key_loads_next_to_their_use(tree_0102, build_cache):
    """fp16 head 128 block 16 v1: with min-ctas 1024 and read=warp, ptxas issues each key load
    right before its use (0.49x stock on the H200: ctas-probe in benchmarks/ARCHIVE.md); without the
    gate it issues them all up front (1.10x)."""
    result = _build_gated_and_plain(tree_0102, build_cache, "inline", min_ctas=1024)
    warned = {w.split(": ")[0] + " " + w.split(": ")[1].split()[0] for w in result.schedule_warnings()}
    assert warned == {"gated v1", "gated v2"}
    assert all(k.load_use for v in result.variants for k in v.kernels if k.kernel != "reduce")


def test_min_kv_mib_leaves_the_calling_loop_as_without_it(tree_0102, build_cache):
    """min-kv-mib's test lives in the call helper, so the loop calling it keeps the ungated
    form's key-load schedule (a test in the loop moved the loads next to their use:
    kv-gate-probe in benchmarks/ARCHIVE.md), and the helper still holds the prefetch."""
    result = _build_gated_and_plain(tree_0102, build_cache, "call", min_kv_mib=64)
    assert result.schedule_warnings() == []
    by = {v.name: {k.kernel: k for k in v.kernels if k.kernel != "reduce"} for v in result.variants}
    for kernel in ("v1", "v2"):
        gated, plain = by["gated"][kernel], by["plain"][kernel]
        assert gated.load_use == plain.load_use and gated.registers == plain.registers, (kernel, gated, plain)
        assert gated.has_prefetch and gated.load_use >= 0.5 * by["stock"][kernel].load_use


def test_build_warns_where_split_does_not_compile_as_stock(tree_0102, build_cache):
    """bf16 head 128: stock's key loop is unswitched on the ALiBi slope at block 16, not at 32.
    With issue=split block 16 keeps stock's floating-point SASS; block 32 does not, and says so."""
    stock = (tree_0102 / HEADER).read_text(encoding="utf-8")
    variants = patched_variants(
        stock, str(tree_0102 / HEADER), {"split": make_config(inherit_rules=False, issue="split")}
    )
    spec = make_spec(tree_0102, variants, "9.0a", dtypes=["bf16"], head_sizes=[128], block_sizes=[16, 32])
    result = build(spec, cache=build_cache)
    split = result.variant("split")
    assert {(k.kernel, k.block_size) for k in split.kernels if k.split} == {
        ("v1", 16),
        ("v2", 16),
        ("v1", 32),
        ("v2", 32),
    }
    warned = {(w.split(": ")[1]) for w in result.split_warnings()}
    assert warned == {"v1 bf16/auto/128/32 sm_90a", "v2 bf16/auto/128/32 sm_90a"}
    # the prefetch is other code than stock's in every kernel it is in, by the digests a bench reads
    mine, theirs = split.code(), result.variant("stock").code()
    assert mine.keys() == theirs.keys() and len(mine) == 4 and all(mine[k] != theirs[k] for k in mine)


def _build_ruled(tree, cache, kernel: str, rules: dict[str, str], dtype: str, head_sizes: list[int]):
    """One variant per ``rules`` entry (name -> the rule for ``kernel``, nothing else patched),
    built for sm_90a at block 16: the built variants, in that order."""
    path = str(tree / HEADER)
    stock = (tree / HEADER).read_text(encoding="utf-8")
    configs = {name: make_config(inherit_rules=False, rules={kernel: rule}) for name, rule in rules.items()}
    variants = patched_variants(stock, path, configs)[1:]
    spec = make_spec(tree, variants, "9.0a", dtypes=[dtype], head_sizes=head_sizes, block_sizes=[16])
    return build(spec, cache=cache).variants


def _stock_form_sass(variant, keep=lambda symbol: "paged_attention" in symbol) -> dict[str, list[str]]:
    """A built variant's kernels that ``keep`` names (default vLLM's form, paged_attention_*), named
    without its namespace -> their SASS."""
    ns = f"{len(variant.prefix)}{variant.prefix}"
    return {
        symbol.replace(ns, ""): [i for _, i in instrs]
        for _, symbol, instrs, _ in sass_functions(variant.read_sass().splitlines())
        if symbol and keep(symbol)
    }


def test_group_ctas_per_sm_compiles_the_grouped_kernels_to_fit_that_many_ctas_on_an_sm(tree_0102, build_cache):
    """Before (group-ctas-per-sm 0): the grouped kernels carry no launch bounds and take the
    registers nvcc chooses. After (4): the launcher instantiates the bounded kernels instead,
    each held to 65536 / (4 x 128) = 128 registers a thread, and says so in the build result.
    Either way v1 is also built with half the group, which the launcher takes where a long
    context's logits leave room for only one CTA of the full group on an SM."""
    rule = "group=4,group-min-ctas=256"
    rules = {"free": rule, "bounded": rule + ",group-ctas-per-sm=4", "whole": rule + ",group-half-below=0",
             "fit": rule + ",group-fit-ctas=4"}  # fmt: skip
    free, bounded, whole, fit = _build_ruled(tree_0102, build_cache, "fp16/256/16", rules, "fp16", [256])
    # v1 also with half the group: the launcher's choice where shared memory (a long context's
    # logits) leaves room for one CTA of the full group on an SM; v2 never needs it
    forms = [("v1", 2), ("v1", 4), ("v2", 4)]
    assert (
        sorted((g.kernel, g.heads) for g in free.grouped)
        == sorted((g.kernel, g.heads) for g in bounded.grouped)
        == forms
    )
    assert all(g.ctas_per_sm == 0 and "bounded" not in g.symbol for g in free.grouped)
    assert all(g.ctas_per_sm == 4 and "bounded" in g.symbol and g.registers <= 128 for g in bounded.grouped)
    assert any(g.registers > 128 for g in free.grouped)  # what the bounds are for: nvcc takes more without
    assert all(g.ok for g in bounded.grouped)  # the prefetch is where its lookahead says
    # group-half-below 0: the launcher never halves the group, so no half-group kernel is built
    assert sorted((g.kernel, g.heads) for g in whole.grouped) == [("v1", 4), ("v2", 4)]
    # group-fit-ctas 4: the same kernels, v1's taking their heads in passes where a sequence's
    # logits do not fit, v2's untouched
    assert sorted((g.kernel, g.heads) for g in fit.grouped) == forms and all(g.ok for g in fit.grouped)
    regs = {(g.kernel, g.heads): g.registers for g in free.grouped}
    assert all(g.registers == regs[g.kernel, g.heads] for g in fit.grouped if g.kernel == "v2")


def test_vllms_own_form_beside_the_grouped_form_is_the_stock_builds_code(tree_0102, variants_0102, build_cache):
    """A library whose header has the grouped form launches it from translation units of its own:
    vLLM's form of every kernel the table leaves off is the SASS of the stock build, instruction
    for instruction. (Compiled in one unit with the grouped kernels, nvcc gave fp16 head 128 block
    16 v1 25 fewer registers and other code, 0.3-0.6x as fast.)"""
    rules = {"grouped": "group=4,group-min-ctas=256,group-ctas-per-sm=4,group-logits=auto,off"}
    (grouped,) = _build_ruled(tree_0102, build_cache, "fp16/128/16/auto", rules, "fp16", [128])
    spec = make_spec(tree_0102, [variants_0102[0]], "9.0a", dtypes=["fp16"], head_sizes=[128], block_sizes=[16])
    (stock,) = build(spec, cache=build_cache).variants
    assert stock.name == "stock"
    assert [(g.kernel, g.heads) for g in grouped.grouped] and len(grouped.cubins) == 2 * len(stock.cubins)
    own = [_stock_form_sass(v) for v in (stock, grouped)]
    assert len(own[0]) == 3 and own[0] == own[1]  # v1, v2 and the reduce kernel
    # what a bench reads of it: the same code as stock's in a launch of vLLM's form, and a form of its own
    mine, theirs = grouped.code(), stock.code()
    assert {k: mine[k] for k in theirs} == theirs and set(theirs) == {"fp16/128/16/auto/v1", "fp16/128/16/auto/v2"}
    assert set(mine) - set(theirs) == {"fp16/128/16/auto/v1 grouped", "fp16/128/16/auto/v2 grouped"}


def test_passes_leave_vllms_own_form_of_every_kernel_as_it_was(tree_0102, build_cache):
    """Before (group-fit-ctas 0) and after (4) on fp16 head 128 block 16, built with fp16 head 64
    beside it: only the grouped kernels may differ; vLLM's own form of every kernel, the grouped
    configuration's and its neighbour's, is the same SASS. (A pass compiled as a call of its own
    changed how nvcc compiled both.)"""
    rule = "group=4,group-min-ctas=256,group-ctas-per-sm=4"
    rules = {"nofit": rule, "fit": rule + ",group-fit-ctas=4"}
    nofit, fit = _build_ruled(tree_0102, build_cache, "fp16/128/16/auto/v1", rules, "fp16", [64, 128])
    assert sorted((g.kernel, g.heads) for g in fit.grouped) == [("v1", 2), ("v1", 4)]
    own = [_stock_form_sass(v) for v in (nofit, fit)]
    assert len(own[0]) == 6 and own[0] == own[1]  # v1, v2 and its reduce kernel, of head 64 and 128


def test_group_logits_adds_v1_kernels_with_global_logits_and_leaves_the_others_as_they_were(tree_0102, build_cache):
    """Before (group-logits shared): the grouped v1 kernels keep their logits in shared memory.
    After (global, auto): the launcher also instantiates v1 kernels that keep them in global
    memory, full and half group, under the same launch bounds; the shared-memory kernels and
    vLLM's own form are the same SASS as before."""
    rule = "group=4,group-min-ctas=256,group-ctas-per-sm=4"
    rules = {"shared": rule, "global": rule + ",group-logits=global", "auto": rule + ",group-logits=auto"}
    shared, glob, auto = _build_ruled(tree_0102, build_cache, "fp16/128/16/auto/v1", rules, "fp16", [128])

    def forms(variant) -> list[tuple]:
        return sorted((g.kernel, g.heads, g.logits) for g in variant.grouped)

    assert forms(shared) == [("v1", 2, "shared"), ("v1", 4, "shared")]
    assert forms(glob) == forms(auto) == [("v1", 2, "global"), ("v1", 2, "shared"), ("v1", 4, "global"),
                                          ("v1", 4, "shared")]  # fmt: skip
    assert all(g.ctas_per_sm == 4 and g.registers <= 128 and g.ok for g in glob.grouped)
    assert all(("_global_" in g.symbol) == (g.logits == "global") for g in glob.grouped)
    not_global = lambda symbol: "_global_" not in symbol  # noqa: E731
    assert (
        _stock_form_sass(shared, not_global) == _stock_form_sass(glob, not_global) == _stock_form_sass(auto, not_global)
    )
    assert len(_stock_form_sass(shared, not_global)) == 5  # vLLM's v1, v2, reduce; the grouped v1 x4 and x2
    # what a bench reads of them: vLLM's form the same code in all three; the grouped v1 launch may
    # run a kernel only the global and auto libraries hold (the same kernels in both)
    codes = [v.code() for v in (shared, glob, auto)]
    assert all(c["fp16/128/16/auto/v1"] == codes[0]["fp16/128/16/auto/v1"] for c in codes)
    assert codes[0]["fp16/128/16/auto/v1 grouped"] != codes[1]["fp16/128/16/auto/v1 grouped"]
    assert codes[1]["fp16/128/16/auto/v1 grouped"] == codes[2]["fp16/128/16/auto/v1 grouped"]
    # a sequence longer than the launch's max_seq_len would write past its rows of the buffer: the
    # global kernels stop the launch there (a trap), the shared ones fault as stock's form does
    grouped = lambda symbol: "kvpatch_grouped" in symbol  # noqa: E731
    traps = {symbol: any(i.startswith("BPT.TRAP") for i in sass) for symbol, sass in
             _stock_form_sass(glob, grouped).items()}  # fmt: skip
    assert len(traps) == 4 and all(trap == ("_global_" in symbol) for symbol, trap in traps.items()), traps


def _loads_ahead(tree, cache, loads: str, kernel: str, dtype: str, head: int) -> tuple[dict, dict]:
    """``kernel`` grouped (group 4, >= 256 CTAs) with ``group-{loads}-loads`` at use and ahead
    (``loads``: ``k`` or ``v``): the same grouped kernels are built, the build says which load ahead
    (in the report's labels and its JSON; their names do not), vLLM's own form is the same SASS and
    each grouped kernel's differs. Returns the grouped kernels' SASS, at use and ahead."""
    rule = "group=4,group-min-ctas=256"
    at_use, ahead = _build_ruled(tree, cache, kernel, {"at_use": rule, "ahead": rule + f",group-{loads}-loads=ahead"},
                                 dtype, [head])  # fmt: skip
    assert sorted((g.kernel, g.heads) for g in at_use.grouped) == sorted((g.kernel, g.heads) for g in ahead.grouped)
    field = f"{loads}_loads"
    assert {getattr(g, field) for g in at_use.grouped} == {"at-use"}
    assert {getattr(g, field) for g in ahead.grouped} == {"ahead"}
    assert all(f" {loads}-ahead " in g.label for g in ahead.grouped)
    assert not any("ahead" in g.label for g in at_use.grouped)
    assert _stock_form_sass(at_use) == _stock_form_sass(ahead)
    grouped = lambda symbol: "kvpatch_grouped" in symbol  # noqa: E731
    before, after = _stock_form_sass(at_use, grouped), _stock_form_sass(ahead, grouped)
    assert before.keys() == after.keys() and len(before) == 3  # v1 with 4 and 2 heads, v2
    assert all(before[symbol] != after[symbol] for symbol in before)
    return before, after


def test_group_v_loads_ahead_changes_only_the_grouped_kernels_value_loop(tree_0102, build_cache):
    """Before (group-v-loads at-use): each V vector is loaded where the value loop uses it. After
    (ahead): the grouped kernels load a block's V vectors before the loop and the next block's
    inside it, so each holds one block's loads more; the same grouped kernels are built, and vLLM's
    own form is the same SASS."""
    before, after = _loads_ahead(tree_0102, build_cache, "v", "fp16/256/16", "fp16", 256)

    def loads(sass: list[str]) -> int:  # 128-bit global loads: the K and V vectors
        return sum(i.startswith("LDG.E.128") for i in sass)

    for symbol in before:
        # V: head 256 / 16 rows a pass = 16 vectors a block a thread
        assert loads(after[symbol]) >= loads(before[symbol]) + 16, (symbol, loads(before[symbol]), loads(after[symbol]))


def test_group_k_loads_ahead_changes_only_the_grouped_kernels_key_loop(tree_0102, build_cache):
    """Before (group-k-loads at-use): a warp loads a block's K vectors where the key loop scores the
    block. After (ahead): it loads the first block's before the loop and the next block's inside it,
    before the block in hand is scored, so its loads are issued further ahead of their use; the same
    grouped kernels are built, and vLLM's own form is the same SASS."""
    before, after = _loads_ahead(tree_0102, build_cache, "k", "bf16/64/16", "bf16", 64)

    def k_loads(sass: list[str]) -> int:  # 64-bit global loads: the K vectors of head 64 block 16
        return sum(i.startswith("LDG.E.64") for i in sass)

    for symbol in before:
        # K: head 64 / (2 threads x 4 scalars) = 8 vectors a block a thread, loaded once more: the first block's
        assert k_loads(after[symbol]) >= k_loads(before[symbol]) + 8, (symbol, k_loads(before[symbol]),
                                                                       k_loads(after[symbol]))  # fmt: skip


def test_group_k_loads_shared_stages_the_key_loops_loads_in_shared_memory_where_two_tiles_fit(tree_0102, build_cache):
    """group-k-loads = shared at head 128 block 16: every K vector is copied into shared memory by
    cp.async (LDGSTS), the first block's before the loop and the next block's inside it, with a wait
    on them (DEPBAR), and read back from there, without a spill. At head 256 two K tiles a warp take
    64 KB, more than a kernel may declare: its grouped kernels keep their loads at use (no LDGSTS)."""
    rule = "group=4,group-min-ctas=256,group-k-loads=shared"
    (shared,) = _build_ruled(tree_0102, build_cache, "bf16", {"shared": rule}, "bf16", [128, 256])
    assert {g.k_loads for g in shared.grouped} == {"shared"} and all(" k-shared " in g.label for g in shared.grouped)
    assert not any(g.spill_stores for g in shared.grouped)
    grouped = _stock_form_sass(shared, lambda symbol: "kvpatch_grouped" in symbol)
    heads = {symbol: re.search(r"Li(\d+)E", symbol.split("kernelI", 1)[1]).group(1) for symbol in grouped}  # HEAD_SIZE
    assert sorted(heads.values()) == ["128"] * 3 + ["256"] * 3  # v1 with 4 and 2 heads, v2

    def count(sass: list[str], op: str) -> int:
        return sum(i.startswith(op) for i in sass)

    for symbol, sass in grouped.items():
        if heads[symbol] == "128":  # 16 K vectors of 8 bytes a thread a block, copied at two places
            assert count(sass, "LDGSTS.E.64") == 32 and count(sass, "DEPBAR") >= 2, symbol
        else:
            assert count(sass, "LDGSTS") == 0 and count(sass, "LDG.E.64") > 0, symbol


def test_the_prefetch_and_the_split_are_hopper_only(tree_0102, build_cache):
    """On sm_90a the kernels with issue=split carry the prefetch and stock's key loop beside the
    prefetching one. On sm_100 and sm_120, which vLLM builds too, vLLM's form of every kernel is
    stock's SASS, instruction for instruction: the prefetch was never tuned there, and there nvcc
    does not unswitch stock's bf16 key loop on the ALiBi slope (29 FFMA at head 64 block 16, where
    sm_90a's unswitched loop has 58), so a split would round the ALiBi term otherwise."""
    stock = (tree_0102 / HEADER).read_text(encoding="utf-8")
    variants = patched_variants(
        stock, str(tree_0102 / HEADER), {"split": make_config(inherit_rules=False, issue="split")}
    )
    spec = make_spec(tree_0102, variants, "9.0a;10.0;12.0", dtypes=["bf16"], head_sizes=[64], block_sizes=[16])
    result = build(spec, cache=build_cache)
    split = result.variant("split")
    hopper = {("v1", "sm_90a"), ("v2", "sm_90a")}
    assert {(k.kernel, k.arch) for k in split.kernels if k.split} == hopper
    assert {(k.kernel, k.arch) for k in split.kernels if k.has_prefetch} == hopper
    assert {(k.kernel, k.arch) for k in split.kernels if k.expect_prefetch} == hopper

    def by_arch(variant) -> dict[tuple[str, str], list[str]]:
        ns = f"{len(variant.prefix)}{variant.prefix}"
        return {(arch, symbol.replace(ns, "")): [i for _, i in instrs]
                for arch, symbol, instrs, _ in sass_functions(variant.read_sass().splitlines()) if symbol}  # fmt: skip

    mine, theirs = by_arch(split), by_arch(result.variant("stock"))
    assert mine.keys() == theirs.keys()
    blackwell = [key for key in mine if key[0] in ("sm_100", "sm_120")]
    assert len(blackwell) == 6  # v1, v2 and v2's reduce kernel, per arch
    assert all(mine[key] == theirs[key] for key in blackwell)
    assert any(mine[key] != theirs[key] for key in mine if key[0] == "sm_90a")
    assert result.split_warnings() == []
