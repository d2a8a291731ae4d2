#!/usr/bin/env bash
# Run 10: the A/A control again on 0.10.2 (tune-7 full libs), with the de Bruijn launch order: held-out
# (stock, patched, stock-aa) and headline (stock, patched, paper, control, stock-aa), dispatched kernel.
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/r10
OUT=$OUT/r10 AA=1 HELDOUT_REPS=20 HEADLINE_REPS=40 HEADLINE_KERNELS=dispatched timeout 400 \
   bash scripts/gpu_run.sh .gpu/r9/0.10.2/libs heldout,headline 2>&1 | grep -v "^   slower" | tail -40
cd $OUT && rm -rf kvpatch-libs && find r10 -name '*.json' -exec gzip -f {} \; ; tar czf r10.tgz r10 && rm -rf r10 && ls -la
