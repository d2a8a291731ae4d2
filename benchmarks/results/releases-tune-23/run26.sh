#!/usr/bin/env bash
# Run 26 (seventh session): tune-23 on the five other header revisions, the decode step, and
# vLLM 0.10.2's own test again (run 24 cut it at 260 s after 115 of 128). Carry .gpu/t23,
# .gpu/t23r, .gpu/t12/libs, .gpu/site. Libraries: .gpu/t23r/V/libs = scripts/gpu_prepare.py --vllm V
# --kernels tuned --no-small --no-tree --out .gpu/t23r/V/libs (V = 0.6.4 0.8.5 0.9.2 0.10.0 0.11.2).
set -uo pipefail
T0=$SECONDS; BASE=$OUT
OUT=$BASE/releases BUDGET=290 NEED=50 bash scripts/gpu_releases.sh .gpu/t23r 2>&1 | tail -8
echo "releases done ($((SECONDS - T0)) s)"
OUT=$BASE bash benchmarks/results/decode-5/run25.sh 2>&1 | tail -16
echo "decode done ($((SECONDS - T0)) s)"
left=$(( 585 - (SECONDS - T0) - 25 ))
OUT=$BASE/upstream2 PACK=1 WORKERS=12 UPSTREAM_TIMEOUT=$left TREE=.gpu/t23/vllm-0.10.2 PYTHONPATH=$PWD \
  timeout $((left + 20)) bash scripts/gpu_run.sh .gpu/t23/libs upstream 2>&1 | tail -14
echo "upstream done ($((SECONDS - T0)) s)"
