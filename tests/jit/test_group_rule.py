"""The launcher's choices for a grouped v1 launch (templates/build/group_rule.h.j2), compiled for
the host and asked about launches whose outcome the H200 measured: half the group runs where an SM
holds more of its CTAs, at least two, and its twice as many CTAs take no more waves
(benchmarks/evidence/half-group/, benchmarks/evidence/wave-rule/); with group-logits auto the logits
go to global memory where shared memory holds fewer CTAs, of either group, than the global form, and
its waves times heads come to no more than the shared form's (benchmarks/evidence/global-logits/),
in a buffer that grows only outside stream capture and that a graph may read is never freed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kvpatch.templating import render

CXX = shutil.which("c++") or shutil.which("g++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no host C++ compiler")

H200_SMS = 132

# (full, half, full-group CTAs, SMs) -> half the group runs; full / half: the CTAs an SM holds.
CASES = {
    # GQA 32/8 (8 full-group CTAs a sequence), 4 heads' logits fit 3 an SM, 2 heads' 4 (launch bounds)
    "batch 32: 256 CTAs in one wave either way": ((3, 4, 256, H200_SMS), True),
    "batch 64: 512 CTAs, two waves either way": ((3, 4, 512, H200_SMS), True),
    "batch 48: 384 CTAs fill one wave, halved they need two": ((3, 4, 384, H200_SMS), False),
    "GQA 64/8 batch 48: 768 CTAs, two waves, halved three": ((3, 4, 768, H200_SMS), False),
    # bf16 head 128 (no launch bounds): 2 and 3 an SM at 5-6k tokens
    "2 -> 3 an SM, batch 32: one wave, halved two": ((2, 3, 256, H200_SMS), False),
    "2 -> 4 an SM, batch 40: two waves either way": ((2, 4, 320, H200_SMS), True),
    # launches sized for 8192 tokens: one CTA of the full group an SM
    "1 -> 3 an SM, batch 32": ((1, 3, 256, H200_SMS), True),
    "1 -> 2 an SM: the same waves": ((1, 2, 264, H200_SMS), True),
    "the full group fits nowhere": ((0, 2, 10_000, H200_SMS), True),
    "half the group fits only one an SM": ((0, 1, 8, H200_SMS), False),
    "half the group fits no more than the full": ((3, 3, 8, H200_SMS), False),
    "the SM count unknown: only the fit counts": ((3, 4, 384, 0), True),
}


@pytest.fixture(scope="module")
def rule(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("rule") / "rule.cc"
    src.write_text(
        "#include <cstdio>\n#include <cstring>\n"
        + render("build/group_rule.h.j2")
        + '\nint main() {\n  char fn[16];\n  while (std::scanf("%15s", fn) == 1) {\n'
        "    long long a[7] = {0};\n"
        '    for (long long& x : a) std::scanf("%lld", &x);\n'
        '    if (!std::strcmp(fn, "half")) std::printf("%d\\n", run_half_group(a[0], a[1], a[2], a[3]));\n'
        '    else if (!std::strcmp(fn, "global"))\n'
        '      std::printf("%d\\n", run_global_logits(a[0], a[1], a[2], a[3], a[4], a[5], a[6]));\n'
        '    else std::printf("%d\\n", static_cast<int>(logits_buffer_step(a[0], a[1], a[2], a[3], a[4])));\n'
        "  }\n}\n"
    )
    exe = src.with_suffix("")
    subprocess.run([CXX, "-std=c++17", "-Wall", "-Werror", "-o", str(exe), str(src)], check=True)
    return exe


def _ask(rule: Path, fn: str, cases: dict) -> dict:
    """Each case's answer from the compiled rule ``fn``: its args padded to 7 numbers, the answer an int."""
    asked = "".join(f"{fn} " + " ".join(map(str, [*args, *[0] * (7 - len(args))])) + "\n" for args, _ in cases.values())
    answers = subprocess.run([str(rule)], input=asked, capture_output=True, text=True, check=True).stdout.split()
    return dict(zip(cases, (int(a) for a in answers), strict=True))


