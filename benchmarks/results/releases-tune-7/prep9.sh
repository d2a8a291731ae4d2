#!/usr/bin/env bash
# Build (here) run 9: tune-7 (the shipped default) tuned instantiations for the five other header revisions.
set -uo pipefail
. .venv/bin/activate
export KVPATCH_CACHE=$PWD/.pytest_cache/d/kvpatch-cache
T0=$SECONDS
for v in 0.6.4 0.8.5 0.9.2 0.10.0 0.11.2; do
  rm -rf .gpu/r9/$v && python scripts/gpu_prepare.py --vllm $v --out .gpu/r9/$v/libs --kernels tuned --no-small --no-tree \
     > .gpu/r9-$v.log 2>&1 || { echo "$v failed"; tail -5 .gpu/r9-$v.log; }
  echo "$v done $((SECONDS - T0)) s"
done
