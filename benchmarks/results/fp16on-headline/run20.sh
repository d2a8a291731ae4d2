#!/usr/bin/env bash
# Run 20: what turning fp16 head 128 block 16 on would give and cost. Libraries: .gpu/t18h/libs =
# scripts/gpu_prepare.py --vllm 0.10.2 --variant fp16on=fp16on.toml --no-tree (stock and tune-17,
# the full kernel set; the paper's patch, tune-17's control and fp16on, headline shapes). fp16on.toml
# is tune-17 with fp16/128/16 v1 = inline kv-head la1 min-group 2 read=warp and v2 = call, the same
# settings (the best candidates of tune-15, each slower than stock at 2 warm tuning points).
# 1. the headline (dispatched kernels, 50 reps x 3 rounds): stock, tune-17, the paper, fp16on;
# 2. the held-out shapes at fp16 head 128 block 16 (new seed, GQA 64/8, GQA 8/1, MHA 32/32; 30 reps).
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTHONPATH=$PWD
T0=$SECONDS; L=.gpu/t18h/libs; K=/tmp/l20; mkdir -p $K $OUT/r20
LIBS=()
for n in stock patched paper fp16on; do
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" $L/libkvpatch_$n.so.xz $K/libkvpatch_$n.so || exit 1
  LIBS+=(--lib "$n=$K/libkvpatch_$n.so:kvpatch_$n")
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv > $OUT/r20/nvidia-smi-start.csv 2>&1
python3 -m kvpatch bench --set headline --kernels dispatched "${LIBS[@]}" --variant-info $L/variants.json --reps 50 --rounds 3 \
  --json $OUT/r20/bench-headline.json --plot $OUT/r20/bench-headline.png > $OUT/r20/bench-headline.log 2>&1
echo "headline rc $? ($((SECONDS - T0)) s)"; tail -30 $OUT/r20/bench-headline.log
python3 -m kvpatch bench --set heldout --dtypes fp16 --head-sizes 128 --block-sizes 16 --kv auto --kernels dispatched \
  "${LIBS[0]}" "${LIBS[1]}" "${LIBS[2]}" "${LIBS[3]}" "${LIBS[6]}" "${LIBS[7]}" --variant-info $L/variants.json --reps 30 --rounds 3 \
  --json $OUT/r20/bench-heldout-fp16-128-16.json > $OUT/r20/bench-heldout-fp16-128-16.log 2>&1
echo "heldout rc $? ($((SECONDS - T0)) s)"; tail -25 $OUT/r20/bench-heldout-fp16-128-16.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv > $OUT/r20/nvidia-smi-end.csv 2>&1
cd $OUT && find r20 -name '*.json' -exec gzip -f {} \; ; tar czf r20.tgz r20 && rm -rf r20
