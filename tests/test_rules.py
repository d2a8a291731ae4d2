"""Per-instantiation rules: selectors, which rule an instantiation gets, the TOML and
CLI forms, and (with nvcc) that an ``off`` instantiation compiles to stock's exact PTX."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from kvpatch.config import Selector, dump_config, load_config_file, make_config, parse_rules
from kvpatch.errors import UsageError
from kvpatch.patch.plan import branch_condition, patch
from kvpatch.source.releases import HEADER

# --------------------------------------------------------------------------- selectors


@pytest.mark.parametrize(
    "text, canonical, specificity",
    [
        ("bf16", "bf16", 1),
        ("bf16/80/32", "bf16/80/32", 3),
        ("*/*/32", "*/*/32", 1),
        ("fp16/64/*/*", "fp16/64", 2),
        ("*/128/16/fp8", "*/128/16/fp8", 3),
        (" fp32 / 256 ", "fp32/256", 2),
        ("fp16/256/16/auto/v2", "fp16/256/16/auto/v2", 5),
        ("*/*/*/*/v1", "*/*/*/*/v1", 1),
        ("bf16/64/*/*/*", "bf16/64", 2),
    ],
)
def test_selector_canonical_form(text: str, canonical: str, specificity: int) -> None:
    sel = Selector.parse(text)
    assert str(sel) == canonical
    assert sel.specificity == specificity
    assert Selector.parse(str(sel)) == sel


@pytest.mark.parametrize(
    "text, message",
    [
        ("fp8", "dtype 'fp8' is not one of"),
        ("bf16/eighty", "head size 'eighty' is not a number"),
        ("bf16/80/0", "block size '0' is not a number"),
        ("bf16/80/32/fp4", "kv-cache 'fp4' is not one of"),
        ("bf16/80/32/auto/x", "kernel 'x' is not one of"),
        ("bf16/80/32/auto/v1/x", "use dtype"),
        ("bf16//32", "use dtype"),
        ("*", "selects everything"),
    ],
)
def test_bad_selectors(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        Selector.parse(text)


def test_matches() -> None:
    sel = Selector.parse("bf16/*/32")
    assert sel.matches("bf16", 80, 32)
    assert not sel.matches("bf16", 80, 16)
    assert not sel.matches("fp16", 80, 32)
    assert Selector.parse("*/*/*/fp8").matches("fp16", 128, 16, "fp8_e5m2")
    assert not Selector.parse("*/*/*/fp8").matches("fp16", 128, 16, "auto")


def test_a_kernel_part_selects_one_of_the_two_kernels() -> None:
    sel = Selector.parse("fp16/256/16/auto/v2")
    assert sel.matches("fp16", 256, 16, "auto", "v2") and not sel.matches("fp16", 256, 16, "auto", "v1")
    assert not sel.matches("fp16", 256, 16, "auto")  # asked for both kernels: a v2-only rule does not answer
    cfg = make_config(inherit_rules=False, rules={"fp16/256/16/auto/v1": "off", "fp16/256/16": "issue=call,scope=cta"})
    assert cfg.resolve("fp16", 256, 16, "auto", "v1").off
    assert cfg.resolve("fp16", 256, 16, "auto", "v2").issue == "call"
    assert cfg.resolve("fp16", 256, 16).issue == "call"
    assert [sel for sel, _ in cfg.variants()][0] == "fp16/256/16/auto/v1"  # the most specific first


# --------------------------------------------------------------------------- resolution


def test_the_default_is_the_tuned_table_with_everything_else_off() -> None:
    cfg = make_config()
    # tuned kernels: what tune picked per kernel (benchmarks/evidence/default-table: tune-16's bf16
    # picks, then tune-22's rotate runs for fp16 block 16, fp16 block 32 and bf16 128/16)
    v1 = cfg.resolve("fp16", 64, 16, "auto", "v1")
    assert (v1.issue, v1.scope, v1.lookahead, v1.min_group, v1.read, v1.off) == ("call", "kv-head-rotate", 1, 2, "warp", False)
    assert cfg.resolve("fp16", 64, 16, "auto", "v2").off
    # fp16 head 128 block 16: v2 on with the rotating scope, v1 still slower at a tuning point;
    # head 256 block 16: v2 was picked by tune but vetoed by the held-out set (tune-24), v1 slower
    v2 = cfg.resolve("fp16", 128, 16, "auto", "v2")
    assert (v2.off, v2.issue, v2.scope, v2.min_group, v2.read) == (False, "call", "kv-head-rotate", 2, "lane")
    assert cfg.resolve("fp16", 128, 16, "auto", "v1").off
    assert all(cfg.resolve("fp16", 256, 16, "auto", k).off for k in ("v1", "v2"))
    # fp16 block 32: kv-head or kv-head-rotate behind min-group 2, no min-ctas gate any more
    scopes = {(h, k): cfg.resolve("fp16", h, 32, "auto", k) for h in (64, 128, 256) for k in ("v1", "v2")}
    assert all((s.off, s.min_group, s.min_ctas) == (False, 2, 1) for s in scopes.values())
    assert [scopes[h, k].scope for h, k in sorted(scopes)] == ["kv-head", "kv-head-rotate", "kv-head-rotate", "kv-head", "kv-head-rotate", "kv-head"]
    assert cfg.resolve("fp16", 128, 32, "auto", "v1").read == "lane" and cfg.resolve("fp16", 64, 32, "auto", "v2").issue == "inline"
    # bf16 block 16: the split form (inline asm, stock's loop for ALiBi heads) won on every head size
    assert all(cfg.resolve("bf16", h, 16, "auto", k).issue == "split" for h in (64, 128, 256) for k in ("v1", "v2"))
    assert not any(cfg.resolve("bf16", h, 16, "auto", k).off for h in (64, 128, 256) for k in ("v1", "v2"))
    assert [cfg.resolve("bf16", 128, 16, "auto", k).scope for k in ("v1", "v2")] == ["kv-head-rotate", "kv-head-rotate"]
    assert [cfg.resolve("bf16", 128, 16, "auto", k).read for k in ("v1", "v2")] == ["warp", "lane"]
    assert cfg.resolve("bf16", 64, 16, "auto", "v1").read == "lane"
    assert cfg.resolve("bf16", 128, 32, "auto", "v1").off and cfg.resolve("bf16", 128, 32, "auto", "v2").off
    # untuned: other head/block sizes (the bf16 32/80 block 32 ALiBi cases among them), fp32, fp8 caches
    assert cfg.resolve("bf16", 80, 32).off and cfg.resolve("bf16", 32, 32).off and cfg.resolve("bf16", 80, 16).off
    assert cfg.resolve("fp32", 128, 16, "auto", "v1").off and cfg.resolve("fp16", 128, 16, "fp8", "v2").off


def test_the_shipped_default_is_what_tune_wrote_on_the_h200() -> None:
    """DEFAULT_OVERRIDES and DEFAULT_TUNED_ON are the committed output of `kvpatch tune` (raw data beside it)."""
    from kvpatch.config import DEFAULT_TUNED_ON
    from kvpatch.config_io import read_config_file

    root = Path(__file__).resolve().parents[1]
    options, tuned = read_config_file(root / "benchmarks/evidence/default-table/kvpatch.toml")
    assert make_config(**options) == make_config()
    from kvpatch.machine import FIELDS

    assert [getattr(tuned, f) for f in FIELDS] == [getattr(DEFAULT_TUNED_ON, f) for f in FIELDS]


RUNS = ("tune-15-fp16-warp", "tune-16-bf16-warp", "tune-22-rotate/fp16-b16", "tune-22-rotate/bf16-128-16", "tune-22-rotate/fp16-b32")


def test_the_shipped_table_is_what_tune_chooses_from_the_fixed_timing_runs() -> None:
    """Chosen again from the raw data of the runs it was tuned from (tune-15: fp16, tune-16: bf16,
    then tune-22's three rotate runs, each kernel from the last run that measured it), the strict
    policy writes exactly the shipped rules."""
    import gzip
    import json

    from kvpatch.tune import merge_tune_data, rechoose

    root = Path(__file__).resolve().parents[1] / "benchmarks/evidence/default-table"
    runs = [json.loads(gzip.decompress((root / name / "tune.json.gz").read_bytes())) for name in RUNS]
    report = rechoose(merge_tune_data(runs), policy="strict", exclude=["*@fp16/256/16/auto/v2"])
    assert report.config == make_config()


def test_the_most_specific_rule_wins_whatever_the_order() -> None:
    cfg = make_config(rules={"fp16/64": "issue=call", "*/64/16": "off", "fp16/64/16": "lookahead=3"})
    assert cfg.resolve("fp16", 64, 16).lookahead == 3  # three parts beat two
    assert cfg.resolve("fp16", 64, 32).issue == "call"
    assert cfg.resolve("bf16", 64, 16).off
    selectors = [sel for sel, _ in cfg.variants()]
    assert selectors.index("fp16/64/16") < selectors.index("fp16/64") < selectors.index("fp16")
    assert selectors[-1] is None  # the base settings come last


def test_rules_none_drops_the_default_rules_but_not_the_dtype_tables() -> None:
    cfg = make_config(rules="none")
    assert [sel for sel, _ in cfg.overrides] == ["bf16", "fp16", "fp32"]
    assert cfg.resolve("bf16", 128, 16).off and cfg.resolve("fp16", 64, 16, "auto", "v1").off


def test_a_rule_set_to_none_removes_that_rule() -> None:
    cfg = make_config(rules={"bf16/128/32/auto": "none"})
    assert cfg.resolve("bf16", 128, 32).off  # the bf16 rule (off) takes over
    cfg = make_config(bf16="none", rules={"bf16/128/32/auto": "none"})
    assert not cfg.resolve("bf16", 128, 32).off and cfg.resolve("bf16", 64, 32).off


@pytest.mark.parametrize(
    "rules, message",
    [
        ({"bf16/80/32": "off,lookahead=2"}, "'off' takes no other settings"),
        ({"bf16/80/32": "placement=end"}, "cannot override placement"),
        ({"bf16/80/32": {"off": "yes"}}, "expected true"),
        ({"bf16/80/32": "lookahead=0"}, "invalid lookahead 0"),
        ({"bf16/80": "issue=call,align=64", "fp32/80": "issue=call"}, "share one helper"),
        ("everything", "invalid rules"),
    ],
)
def test_bad_rules(rules, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        make_config(rules=rules)


def test_cli_rule_form() -> None:
    assert parse_rules(["bf16/80/32=off", "fp16/64/*=issue=call,lookahead=2"]) == {
        "bf16/80/32": "off", "fp16/64": "issue=call,lookahead=2"}  # fmt: skip
    with pytest.raises(UsageError, match="use SELECTOR=SETTINGS"):
        parse_rules(["bf16/80/32"])
    with pytest.raises(UsageError, match="given twice"):
        parse_rules(["bf16/80/32=off", "bf16/80/32/*=off"])


def test_rules_round_trip_through_toml(tmp_path: Path) -> None:
    cfg = make_config(rules={"fp16/64": "issue=call,lookahead=2", "*/*/8": "off"}, bf16="lookahead=2")
    path = tmp_path / "kvpatch.toml"
    path.write_text(dump_config(cfg))
    assert '"fp16/64" = { lookahead = 2, issue = "call" }' in path.read_text()
    assert make_config(**load_config_file(path)) == cfg


def test_marker_names_every_rule() -> None:
    cfg = make_config(rules={"*/*/8": "off"}, inherit_rules=False, fp16="scope=kv-head", bf16="off")
    assert cfg.marker().endswith("quantized=skip */*/8:off bf16:off fp16:scope=kv-head")
    assert all(f" {sel}:" in make_config().marker() for sel, _ in make_config().overrides)


def test_branch_conditions_use_the_kernels_template_parameters(stock_sites) -> None:
    assert branch_condition("bf16/80/32", stock_sites) == (
        "kvpatch_is_same<scalar_t, __nv_bfloat16>::value && HEAD_SIZE == 80 && BLOCK_SIZE == 32")
    assert branch_condition("*/*/16/fp8", stock_sites) == "BLOCK_SIZE == 16 && !kvpatch_is_same<cache_t, scalar_t>::value"
    assert branch_condition("fp32/*/*/auto", stock_sites) == (
        "kvpatch_is_same<scalar_t, float>::value && kvpatch_is_same<cache_t, scalar_t>::value")
    assert branch_condition("*/*/*/*/v1", stock_sites) == "PARTITION_SIZE == 0"
    assert branch_condition("fp16/256/16/*/v2", stock_sites) == (
        "kvpatch_is_same<scalar_t, uint16_t>::value && HEAD_SIZE == 256 && BLOCK_SIZE == 16 && PARTITION_SIZE != 0")


@pytest.fixture(scope="module")
def stock_sites():
    from conftest import fixture_text
    from kvpatch.patch.sites import find_sites

    return find_sites(fixture_text(), "/tmp/vllm/" + HEADER)


# --------------------------------------------------------------------------- nvcc: off means stock


TU = """\
#include <cstdint>
#include "attention_kernels.cuh"
void* kvpatch_test_kernels[] = {
  (void*)&vllm::paged_attention_v1_kernel<__nv_bfloat16, __nv_bfloat16, HEAD, BLOCK, 128,
                                          vllm::Fp8KVCacheDataType::kAuto, false>,
  (void*)&vllm::paged_attention_v2_kernel<__nv_bfloat16, __nv_bfloat16, HEAD, BLOCK, 128,
                                          vllm::Fp8KVCacheDataType::kAuto, false, 512>,
};
"""


def _ptx(tmp: Path, csrc: Path, header: str, head: int, block: int) -> str:
    tmp.mkdir(parents=True)
    from kvpatch.jit import stub_headers, vllm_nvcc_flags

    for name, text in stub_headers().items():
        (tmp / "stubs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "stubs" / name).write_text(text)
    (tmp / "attention_kernels.cuh").write_text(header, encoding="utf-8")
    (tmp / "tu.cu").write_text(TU.replace("HEAD", str(head)).replace("BLOCK", str(block)))
    cmd = [shutil.which("nvcc"), *vllm_nvcc_flags(), "-ptx", "-gencode=arch=compute_90a,code=sm_90a",
           f"-I{tmp}", f"-I{csrc / 'attention'}", f"-I{csrc}", f"-I{tmp / 'stubs'}", str(tmp / "tu.cu"),
           "-o", str(tmp / "tu.ptx")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return (tmp / "tu.ptx").read_text()


@pytest.mark.nvcc
@pytest.mark.network
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_an_off_instantiation_compiles_to_stocks_exact_ptx(vllm_release: Callable[[str], Path], tmp_path: Path) -> None:
    tree = vllm_release("0.10.2")
    stock = (tree / HEADER).read_text(encoding="utf-8")
    patched = patch(stock, str(tree / HEADER), make_config(bf16="none", rules={"bf16/80/32": "off"})).patched
    csrc = tree / "csrc"
    off_stock = _ptx(tmp_path / "s80", csrc, stock, 80, 32)
    off_patched = _ptx(tmp_path / "p80", csrc, patched, 80, 32)
    assert "cp.async.bulk.prefetch" not in off_patched
    assert off_patched == off_stock  # bf16/80/32 is off: not one instruction differs
    on_patched = _ptx(tmp_path / "p16", csrc, patched, 80, 16)  # the same dtype and head, block 16: prefetches
    assert re.search(r"call\.uni[^;]*kvpatch_prefetch_l2", on_patched.replace("\n", " ")) or "cp.async.bulk.prefetch" in on_patched


def _entries(ptx: str) -> dict[str, str]:
    """PTX text per kernel entry: ``{'v1': ..., 'v2': ...}`` (the mangled names hold the kernel's name)."""
    out = {}
    for chunk in ptx.split(".entry ")[1:]:
        name = chunk.split("(", 1)[0]
        out["v1" if "paged_attention_v1_kernel" in name else "v2"] = chunk
    return out


@pytest.mark.nvcc
@pytest.mark.network
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_a_kernel_rule_prefetches_in_one_kernel_only(vllm_release: Callable[[str], Path], tmp_path: Path) -> None:
    """``bf16/128/16/auto/v1=off`` with bf16 on: v1 compiles as stock's v1, v2 prefetches (inline asm, so the
    instruction sits in the v2 entry itself)."""
    tree = vllm_release("0.10.2")
    stock = (tree / HEADER).read_text(encoding="utf-8")
    cfg = make_config(bf16="issue=inline", rules={"bf16/128/16/auto/v1": "off"})
    patched = patch(stock, str(tree / HEADER), cfg).patched
    csrc = tree / "csrc"
    got = _entries(_ptx(tmp_path / "p", csrc, patched, 128, 16))
    want = _entries(_ptx(tmp_path / "s", csrc, stock, 128, 16))
    assert "cp.async.bulk.prefetch" not in got["v1"] and got["v1"] == want["v1"]
    assert "cp.async.bulk.prefetch" in got["v2"]


def test_split_condition_follows_the_rules_first_match(stock_sites) -> None:
    from kvpatch.patch.plan import split_condition

    def cond(cfg):
        branches = [(None if sel is None else branch_condition(sel, stock_sites), c) for sel, c in cfg.variants()]
        return split_condition(branches, cfg, stock_sites)

    bf16_128 = "kvpatch_is_same<scalar_t, __nv_bfloat16>::value && HEAD_SIZE == 128 && BLOCK_SIZE == 16"
    assert cond(make_config(inherit_rules=False, issue="split", quantized="prefetch")) == "true"
    assert cond(make_config(inherit_rules=False, issue="split")) == "kvpatch_is_same<cache_t, scalar_t>::value && (true)"
    assert cond(make_config(inherit_rules=False, quantized="prefetch", rules={"bf16/128/16": "issue=split"})) == (
        f"({bf16_128}) ? true : false")
    # a more specific rule that turns it off wins over a less specific split
    assert cond(make_config(inherit_rules=False, quantized="prefetch", rules={"bf16": "issue=split", "bf16/128/16": "off"})) == (
        f"({bf16_128}) ? false : (kvpatch_is_same<scalar_t, __nv_bfloat16>::value) ? true : false")
    # the shipped table: bf16 block 16, every head size it tuned, v1 and v2, unquantized cache
    shipped = cond(make_config())
    assert shipped.startswith("kvpatch_is_same<cache_t, scalar_t>::value && (") and shipped.endswith("? true : false)")
    assert shipped.count("? true") == 6 and "fp16" not in shipped.replace("__nv_bfloat16", "")
    assert cond(make_config(bf16="off", rules="none")) == "kvpatch_is_same<cache_t, scalar_t>::value && (false)"


def test_split_needs_the_alibi_slope(stock_sites) -> None:
    """A kernel without ALiBi (the fixture with its slope taken out): issue=split, which the
    shipped table uses, refuses it in one line that says what to do; the other forms patch."""
    from conftest import fixture_text
    from kvpatch.errors import PatchError

    assert stock_sites.alibi_var == "alibi_slope"
    text = fixture_text()
    decl = "  const float alibi_slope =\n      alibi_slopes == nullptr ? 0.f : alibi_slopes[head_idx];\n"
    use = "      qk += (alibi_slope != 0)\n"
    assert text.count(decl) == 1 and text.count(use) == 1
    no_alibi = text.replace(decl, "").replace(use, "      qk += (head_idx != 0)\n").replace("alibi_slope *", "1.f *")
    assert "alibi_slope " not in no_alibi
    for cfg in (make_config(inherit_rules=False, issue="split"), make_config()):
        with pytest.raises(PatchError, match="issue=split: no variable initialised from the kernel's alibi_slopes") as e:
            patch(no_alibi, "/tmp/vllm/" + HEADER, cfg)
        assert "\n" not in str(e.value) and "--rule 'bf16/128/16/auto/v1=issue=call'" in str(e.value)
    patch(no_alibi, "/tmp/vllm/" + HEADER, make_config(inherit_rules=False, issue="inline"))


@pytest.mark.network
def test_a_split_copy_that_is_not_stocks_loop_is_refused(vllm_release: Callable[[str], Path]) -> None:
    from kvpatch.errors import PatchError
    from kvpatch.patch.parse import parse_header
    from kvpatch.patch.plan import validate

    tree = vllm_release("0.10.2")
    stock = (tree / HEADER).read_text(encoding="utf-8")
    cfg = make_config(inherit_rules=False, issue="split")
    good = patch(stock, str(tree / HEADER), cfg).patched
    parsed = parse_header(stock, str(tree / HEADER))
    validate(parsed, good, cfg)
    at = good.index("// ALiBi: stock's loop, no prefetch")
    at = good.index("static_cast<int64_t>(block_table[block_idx]);", at) + len("static_cast<int64_t>(block_table[block_idx]);")
    tampered = good[:at] + ' asm volatile("");' + good[at:]
    with pytest.raises(PatchError, match="copy of the key loop is not stock's loop"):
        validate(parsed, tampered, cfg)
    with pytest.raises(PatchError, match="split copy is missing"):
        validate(parsed, patch(stock, str(tree / HEADER), make_config(inherit_rules=False, issue="inline")).patched, cfg)


def _ffma(tmp: Path, csrc: Path, header: str, head: int = 128, block: int = 16) -> dict[str, int]:
    """FFMA instructions per kernel in the SASS (ptxas, not the PTX: they differ by one)."""
    from kvpatch.jit.toolchain import find_cuda_tool

    nvcc = Path(shutil.which("nvcc") or "nvcc")
    ptxas, cuobjdump = find_cuda_tool("ptxas", nvcc), find_cuda_tool("cuobjdump", nvcc)
    if ptxas is None or cuobjdump is None:
        pytest.skip("ptxas or cuobjdump not found beside nvcc")
    _ptx(tmp, csrc, header, head, block)
    cubin = tmp / "tu.cubin"
    subprocess.run([str(ptxas), "-arch=sm_90a", "-O3", str(tmp / "tu.ptx"), "-o", str(cubin)], check=True)
    sass = subprocess.run([str(cuobjdump), "--dump-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip
    out = {}
    for chunk in sass.split("Function : ")[1:]:
        name = chunk.split("\n", 1)[0]
        out["v1" if "paged_attention_v1_kernel" in name else "v2"] = len(re.findall(r"\bFFMA\b", chunk))
    assert set(out) == {"v1", "v2"}, sorted(out)
    return out


@pytest.mark.nvcc
@pytest.mark.network
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_split_keeps_stocks_unswitched_loop_and_folds_away_where_off(vllm_release: Callable[[str], Path],
                                                                       tmp_path: Path) -> None:  # fmt: skip
    """bf16 head 128 block 16: stock's key loop is unswitched on the ALiBi slope (two copies
    of its fma); inline asm in the loop stops that (and rounds the ALiBi term differently);
    issue=split compiles to stock's fma again with the prefetch in both kernels. Where no
    rule says split, the branch folds away: the PTX is exactly what it is without it."""
    tree = vllm_release("0.10.2")
    stock = (tree / HEADER).read_text(encoding="utf-8")
    csrc = tree / "csrc"

    def text(cfg) -> str:
        return patch(stock, str(tree / HEADER), cfg).patched if cfg else stock

    def ptx(name: str, cfg, head: int = 128, block: int = 16) -> str:
        return _ptx(tmp_path / name, csrc, text(cfg), head, block)

    split_cfg = make_config(inherit_rules=False, issue="split")
    want = _ffma(tmp_path / "s-stock", csrc, text(None))
    assert _ffma(tmp_path / "s-split", csrc, text(split_cfg)) == want
    assert _ffma(tmp_path / "s-inline", csrc, text(make_config(inherit_rules=False, issue="inline"))) != want
    assert all("cp.async.bulk.prefetch" in body for body in _entries(ptx("split", split_cfg)).values())
    base = make_config(bf16="none", inherit_rules=False)
    folded = ptx("folded", make_config(bf16="none", inherit_rules=False, rules={"bf16/80/32": "issue=split"}))
    def same(text: str) -> str:  # the TU-content hash in internal symbol names
        return re.sub(r"_INTERNAL_[0-9a-f]{8}_", "_INTERNAL_", text)

    assert same(folded) == same(ptx("base", base))


def test_the_readme_table_of_the_default_is_the_default() -> None:
    """README's per-kernel table is generated from nothing but must say what DEFAULT_OVERRIDES says."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    cfg = make_config()
    for dtype in ("fp16", "bf16"):
        for kernel in ("v1", "v2"):
            cells = []
            for head in (64, 128, 256):
                for block in (16, 32):
                    c = cfg.resolve(dtype, head, block, "auto", kernel)
                    gates = (f" mg{c.min_group}" if c.min_group != 1 else "") + (f" ctas{c.min_ctas}" if c.min_ctas != 1 else "")
                    gates += " warp" if c.read == "warp" else ""
                    cells.append("off" if c.off else f"{c.issue} {c.scope} la{c.lookahead}{gates}")
            assert f"| {dtype} {kernel} | " + " | ".join(cells) + " |" in readme, (dtype, kernel, cells)
