#!/usr/bin/env bash
# Run 15 (issue 8 with tune-8, benchmarks/results/tune-8): vLLM 0.10.2's full kernel set, stock vs tune-8
# (patched), plus the paper preset and the control on the headline shapes: validate --full, validate --upstream
# (vLLM's test_paged_attention, unchanged), the headline bench (v1 and v2) and the held-out bench (dispatched),
# both with the A/A control. Libraries built here: scripts/gpu_prepare.py --vllm 0.10.2
# --config benchmarks/results/tune-8/kvpatch.toml --out .gpu/t8/0.10.2/libs
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTHONPATH=$PWD
mkdir -p $OUT/r15
OUT=$OUT/r15 AA=1 HELDOUT_REPS=${HELDOUT_REPS:-20} HEADLINE_REPS=${HEADLINE_REPS:-40} timeout ${LIMIT:-560} \
   bash scripts/gpu_run.sh .gpu/t8/0.10.2/libs full,upstream,headline,heldout 2>&1 | tail -60
cd $OUT && find r15 -name '*.json' -size +200k -exec gzip -f {} \; ; rm -rf r15/upstream/*/.pytest_cache 2>/dev/null; ls -la r15
