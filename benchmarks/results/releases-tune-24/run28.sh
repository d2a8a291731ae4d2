#!/usr/bin/env bash
# Run 28 (eighth session): tune-24's own libraries timed directly (until now its speed was read off
# tune-23's run with the one kernel that differs left out). Headline (with the A/A twin) and
# held-out on 0.10.2 (.gpu/t24/libs), then on 0.11.2 (.gpu/t24u/0.11.2/libs); stock vs tune-24 only
# (the libraries were built with --no-small: no paper's patch, no control).
#   OUT=$OUT bash benchmarks/results/releases-tune-24/run28.sh   (carry .gpu/t24, .gpu/t24u/0.11.2, .gpu/t23/vllm-0.10.2)
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTHONPATH=$PWD
T0=$SECONDS
OUT=$OUT/h0102 PACK=1 AA=1 TREE=.gpu/t23/vllm-0.10.2 \
  timeout 280 bash scripts/gpu_run.sh .gpu/t24/libs headline,heldout 2>&1 | tail -8
echo "0.10.2 done ($((SECONDS - T0)) s)"
OUT=$OUT/h0112 PACK=1 AA=1 TREE=.gpu/t24u/0.11.2/vllm-0.11.2 \
  timeout $((585 - (SECONDS - T0))) bash scripts/gpu_run.sh .gpu/t24u/0.11.2/libs headline,heldout 2>&1 | tail -8
echo "0.11.2 done ($((SECONDS - T0)) s)"
