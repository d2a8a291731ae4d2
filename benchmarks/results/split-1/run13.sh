#!/usr/bin/env bash
# run13 = run12 with LIBDIR=.gpu/x2/libs RUN=r13 NOHELD=inline: stock, t7, inline (issue=inline everywhere), split (the key loop duplicated: ALiBi -> stock loop without prefetch, else the inline-asm loop), paper.
# Run 12 (experiment, bf16 only): is a prefetch issued by inline asm in the VALUE loop only (the key loop keeps
# the call form, so nvcc still unswitches it on ALiBi) bit-identical and faster than tune-7's call form?
# Libraries: stock, t7 (tune-7), mixed (t7 with value-loop inline asm), callall (call, cta, la1 everywhere),
# mixall (callall with value-loop inline), paper. validate (bf16 x head 64/128/256 x block 16/32, auto),
# the ALiBi probe, headline and held-out benches (bf16, auto cache, dispatched).
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$SECONDS; R=$OUT/${RUN:-r12}; mkdir -p $R /tmp/l12
L=${LIBDIR:-.gpu/x1/libs}; ALL=(); PROBE=(); HELD=()
while IFS= read -r line; do
  [[ -z "$line" ]] && continue
  name=${line%%=*}; rest=${line#*=}; file=${rest%:*}; prefix=${rest##*:}
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" $L/$file.xz /tmp/l12/$file || exit 1
  ALL+=(--lib "$name=/tmp/l12/$file:$prefix"); PROBE+=("$name=/tmp/l12/$file:$prefix")
  [[ ",${NOHELD:-callall}," != *",$name,"* ]] && HELD+=(--lib "$name=/tmp/l12/$file:$prefix")
done < $L/libs.txt
cp $L/variants.json $R/
timeout 120 python3 -m kvpatch validate "${ALL[@]}" --variant-info $L/variants.json --dtypes bf16 --head-sizes 64,128,256 \
   --block-sizes 16,32 --kv auto --json $R/validate.json > $R/validate.log 2>&1
echo "validate rc $? ($((SECONDS - T0)) s)"; tail -4 $R/validate.log
timeout 60 python3 -m kvpatch bench --set headline "${ALL[@]}" --variant-info $L/variants.json --dtypes bf16 --kernels dispatched \
   --reps 40 --json $R/bench-headline.json > $R/bench-headline.log 2>&1
echo "headline rc $? ($((SECONDS - T0)) s)"
timeout 150 python3 -m kvpatch bench --set heldout "${HELD[@]}" --variant-info $L/variants.json --dtypes bf16 --kv auto \
   --kernels dispatched --reps 20 --json $R/bench-heldout.json > $R/bench-heldout.log 2>&1
echo "heldout rc $? ($((SECONDS - T0)) s)"
LEFT=$((420 - SECONDS)); (( LEFT > 20 )) && timeout $LEFT python3 .gpu/probe.py $R/probe.json "${PROBE[@]}" > $R/probe.log 2>&1
echo "probe rc $? ($((SECONDS - T0)) s)"
python3 - $R <<'PY'
import json, sys
r = sys.argv[1]
for f in ("bench-headline.json", "bench-heldout.json"):
    try:
        b = json.load(open(f"{r}/{f}"))
    except Exception as e:
        print(f, "missing", e); continue
    print("==", f, round(b["seconds"]), "s,", len(b["mismatches"]), "mismatches")
    for s in b["summary"]:
        if s["scope"] == "dispatched":
            print(f"  {s['variant']:8s} {s['mode']} min {s['min']:.3f} med {s['median']:.3f} geo {s['geomean']:.3f} {s['faster']}-{s['noise']}-{s['slower']}")
bad = {}
for line in open(f"{r}/probe.log"):
    if line.startswith("{"):
        x = json.loads(line)
        for n, v in x["variants"].items():
            bad.setdefault(n, [0, 0])[0] += 1
            bad[n][1] += v["status"] != "pass"
print("probe (cases, not identical):", bad)
PY
cd $OUT && gzip -f ${RUN:-r12}/*.json; tar czf ${RUN:-r12}.tgz ${RUN:-r12} && rm -rf ${RUN:-r12}
