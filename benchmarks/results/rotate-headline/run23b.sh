set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTHONPATH=$PWD
T0=$SECONDS
OUT=$OUT/t22b PACK=1 TUNE_DTYPES=bf16 TUNE_ONLY=bf16/128/16 TREE=.gpu/t17/vllm-0.10.2 \
  bash scripts/gpu_run.sh .gpu/tune22b/libs tune 2>&1 | tail -4
echo "tune22b done ($((SECONDS - T0)) s)"
OUT=$OUT/t22c PACK=1 TUNE_DTYPES=fp16 TUNE_ONLY=fp16/128/32,fp16/64/32,fp16/256/32 TREE=.gpu/t17/vllm-0.10.2 \
  bash scripts/gpu_run.sh .gpu/tune22c/libs tune 2>&1 | tail -4
echo "tune22c done ($((SECONDS - T0)) s)"
