#!/usr/bin/env bash
# run9b: SKIP_VALIDATE=1 STAGES_0102=heldout,headline DECODE=0 reruns only the benches (run 9 crashed in their summary).
# Run 9 (issue 8 part 3 with the shipped table, tune-7): per other header revision, validate (the tuned
# instantiations, standard-normal ALiBi slopes) + the held-out bench (stock vs patched, dispatched, warm + cold,
# 20 reps x 3 rounds). Then 0.10.2 (full kernel set): validate --full, held-out and headline benches with the
# A/A control (--aa); then the Llama-3.2-1B decode step if time is left.
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$SECONDS
unpack() { python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$1" "$2"; }
for v in ${RELEASES:-0.6.4 0.8.5 0.9.2 0.10.0 0.11.2}; do
  L=.gpu/r9/$v/libs; R=$OUT/r9/$v; mkdir -p $R /tmp/l9/$v
  LIBS=()
  while IFS= read -r line; do
    [[ -z "$line" ]] && continue
    name=${line%%=*}; rest=${line#*=}; file=${rest%:*}; prefix=${rest##*:}
    unpack $L/$file.xz /tmp/l9/$v/$file || exit 1
    LIBS+=(--lib "$name=/tmp/l9/$v/$file:$prefix")
  done < $L/libs.txt
  cp $L/variants.json $R/
  [[ -n "${SKIP_VALIDATE:-}" ]] || timeout 90 python3 -m kvpatch validate "${LIBS[@]}" --variant-info $L/variants.json --dtypes fp16,bf16 \
     --head-sizes 64,128,256 --block-sizes 16,32 --kv auto,fp8 --json $R/validate.json > $R/validate.log 2>&1
  echo "$v validate rc $? ($((SECONDS - T0)) s)"; tail -3 $R/validate.log
  timeout 120 python3 -m kvpatch bench --set heldout "${LIBS[@]}" --variant-info $L/variants.json --kernels dispatched \
     --reps 20 --rounds 3 --json $R/bench-heldout.json --plot $R/bench-heldout.png > $R/bench-heldout.log 2>&1
  echo "$v heldout rc $? ($((SECONDS - T0)) s)"
done
mkdir -p $OUT/r9/0.10.2
OUT=$OUT/r9/0.10.2 AA=1 HELDOUT_REPS=20 HEADLINE_REPS=40 HEADLINE_KERNELS=dispatched timeout $((500 - SECONDS)) \
   bash scripts/gpu_run.sh .gpu/r9/0.10.2/libs ${STAGES_0102:-full,heldout,headline} 2>&1 | tail -40
echo "after 0.10.2: $((SECONDS - T0)) s"
K=$OUT/r9/kvpatch-libs
printf "stock=$K/libkvpatch_stock.so:kvpatch_stock\npatched=$K/libkvpatch_patched.so:kvpatch_patched\n" > /tmp/l9/libs.txt
LEFT=$(( ${DECODE:-1} ? 570 - SECONDS : 0 )); echo "decode 1B: $LEFT s left"; mkdir -p $OUT/r9/decode
if (( LEFT > 40 )); then
  timeout $LEFT python3 -m kvpatch.prefetch.decode --libs-file /tmp/l9/libs.txt --prefetch-lib .gpu/r5/libs/libkvpatch_l2_prefetch.so \
    --layers 8 --rounds 5 --cap off --models llama-3.2-1b --dtypes bf16,fp16 --batches 1,4,16,64 --contexts 1024,4096,16384 \
    --json $OUT/r9/decode/decode_llama1b_warm.json --plot $OUT/r9/decode/decode_llama1b_warm.png --text $OUT/r9/decode/decode_llama1b_warm.txt \
    > $OUT/r9/decode/decode_llama1b_warm.log 2>&1; echo "decode rc $?"; cat $OUT/r9/decode/decode_llama1b_warm.txt
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv > $OUT/r9/nvidia-smi-end.csv 2>&1
echo "total: $((SECONDS - T0)) s"
cd $OUT && rm -rf r9/kvpatch-libs && find r9 -name '*.json' -exec gzip -f {} \; ; tar czf r9.tgz r9 && rm -rf r9 && ls -la
