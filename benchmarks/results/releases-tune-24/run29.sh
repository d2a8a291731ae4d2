#!/usr/bin/env bash
# Run 29 (eighth session), one device call:
#  1. tune-24's own libraries on the four other header revisions (until now read off tune-23's run
#     there through SASS equality: sass-tune-24-earlier-releases.txt), validate + held-out with the
#     A/A twin. .gpu/t24r/V/libs = scripts/gpu_prepare.py --vllm V --kernels tuned --no-small
#     --no-tree --out .gpu/t24r/V/libs (V = 0.6.4 0.8.5 0.9.2 0.10.0).
#  2. tune-26 (../tune-26/: tune-24 plus fp16 head 128 block 16 v1 from ../tune-25/) on 0.10.2:
#     validate --full, held-out and headline (paper's patch, control, A/A twin). .gpu/t26/libs =
#     scripts/gpu_prepare.py --vllm 0.10.2 --config benchmarks/results/tune-26/kvpatch.toml
#     --no-tree --out .gpu/t26/libs.
#   OUT=$OUT bash benchmarks/results/releases-tune-24/run29.sh   (carry .gpu/t24r, .gpu/t26, .gpu/t23/vllm-0.10.2)
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTHONPATH=$PWD
T0=$SECONDS; BASE=$OUT
OUT=$BASE/releases PACK=1 AA=1 BUDGET=300 NEED=70 bash scripts/gpu_releases.sh .gpu/t24r 2>&1 | tail -12
echo "releases done ($((SECONDS - T0)) s)"
OUT=$BASE/t26 PACK=1 AA=1 TREE=.gpu/t23/vllm-0.10.2 \
  timeout $((530 - (SECONDS - T0))) bash scripts/gpu_run.sh .gpu/t26/libs full,heldout,headline 2>&1 | tail -12
echo "tune-26 done ($((SECONDS - T0)) s)"
ls -la $BASE/*
