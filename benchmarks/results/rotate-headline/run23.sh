#!/usr/bin/env bash
# Run 23 (prepared in the sixth session, not yet run): scope=kv-head-rotate at fp16 head 128
# block 16, the headline kernel tune-17 leaves off. On the GPU machine, carry .gpu/tune22,
# .gpu/t22s and .gpu/t17/vllm-0.10.2 (about 20 MB; move old result folders aside first).
# Libraries:
#   .gpu/tune22/libs = scripts/gpu_prepare.py --vllm 0.10.2 --tune --only fp16/128/16 --only fp16/64/16
#     --only fp16/256/16 --grid 'issue=call,inline;scope=kv-head,kv-head-rotate;lookahead=1,2;min-group=2;read=lane,warp'
#     --no-tree (stock + 16 candidates);
#   .gpu/t22s/libs = scripts/gpu_prepare.py --vllm 0.10.2 --kernels tuned --no-small --variant rot=rot.toml
#     --variant rotinl=rotinl.toml --no-tree (stock, tune-17, and tune-17 with fp16/128/16 set to the
#     rotate forms by hand: call or inline, v1 read=warp, v2 read=lane).
# 1. tune on the tuning set (fp16 heads 64/128/256 block 16): does a rotate candidate qualify?
# 2. the headline (dispatched kernels, 50 reps x 3 rounds): stock, tune-17, rot, rotinl;
# 3. the held-out shapes at fp16 head 128 block 16 (30 reps x 3 rounds), the same four.
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTHONPATH=$PWD
T0=$SECONDS
OUT=$OUT/t22 PACK=1 TUNE_DTYPES=fp16 TUNE_ONLY=fp16/128/16,fp16/64/16,fp16/256/16 TREE=.gpu/t17/vllm-0.10.2 \
  bash scripts/gpu_run.sh .gpu/tune22/libs tune 2>&1 | tail -4
echo "tune done ($((SECONDS - T0)) s)"
L=.gpu/t22s/libs; K=/tmp/l23; mkdir -p $K $OUT/r23
LIBS=()
for n in stock patched rot rotinl; do
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" $L/libkvpatch_$n.so.xz $K/libkvpatch_$n.so || exit 1
  LIBS+=(--lib "$n=$K/libkvpatch_$n.so:kvpatch_$n")
done
SMI="nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv"
$SMI > $OUT/r23/nvidia-smi-start.csv 2>&1
python3 -m kvpatch bench --set headline --kernels dispatched "${LIBS[@]}" --variant-info $L/variants.json --reps 50 --rounds 3 \
  --json $OUT/r23/bench-headline.json --plot $OUT/r23/bench-headline.png > $OUT/r23/bench-headline.log 2>&1
echo "headline rc $? ($((SECONDS - T0)) s)"; tail -16 $OUT/r23/bench-headline.log
python3 -m kvpatch bench --set heldout --dtypes fp16 --head-sizes 128 --block-sizes 16 --kv auto --kernels dispatched \
  "${LIBS[@]}" --variant-info $L/variants.json --reps 30 --rounds 3 \
  --json $OUT/r23/bench-heldout-fp16-128-16.json > $OUT/r23/bench-heldout-fp16-128-16.log 2>&1
echo "heldout rc $? ($((SECONDS - T0)) s)"; tail -14 $OUT/r23/bench-heldout-fp16-128-16.log
$SMI > $OUT/r23/nvidia-smi-end.csv 2>&1
cd $OUT && find r23 -name '*.json' -exec gzip -f {} \; ; tar czf r23.tgz r23 && rm -rf r23