def test_half_the_group_runs_only_where_it_adds_no_wave(rule: Path) -> None:
    assert _ask(rule, "half", CASES) == {k: int(want) for k, (_, want) in CASES.items()}


# (shared full, shared half, global full, full-group CTAs, SMs, heads, group-half-below) -> the logits
# go to global memory (group-logits auto); the CTAs an SM holds as the CUDA runtime answered for the
# kernels (4 heads, launch bounds of 4 an SM) at each length a launch was sized for
GLOBAL = {
    # sized for 8192 tokens: 4 heads' logits fit 1 an SM, 2 heads' 3; with them in global memory 4
    "8192: batch 64, 512 CTAs: one wave against three of half the group": ((1, 3, 4, 512, H200_SMS, 4, 4), True),
    "8192: batch 32, 256 CTAs: one wave of 4 heads against two of 2": ((1, 3, 4, 256, H200_SMS, 4, 4), True),
    "8192: GQA 64/8 batch 48, 768 CTAs: two waves against four of half": ((1, 3, 4, 768, H200_SMS, 4, 4), True),
    # sized for 7424 tokens (its own): the same fits
    "7424: GQA 32/8 batch 52, 416 CTAs": ((1, 3, 4, 416, H200_SMS, 4, 4), True),
    "7424: GQA 64/8 batch 36, 576 CTAs: two waves, the second nearly empty": ((1, 3, 4, 576, H200_SMS, 4, 4), False),
    # sized for 4864 tokens: half the group fits as many as the global form: shared memory does not limit
    "4864: half the group fits 4 an SM, as many as the global form": ((2, 4, 4, 640, H200_SMS, 4, 4), False),
    "4864, bf16 head 128 (3 an SM by registers): as many": ((2, 3, 3, 448, H200_SMS, 4, 4), False),
    # where the global form fits nowhere, or the shared form nowhere
    "the global form fits nowhere": ((1, 3, 0, 512, H200_SMS, 4, 4), False),
    "the shared form fits nowhere, half never run": ((0, 0, 4, 512, H200_SMS, 4, 0), True),
    "the SM count unknown: only the fit counts": ((1, 3, 4, 576, 0, 4, 4), True),
}


def test_the_logits_go_to_global_memory_where_shared_memory_limits_and_no_wave_of_work_is_added(rule: Path) -> None:
    assert _ask(rule, "global", GLOBAL) == {k: int(want) for k, (_, want) in GLOBAL.items()}


REFUSE, USE, REPLACE, ADD_BESIDE = range(4)  # logits_buffer_step's answers, in the enum's order
GIB = 1 << 30
# (bytes there, bytes needed, a captured launch used it, the stream capturing, the most) -> the step
BUFFER = {
    "none yet, eager: allocate": ((0, 64 << 20, 0, 0, GIB), REPLACE),
    "none yet, capturing: shared memory, no allocation in a capture": ((0, 64 << 20, 0, 1, GIB), REFUSE),
    "large enough, eager": ((64 << 20, 32 << 20, 0, 0, GIB), USE),
    "large enough, capturing": ((64 << 20, 64 << 20, 1, 1, GIB), USE),
    "too small, capturing": ((32 << 20, 64 << 20, 1, 1, GIB), REFUSE),
    "too small, eager, no graph read it: replace it": ((32 << 20, 64 << 20, 0, 0, GIB), REPLACE),
    "too small, eager, a graph read it: keep it, allocate beside": ((32 << 20, 64 << 20, 1, 0, GIB), ADD_BESIDE),
    "more than the most: shared memory": ((0, GIB + 16, 0, 0, GIB), REFUSE),
    "nothing needed": ((0, 0, 0, 0, GIB), REFUSE),
}


def test_the_logits_buffer_grows_outside_capture_and_is_never_freed_under_a_graph(rule: Path) -> None:
    assert _ask(rule, "buffer", BUFFER) == {k: want for k, (_, want) in BUFFER.items()}
