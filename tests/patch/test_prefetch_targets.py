"""Which blocks the generated prefetch targets, checked by running the generated code.

The golden files pin the text; this pins the behaviour. The fixture header is patched
through the real pipeline (:func:`kvpatch.patch.patch`), and its injected regions
(the helper, and the key or the value loop's block) are compiled verbatim into a
host C++ harness: ``__CUDA_ARCH__`` is 900, ``__device__``/``__noinline__`` are empty,
and ``asm`` is defined away while ``volatile(...)`` becomes a call that records the
``kvpatch_tile`` pointer in scope, in the inline asm and in the ``kvpatch_prefetch_l2``
helper alike. The harness runs the loop as vLLM's kernel does
(``block_idx = start + warp; block_idx < end; block_idx += NUM_WARPS``) over a scattered
block table that holds physical block 0, maps every recorded address back to the
logical block it belongs to, and prints what each warp read and prefetched.

Asserted: lane 0 of each warp prefetches exactly the block it reads ``lookahead``
iterations later, once per iteration, never one past the end; other lanes, the
control variant, quantized caches under ``quantized=skip`` and (``scope=kv-head``)
non-leading query heads prefetch nothing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import fixture_text, make_tree

from kvpatch.config import make_config
from kvpatch.patch import patch
from kvpatch.source.releases import HEADER

CXX = shutil.which("g++") or shutil.which("c++")
#: every case compiles a harness with g++ and runs it
pytestmark = [pytest.mark.slow, pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++) on PATH")]

HARNESS = r"""
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

struct __nv_bfloat16 { uint16_t bits; };
struct Dim3 { unsigned x, y, z; };
static Dim3 gridDim{1, 1, 1};  // set per case: a launch of `ctas` CTAs (heads x seqs x partitions)

static std::vector<const void*> kvpatch_recorded;
static void kvpatch_record(const void* tile) { kvpatch_recorded.push_back(tile); }
// The block table, recording every index the loop reads (stock's read and kvpatch's).
struct Table {
  const int* data;
  std::vector<int>* seen;
  int operator[](int i) const { seen->push_back(i); return data[i]; }
};

// The CUDA bits of the generated code, on the host.
#define __device__
#define __noinline__
#define asm
#define volatile(...) (kvpatch_record(kvpatch_tile))

// ---- generated: helper region
@HELPER@
// ---- end of generated code

#undef volatile
#undef asm

constexpr int HEAD = 8, BLOCK = 2, KV_HEADS = 2;
constexpr int64_t KV_HEAD_STRIDE = HEAD * BLOCK, KV_BLOCK_STRIDE = KV_HEADS * KV_HEAD_STRIDE;
constexpr int PHYSICAL = 211;  // a prime: block_table[i] = (7 i + 3) % 211 is a permutation
constexpr int TABLE = 400;     // entries past every end_block_idx used: an overrun still maps

#define volatile(...) (kvpatch_record(kvpatch_tile))
#define asm
template <typename scalar_t, typename cache_t, int HEAD_SIZE, int BLOCK_SIZE, int PARTITION_SIZE = 0>
static void key_loop(int NUM_WARPS, int warp_idx, int lane, int start_block_idx, int end_block_idx,
                     int head_idx, int num_queries_per_kv, int kv_head_idx, int64_t kv_block_stride,
                     int64_t kv_head_stride, Table block_table, const cache_t* k_cache,
                     std::vector<int>& reads) {
  for (int block_idx = start_block_idx + warp_idx; block_idx < end_block_idx; block_idx += NUM_WARPS) {
    const int64_t physical_block_number = static_cast<int64_t>(block_table[block_idx]);
    (void)physical_block_number;
    reads.push_back(block_idx);
// ---- generated: the loop's region
@REGION@
// ---- end of generated code
  }
}
#undef volatile
#undef asm

