"""The launcher's choice between the full and the half group (templates/build/group_rule.h.j2),
compiled for the host and asked about launches whose outcome the H200 measured
(benchmarks/evidence/half-group/, benchmarks/evidence/wave-rule/): half the group runs where an
SM holds more of its CTAs, at least two, and its twice as many CTAs take no more waves."""

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
        "#include <cstdio>\n"
        + render("build/group_rule.h.j2")
        + "\nint main() {\n  int full, half, sms; long long ctas;\n"
        '  while (std::scanf("%d %d %lld %d", &full, &half, &ctas, &sms) == 4)\n'
        '    std::printf("%d\\n", run_half_group(full, half, ctas, sms) ? 1 : 0);\n}\n'
    )
    exe = src.with_suffix("")
    subprocess.run([CXX, "-std=c++17", "-Wall", "-Werror", "-o", str(exe), str(src)], check=True)
    return exe


def test_half_the_group_runs_only_where_it_adds_no_wave(rule: Path) -> None:
    asked = "".join(" ".join(map(str, args)) + "\n" for args, _ in CASES.values())
    answers = subprocess.run([str(rule)], input=asked, capture_output=True, text=True, check=True).stdout.split()
    assert dict(zip(CASES, (a == "1" for a in answers), strict=True)) == {k: want for k, (_, want) in CASES.items()}
