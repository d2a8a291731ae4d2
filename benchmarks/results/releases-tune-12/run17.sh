#!/usr/bin/env bash
# Run 17 (issue 8 part 3 with tune-12; run16.sh of releases-tune-8 with the library root and output folder renamed): per other header revision, validate on the tuned instantiations
# (fp16/bf16 x head 64/128/256 x block 16/32 x auto/fp8, v1/v2, ALiBi on/off) and the held-out bench,
# stock vs patched, dispatched kernel, warm + cold, 20 reps x 3 rounds. Releases in the order given, each
# only while time is left (NEED s at least). VALIDATE=0 / HELDOUT=0 leave that step out. Libraries built here: scripts/gpu_prepare.py --vllm V
# --config benchmarks/results/tune-12/kvpatch.toml --out .gpu/t12r/V/libs --kernels tuned --no-small --no-tree
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTHONPATH=$PWD PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
T0=$SECONDS; BUDGET=${BUDGET:-560}
unpack() { python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$1" "$2"; }
for v in ${RELEASES:-0.6.4 0.11.2 0.8.5 0.9.2 0.10.0}; do
  (( BUDGET - (SECONDS - T0) < ${NEED:-130} )) && { echo "$v: skipped, $((BUDGET - SECONDS + T0)) s left"; continue; }
  L=.gpu/t12r/$v/libs; R=$OUT/r17/$v; mkdir -p $R /tmp/l17/$v
  LIBS=()
  while IFS= read -r line; do
    [[ -z "$line" ]] && continue
    name=${line%%=*}; rest=${line#*=}; file=${rest%:*}; prefix=${rest##*:}
    unpack $L/$file.xz /tmp/l17/$v/$file || exit 1
    LIBS+=(--lib "$name=/tmp/l17/$v/$file:$prefix")
  done < $L/libs.txt
  cp $L/variants.json $R/
  [[ "${VALIDATE:-1}" == 1 ]] && timeout 90 python3 -m kvpatch validate "${LIBS[@]}" --variant-info $L/variants.json --dtypes fp16,bf16 \
     --head-sizes 64,128,256 --block-sizes 16,32 --kv auto,fp8 --json $R/validate.json > $R/validate.log 2>&1
  [[ "${VALIDATE:-1}" == 1 ]] && { echo "$v validate rc $? ($((SECONDS - T0)) s)"; tail -2 $R/validate.log; }
  [[ "${HELDOUT:-1}" == 1 ]] || continue
  LEFT=$(( BUDGET - (SECONDS - T0) - 5 )); (( LEFT > 150 )) && LEFT=150
  timeout $LEFT python3 -m kvpatch bench --set heldout "${LIBS[@]}" --variant-info $L/variants.json --kernels dispatched \
     --reps 20 --rounds 3 --json $R/bench-heldout.json > $R/bench-heldout.log 2>&1
  echo "$v heldout rc $? ($((SECONDS - T0)) s)"; grep -A12 "dispatched" $R/bench-heldout.log | head -14
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv > $OUT/r17/nvidia-smi-end.csv 2>&1
echo "total: $((SECONDS - T0)) s"
