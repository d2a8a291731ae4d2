#!/usr/bin/env bash
# Run 30 (prepared in the eighth session, not yet run): what tune-26 lacks before it may ship, in
# two device calls (each under the 600 s limit):
#   STEP=1: the five other header revisions, validate (tuned instantiations) + held-out with the
#           A/A twin, ~85 s each. .gpu/t26r/V/libs = scripts/gpu_prepare.py --vllm V --config
#           benchmarks/results/tune-26/kvpatch.toml --kernels tuned --no-small --no-tree
#           --out .gpu/t26r/V/libs (V = 0.6.4 0.8.5 0.9.2 0.10.0 0.11.2). Carry .gpu/t26r.
#           Five releases need ~430 s: the budget below runs as many as fit; rerun with
#           RELEASES="..." for the rest.
#   STEP=2: vLLM 0.10.2's own test against tune-26's full kernel set (.gpu/t26/libs, see
#           README), ~330 s. Carry .gpu/t26, .gpu/t23/vllm-0.10.2.
#   OUT=$OUT STEP=1 bash benchmarks/results/tune-26/run30.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTHONPATH=$PWD
case "${STEP:?STEP=1 or 2}" in
  1) OUT=$OUT/releases PACK=1 AA=1 BUDGET=${BUDGET:-540} NEED=90 bash scripts/gpu_releases.sh .gpu/t26r 2>&1 | tail -20 ;;
  2) OUT=$OUT/u0102 PACK=1 UPSTREAM_TIMEOUT=480 TREE=.gpu/t23/vllm-0.10.2 \
       timeout 570 bash scripts/gpu_run.sh .gpu/t26/libs upstream 2>&1 | tail -16 ;;
  *) echo "error: STEP=1 or 2" >&2; exit 2 ;;
esac
