#!/usr/bin/env bash
# Run 6 (issue 8 part 3): the shipped table on the other five header revisions. Per release:
# validate (the tuned instantiations: fp16/bf16 x head 64/128/256 x block 16/32 x auto/fp8, ALiBi on/off,
# v1/v2) and the held-out bench (stock vs patched, dispatched kernel, warm + cold).
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$SECONDS
for v in ${RELEASES:-0.6.4 0.8.5 0.9.2 0.10.0 0.11.2}; do
  L=.gpu/r6/$v/libs; R=$OUT/r6/$v; mkdir -p $R /tmp/l6/$v
  LIBS=()
  while IFS= read -r line; do
    [[ -z "$line" ]] && continue
    name=${line%%=*}; rest=${line#*=}; file=${rest%:*}; prefix=${rest##*:}
    python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" $L/$file.xz /tmp/l6/$v/$file || exit 1
    LIBS+=(--lib "$name=/tmp/l6/$v/$file:$prefix")
  done < $L/libs.txt
  cp $L/variants.json $R/
  timeout 90 python3 -m kvpatch validate "${LIBS[@]}" --variant-info $L/variants.json --dtypes fp16,bf16 \
     --head-sizes 64,128,256 --block-sizes 16,32 --kv auto,fp8 --json $R/validate.json > $R/validate.log 2>&1
  echo "$v validate rc $? ($((SECONDS - T0)) s)"; tail -4 $R/validate.log
  timeout 150 python3 -m kvpatch bench --set heldout "${LIBS[@]}" --variant-info $L/variants.json --kernels dispatched \
     --reps ${REPS:-20} --rounds 3 --json $R/bench-heldout.json --plot $R/bench-heldout.png > $R/bench-heldout.log 2>&1
  echo "$v heldout rc $? ($((SECONDS - T0)) s)"; grep -A8 "dispatched" $R/bench-heldout.log | head -12
done
# the decode step with the shipped table (0.10.2 stock + patched, full kernel sets from run 5), weight prefetch off
mkdir -p /tmp/l5 $OUT/r6/decode
for n in stock patched; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .gpu/r5/libs/libkvpatch_$n.so.xz /tmp/l5/libkvpatch_$n.so; done
printf 'stock=/tmp/l5/libkvpatch_stock.so:kvpatch_stock\npatched=/tmp/l5/libkvpatch_patched.so:kvpatch_patched\n' > /tmp/l5/libs.txt
LEFT=$((565 - SECONDS)); echo "decode: $LEFT s left"
if (( LEFT > 60 )); then
  timeout $LEFT python3 -m kvpatch.prefetch.decode --libs-file /tmp/l5/libs.txt --prefetch-lib .gpu/r5/libs/libkvpatch_l2_prefetch.so \
    --layers 8 --rounds 5 --cap off --models llama-3.1-8b --dtypes bf16,fp16 --batches 1,4,16,64 --contexts 1024,4096,16384 \
    --json $OUT/r6/decode/decode_llama8b_warm.json --plot $OUT/r6/decode/decode_llama8b_warm.png --text $OUT/r6/decode/decode_llama8b_warm.txt \
    > $OUT/r6/decode/decode_llama8b_warm.log 2>&1; echo "decode rc $?"; cat $OUT/r6/decode/decode_llama8b_warm.txt
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv > $OUT/r6/nvidia-smi-end.csv 2>&1
echo "total: $((SECONDS - T0)) s"
cd $OUT && find r6 -name '*.json' -exec gzip -f {} \; ; tar czf r6.tgz r6 && rm -rf r6 && ls -la