template <typename scalar_t, typename cache_t>
static void run(int num_warps, int warp, int lane, int start, int end, int head, int qpk) {
  std::vector<int> table(TABLE), logical_of(PHYSICAL, -1);
  for (int i = 0; i < TABLE; ++i) table[i] = (7 * i + 3) % PHYSICAL;
  for (int i = 0; i < PHYSICAL; ++i) logical_of[table[i]] = i;
  std::vector<cache_t> cache(static_cast<size_t>(PHYSICAL * KV_BLOCK_STRIDE));
  const int kv_head_idx = 1;
  std::vector<int> reads, table_reads;
  kvpatch_recorded.clear();
  key_loop<scalar_t, cache_t, HEAD, BLOCK>(num_warps, warp, lane, start, end, head, qpk, kv_head_idx,
                                           KV_BLOCK_STRIDE, KV_HEAD_STRIDE, Table{table.data(), &table_reads},
                                           cache.data(), reads);
  std::cout << "reads";
  for (int b : reads) std::cout << ' ' << b;
  std::cout << "\ntargets";
  for (const void* p : kvpatch_recorded) {
    const int64_t off = static_cast<const cache_t*>(p) - cache.data() - kv_head_idx * KV_HEAD_STRIDE;
    const bool whole = off >= 0 && off % KV_BLOCK_STRIDE == 0 && off / KV_BLOCK_STRIDE < PHYSICAL;
    // a tile that is not the start of this head's slice of a block: report it as "bad"
    if (whole) std::cout << ' ' << logical_of[off / KV_BLOCK_STRIDE]; else std::cout << " bad";
  }
  std::cout << "\ntable";
  for (int i : table_reads) std::cout << ' ' << i;
  std::cout << "\n";
}

