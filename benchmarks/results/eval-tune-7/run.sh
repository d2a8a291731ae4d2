#!/usr/bin/env bash
# Run 8: the tune-6 table on vLLM 0.10.2 (full kernel set): validate --full alone, vLLM's own test (8 workers),
# the headline bench (stock, patched = tune-6, paper, control, raw = tune-6 before its exclusions, tune5 = the
# table shipped before); then the ALiBi probe (.gpu/probe.py) on raw and tune5.
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$SECONDS
mkdir -p $OUT/r8
OUT=$OUT/r8 timeout 100 bash scripts/gpu_run.sh .gpu/r8/libs full 2>&1 | tail -8
echo "after full: $((SECONDS - T0)) s"
OUT=$OUT/r8 WORKERS=8 HEADLINE_KERNELS=dispatched HEADLINE_REPS=40 timeout $((380 - SECONDS)) bash scripts/gpu_run.sh .gpu/r8/libs upstream,headline 2>&1 | tail -40
echo "after upstream+headline: $((SECONDS - T0)) s"
K=$OUT/kvpatch-libs
LEFT=$((450 - SECONDS)); echo "probe: $LEFT s"
(( LEFT > 20 )) && timeout $LEFT python3 .gpu/probe.py $OUT/r8/probe.json stock=$K/libkvpatch_stock.so:kvpatch_stock \
   raw=$K/libkvpatch_raw.so:kvpatch_raw tune5=$K/libkvpatch_tune5.so:kvpatch_patched patched=$K/libkvpatch_patched.so:kvpatch_patched > $OUT/r8/probe.log 2>&1
echo "probe rc $? ($((SECONDS - T0)) s)"
python3 - $OUT/r8/probe.log <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    bad = {n: v["mismatched"] for n, v in r["variants"].items() if v["status"] != "pass"}
    if bad or r["reasons"]:
        print(r["slopes"], r["case"], "nseq", r["nseq"], bad, r["reasons"][:1])
PY
cp .gpu/r8/libs/variants.json $OUT/r8/
cd $OUT && for f in r8/*.json; do gzip -f $f; done; rm -rf r8/upstream/run kvpatch-libs; tar czf r8.tgz r8 && rm -rf r8 && ls -la
