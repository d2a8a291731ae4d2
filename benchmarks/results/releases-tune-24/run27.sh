#!/usr/bin/env bash
# Run 27 (prepared in the seventh session, not yet run): what tune-24 still lacks.
#  1. vLLM 0.10.2's own test, to the end, against tune-24's full kernel set (.gpu/t24/libs =
#     scripts/gpu_prepare.py --vllm 0.10.2 --no-small --no-tree --out .gpu/t24/libs; the tree
#     files from .gpu/t23/vllm-0.10.2), ~300 s;
#  2. on 0.11.2 (the header of 0.11.2 through 0.22.1): validate --full and vLLM 0.11.2's test
#     (.gpu/t24u/0.11.2 = scripts/gpu_prepare.py --vllm 0.11.2 --no-small --out .gpu/t24u/0.11.2/libs),
#     ~330 s.
# Two device calls (each under the 600 s limit):
#   STEP=1 OUT=$OUT bash benchmarks/results/releases-tune-24/run27.sh   (carry .gpu/t24, .gpu/t23/vllm-0.10.2)
#   STEP=2 OUT=$OUT bash benchmarks/results/releases-tune-24/run27.sh   (carry .gpu/t24u/0.11.2)
# Each ends with one packed file (PACK=1) so nothing is left out by the device tool's file count.
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTHONPATH=$PWD
case "${STEP:?STEP=1 or 2}" in
  1) OUT=$OUT/u0102 PACK=1 UPSTREAM_TIMEOUT=480 TREE=.gpu/t23/vllm-0.10.2 \
       bash scripts/gpu_run.sh .gpu/t24/libs upstream 2>&1 | tail -16 ;;
  2) OUT=$OUT/f0112 PACK=1 UPSTREAM_TIMEOUT=420 TREE=.gpu/t24u/0.11.2/vllm-0.11.2 \
       bash scripts/gpu_run.sh .gpu/t24u/0.11.2/libs full,upstream 2>&1 | tail -16 ;;
  *) echo "error: STEP=1 or 2" >&2; exit 2 ;;
esac
