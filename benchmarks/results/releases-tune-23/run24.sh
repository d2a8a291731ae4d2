#!/usr/bin/env bash
# Run 24 (seventh session): the proof of tune-23 on vLLM 0.10.2. Libraries: scripts/gpu_prepare.py
# --vllm 0.10.2 --out .gpu/t23/libs (full kernel set for stock and the default = tune-23; headline
# shapes for the paper's patch and tune-23's control). Carry .gpu/t23.
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTHONPATH=$PWD
T0=$SECONDS
OUT=$OUT/fuh PACK=1 UPSTREAM_TIMEOUT=260 TREE=.gpu/t23/vllm-0.10.2 \
  timeout 470 bash scripts/gpu_run.sh .gpu/t23/libs full,upstream,heldout 2>&1 | tail -12
echo "full,upstream,heldout done ($((SECONDS - T0)) s)"
OUT=$OUT/headline-aa PACK=1 AA=1 TREE=.gpu/t23/vllm-0.10.2 \
  timeout $((585 - (SECONDS - T0))) bash scripts/gpu_run.sh .gpu/t23/libs headline 2>&1 | tail -6
echo "headline done ($((SECONDS - T0)) s)"