int main() {
  std::string dtype;
  int num_warps, warp, lane, start, end, head, qpk;
  unsigned ctas;
  while (std::cin >> dtype >> num_warps >> warp >> lane >> start >> end >> head >> qpk >> ctas) {
    gridDim = Dim3{ctas / 4, 2, 2};  // a v2-shaped grid: the test multiplies all three
    if (dtype == "fp16") run<uint16_t, uint16_t>(num_warps, warp, lane, start, end, head, qpk);
    else if (dtype == "bf16") run<__nv_bfloat16, __nv_bfloat16>(num_warps, warp, lane, start, end, head, qpk);
    else if (dtype == "fp32") run<float, float>(num_warps, warp, lane, start, end, head, qpk);
    else if (dtype == "fp8") run<uint16_t, uint8_t>(num_warps, warp, lane, start, end, head, qpk);
    else return 2;
  }
  return 0;
}
"""

#: (NUM_WARPS, warp, start_block_idx, end_block_idx): single block, fewer blocks than
#: warps, ends that do and do not divide, a partition that starts at 32 (v2), one warp.
LOOPS = [
    (4, 0, 0, 1), (4, 0, 0, 5), (4, 3, 0, 5), (4, 1, 0, 17), (4, 3, 0, 33),
    (2, 1, 0, 16), (4, 2, 32, 100), (1, 0, 0, 9), (8, 7, 0, 64), (4, 0, 0, 3),
]  # fmt: skip


def _region(text: str, name: str) -> str:
    m = re.search(rf"^[ \t]*// kvpatch:begin {name} .*?^[ \t]*// kvpatch:end {name}$", text, re.M | re.S)
    assert m is not None, f"no {name} region in the patched fixture"
    return m.group(0)


def _harness(tmp_path: Path, kind: str, **options) -> Path:
    """Patch the fixture with ``options``, compile its ``kind`` ('key' | 'value') region."""
    tree = make_tree(tmp_path / "tree", fixture_text(), commit=False)
    patched = patch(fixture_text(), str(tree / HEADER), make_config(**options)).patched
    region = _region(patched, kind).replace("v_cache", "k_cache")  # one cache parameter for both loops
    source = HARNESS.replace("@HELPER@", _region(patched, "helper")).replace("@REGION@", region)
    (tmp_path / "harness.cpp").write_text(source)
    exe = tmp_path / "harness"
    proc = subprocess.run(
        [CXX, "-std=c++17", "-O0", "-D__CUDA_ARCH__=900", "-Wall", "-Wno-unused-variable",
         "-o", str(exe), str(tmp_path / "harness.cpp")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return exe


def _run(exe: Path, cases: list[tuple]) -> list[tuple[list[int], list, list[int]]]:
    """Per case: the blocks the warp read, the logical blocks of the tiles it prefetched, and
    every block-table index the loop read (stock's reads and kvpatch's)."""
    stdin = "".join(" ".join(str(x) for x in c) + "\n" for c in cases)
    out = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(out) == 3 * len(cases)
    parse = lambda line: [x if x == "bad" else int(x) for x in line.split()[1:]]  # noqa: E731
    return [(parse(out[3 * i]), parse(out[3 * i + 1]), parse(out[3 * i + 2])) for i in range(len(cases))]


def _expected(lookahead: int, nw: int, warp: int, start: int, end: int, prefetches: bool,
              takes=lambda target: True) -> tuple[list, list]:  # fmt: skip
    reads = list(range(start + warp, end, nw))
    targets = (
        [b + lookahead * nw for b in reads if b + lookahead * nw < end and takes(b + lookahead * nw)]
        if prefetches
        else []
    )
    return reads, targets


def _takes(settings, nw: int, head: int, qpk: int):
    """Which target blocks this CTA prefetches by its scope: kv-head-rotate's turn, else all."""
    if settings.scope != "kv-head-rotate":
        return lambda target: True
    return lambda target: ((target // nw + head) & (qpk - 1)) == 0


def _cases(dtypes: list[str], lanes=(0, 1), heads=((0, 4), (1, 4), (0, 1)), ctas=(64, 4096)) -> list[tuple]:
    """(dtype, NUM_WARPS, warp, lane, start, end, head, queries per KV head, CTAs in the launch)"""
    return [(d, nw, w, lane, s, e, h, q, n) for d in dtypes for nw, w, s, e in LOOPS for lane in lanes
            for h, q in heads for n in ctas]  # fmt: skip


_U = {"inherit_rules": False}  # uniform settings: no shipped rule table
#: Rules for the v2 kernels of bf16, the v1 kernels of fp16 and fp32's v1 kernel of head 32
#: block 8 (the harness's sizes, head 8 block 2, are none that vLLM builds, so no selector names them).
KERNEL_RULES = {"bf16/*/*/auto/v2": "off", "fp16/*/*/auto/v1": "off", "fp32/32/8/auto/v1": "off"}


@pytest.mark.parametrize("kind", ["key", "value"])
@pytest.mark.parametrize(
    "options",
    [{**_U, "fp16": "scope=kv-head,issue=inline"}, {**_U, "lookahead": 2}, {**_U, "lookahead": 3},
     {**_U, "placement": "end"}, {**_U, "issue": "inline"}, {**_U, "quantized": "prefetch"},
     {**_U, "scope": "kv-head"}, {**_U, "rules": KERNEL_RULES}, {},
     {**_U, "min_group": 2}, {**_U, "scope": "kv-head", "bf16": "min-group=4,issue=inline"},
     {**_U, "min_ctas": 1024}, {**_U, "fp16": "min-ctas=4096,issue=inline,scope=kv-head", "bf16": "min-ctas=4097"},
     {**_U, "read": "warp"}, {**_U, "read": "warp", "lookahead": 3, "placement": "end"},
     {**_U, "read": "warp", "scope": "kv-head", "min_group": 2, "min_ctas": 1024, "issue": "inline"},
     {**_U, "fp16": "read=warp,scope=kv-head,issue=inline", "bf16": "read=warp,min-group=4", "quantized": "prefetch"},
     {**_U, "min_kv_mib": 1, "quantized": "prefetch"},
     {**_U, "scope": "kv-head", "read": "warp", "min_group": 2, "fp16": "min-kv-mib=16", "bf16": "min-kv-mib=1"},
     {**_U, "scope": "kv-head-rotate"}, {**_U, "scope": "kv-head-rotate", "lookahead": 3, "placement": "end"},
     {**_U, "scope": "kv-head-rotate", "read": "warp", "min_group": 2, "issue": "inline"}],
    ids=["per-dtype", "lookahead2", "lookahead3", "placement-end", "inline", "quantized-prefetch", "kv-head-all",
         "kernel-rules", "shipped-default", "min-group-2", "bf16-min-group-4", "min-ctas-1024", "min-ctas-per-dtype",
         "read-warp", "read-warp-lookahead3-end", "read-warp-gates", "read-warp-per-dtype", "min-kv-mib-1",
         "min-kv-mib-per-dtype", "rotate", "rotate-lookahead3-end", "rotate-read-warp-inline"],
)  # fmt: skip
def test_prefetch_targets_the_block_read_lookahead_iterations_later(tmp_path, kind, options):
    """The harness is the v1 kernel (PARTITION_SIZE 0) of head 8 / block 2: a rule for v2 or
    another size must not reach it, one for v1 must; the shipped default (untuned sizes) is off.
    Every block-table entry the loop reads, stock's or kvpatch's, lies in the loop's range
    [start, end) (read=warp reads on every lane, so its index must be clamped), and read=lane
    reads one for lane 0 only, read=warp one for every lane, per iteration that passes the loop's
    guard (with min-kv-mib the call helper may then still skip the prefetch)."""
    cfg = make_config(**options)
    exe = _harness(tmp_path, kind, **options)
    cases = _cases(["fp16", "bf16", "fp32", "fp8"])
    for case, (reads, targets, table) in zip(cases, _run(exe, cases)):
        dtype, nw, warp, lane, start, end, head, qpk, ctas = case
        q, kv = ("fp16", "fp8") if dtype == "fp8" else (dtype, "auto")  # fp8: an fp16 kernel, uint8_t cache
        settings = cfg.resolve(q, 8, 2, kv, "v1")
        scope_ok = settings.scope != "kv-head" or head % qpk == 0
        takes = _takes(settings, nw, head, qpk)
        quantized_ok = dtype != "fp8" or cfg.quantized == "prefetch"
        # min-kv-mib (in the call helper): the grid's KV estimate, KV heads x sequences x partitions x
        # one partition of 512 tokens in tiles of BLOCK (2) tokens x HEAD (8) x the cache's element, K and V
        kv_bytes = (ctas // 4 // qpk) * 2 * 2 * (512 // 2) * 2 * (2 * 8 * {"fp32": 4, "fp8": 1}.get(dtype, 2))
        guarded = (
            lane == 0
            and scope_ok
            and quantized_ok
            and not settings.off
            and qpk >= settings.min_group
            and ctas >= settings.min_ctas
        )  # fmt: skip (the loop's guard; the helper tests min-kv-mib)
        on = guarded and kv_bytes >= settings.min_kv_mib << 20
        want = _expected(settings.lookahead, nw, warp, start, end, on, takes)
        assert (reads, targets) == want, f"{kind} loop, {case}"
        assert all(start <= i < end for i in table), f"{kind} loop, {case}: block table read at {table}"
        compiled = quantized_ok and not settings.off  # the kernel holds the prefetch code at all
        extra = len(table) - len(reads)  # kvpatch's reads (stock reads once per iteration)
        if compiled and settings.read == "warp":
            assert extra == len(reads), f"{kind} loop, {case}: read=warp reads once per iteration on every lane"
        else:
            called = _expected(settings.lookahead, nw, warp, start, end, guarded, takes)[1]
            assert extra == len(called), f"{kind} loop, {case}: read=lane reads only where lane 0 passes the guard"
    # the harness saw prefetches exactly when a bf16 v1 kernel of this size is on
    seen = any(t for _, t, _ in _run(exe, [("bf16", 4, 0, 0, 0, 17, 0, 4, 1 << 20)]))
    assert seen == (not cfg.resolve("bf16", 8, 2, "auto", "v1").off)


@pytest.mark.parametrize("kind", ["key", "value"])
def test_a_rule_reaches_only_the_kernels_it_selects(tmp_path, kind):
    """The harness is the v1 kernel of head 8 / block 2: fp16's rule for v1 turns it off;
    bf16's rule for v2 and fp32's for another size leave it prefetching."""
    exe = _harness(tmp_path, kind, **_U, rules=KERNEL_RULES)
    on = {d: any(t for _, t, _ in _run(exe, [(d, 4, 0, 0, 0, 17, 0, 4, 1 << 20)])) for d in ("fp16", "bf16", "fp32")}
    assert on == {"fp16": False, "bf16": True, "fp32": True}


@pytest.mark.parametrize("kind", ["key", "value"])
def test_kv_head_rotate_shares_every_tile_among_the_group(tmp_path, kind):
    """Over the CTAs of one KV head (query heads g*k .. g*k+g-1), kv-head-rotate prefetches every
    tile the loop would (cta scope) at least once, exactly once when g is a power of two, and
    no CTA takes more than its share plus one."""
    exe = _harness(tmp_path, kind, **_U, scope="kv-head-rotate", read="warp")
    for nw, warp, start, end in LOOPS:
        for g in (2, 3, 4, 6, 7, 8, 12):
            heads = [g * 3 + j for j in range(g)]  # the group of KV head 3
            cases = [("fp16", nw, warp, 0, start, end, h, g, 4096) for h in heads]
            got = [targets for _, targets, _ in _run(exe, cases)]
            every = _expected(1, nw, warp, start, end, True)[1]
            seen = [t for ts in got for t in ts]
            assert sorted(set(seen)) == every, (nw, warp, start, end, g)
            if g & (g - 1) == 0:
                assert sorted(seen) == every, (nw, warp, start, end, g)  # once each
                assert max(map(len, got)) <= -(-len(every) // g), (nw, warp, start, end, g)


@pytest.mark.parametrize("kind", ["key", "value"])
@pytest.mark.parametrize("options", [{"control": True, **_U}, {"control": True, "issue": "inline", **_U}],
                         ids=["control", "control-inline"])  # fmt: skip
def test_control_prefetches_nothing(tmp_path, kind, options):
    exe = _harness(tmp_path, kind, **options)
    cases = _cases(["fp16", "bf16", "fp32", "fp8"], lanes=(0,), heads=((0, 4), (0, 1)))
    for case, (reads, targets, _) in zip(cases, _run(exe, cases)):
        _, nw, warp, _, start, end, _, _, _ = case
        assert reads == list(range(start + warp, end, nw)) and targets == [], case
