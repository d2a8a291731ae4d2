#!/usr/bin/env bash
# Run 7: kvpatch tune with the tuning set's three head layouts (GQA 32/8, MHA 32/32, GQA 64/8) on prebuilt
# candidates; build the new table's tuned kernels here; validate them; held-out bench stock vs the new
# table (tune6) vs the shipped table (shipped, run 5's patched library) in one run.
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
R=$OUT/r7; mkdir -p $R/tune /tmp/libs
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu --format=csv > $R/smi-start.csv
unxz() { python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$1" "$2"; }
LIBS=()
while IFS= read -r line; do
  [[ -z "$line" ]] && continue
  name=${line%%=*}; rest=${line#*=}; file=${rest%:*}; prefix=${rest##*:}
  unxz .gpu/tune2/libs/$file.xz /tmp/libs/$file || exit 1
  LIBS+=(--lib "$name=/tmp/libs/$file:$prefix")
done < .gpu/tune2/libs/libs.txt
T0=$SECONDS
timeout 330 python3 -m kvpatch tune "${LIBS[@]}" --variant-info .gpu/tune2/libs/variants.json --reps 20 --rounds 3 \
   --json $R/tune/tune.json -o $R/tune/kvpatch.toml > $R/tune/tune.txt 2>&1
echo "tune rc=$? in $((SECONDS - T0)) s"; grep -A2 "^wrote" $R/tune/tune.txt
[[ -f $R/tune/kvpatch.toml ]] || { cd $OUT && tar czf r7.tgz r7; exit 1; }
rm -rf /tmp/vtree /tmp/g && cp -r .gpu/vllm-0.10.2 /tmp/vtree && mkdir -p /tmp/g
timeout 150 python3 scripts/gpu_prepare.py --tree /tmp/vtree --out /tmp/g/libs --config $R/tune/kvpatch.toml --kernels tuned --no-small --no-tree > $R/prepare.log 2>&1 \
   || { echo "prepare failed"; tail -5 $R/prepare.log; }
echo "prepare: $((SECONDS - T0)) s"
cp /tmp/g/libs/variants.json $R/variants-tune6.json
unxz /tmp/g/libs/libkvpatch_patched.so.xz /tmp/libs/tune6.so; unxz .gpu/r5/libs/libkvpatch_stock.so.xz /tmp/libs/stock5.so; unxz .gpu/r5/libs/libkvpatch_patched.so.xz /tmp/libs/shipped.so
python3 - $R/variants-tune6.json .gpu/r5/libs/variants.json $R/variants.json <<'PY'
import json, sys
new, old = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
json.dump({"stock": old["stock"], "tune6": new["patched"], "shipped": old["patched"]}, open(sys.argv[3], "w"), indent=1)
PY
B=(--lib stock=/tmp/libs/stock5.so:kvpatch_stock --lib tune6=/tmp/libs/tune6.so:kvpatch_patched --lib shipped=/tmp/libs/shipped.so:kvpatch_patched --variant-info $R/variants.json)
timeout 60 python3 -m kvpatch validate "${B[@]}" --dtypes fp16,bf16 --head-sizes 64,128,256 --block-sizes 16,32 --kv auto,fp8 \
   --json $R/validate.json > $R/validate.log 2>&1
echo "validate rc $? ($((SECONDS - T0)) s)"; tail -3 $R/validate.log
LEFT=$((560 - SECONDS - 15)); echo "heldout: $LEFT s left"
timeout $LEFT python3 -m kvpatch bench --set heldout "${B[@]}" --kernels dispatched --reps 25 --rounds 3 \
   --json $R/bench-heldout.json --plot $R/bench-heldout.png > $R/bench-heldout.log 2>&1
echo "heldout rc $? ($((SECONDS - T0)) s)"; grep -A12 "dispatched kernel" $R/bench-heldout.log | head -16
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv > $R/smi-end.csv
cd $OUT && find r7 -name '*.json' -exec gzip -f {} \; ; tar czf r7.tgz r7 && rm -rf r7 && ls -la
