#!/usr/bin/env bash
# Run 5: the shipped table (tune-5) on vLLM 0.10.2: validate --full (the larger ALiBi cases) alone,
# then vLLM's own test (8 workers, alone), the headline bench (stock, patched, paper, control, mg2)
# and the held-out bench (stock, patched, mg2 = the shipped table with min-group 2).
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$SECONDS
mkdir -p $OUT/r5
OUT=$OUT/r5 timeout 120 bash scripts/gpu_run.sh .gpu/r5/libs full 2>&1 | tail -12
echo "after full: $((SECONDS - T0)) s"
OUT=$OUT/r5 WORKERS=8 HEADLINE_KERNELS=dispatched HEADLINE_REPS=40 HELDOUT_REPS=25 HELDOUT_NAMES=stock,patched,mg2 \
  timeout $((555 - SECONDS)) bash scripts/gpu_run.sh .gpu/r5/libs ${STAGES:-upstream,headline,heldout} 2>&1 | tail -50
echo "total: $((SECONDS - T0)) s"
cp .gpu/r5/libs/variants.json $OUT/r5/
cd $OUT && for f in r5/*.json; do gzip -f $f; done; rm -rf r5/upstream/run; tar czf r5.tgz r5 && rm -rf r5 kvpatch-libs && ls -la
