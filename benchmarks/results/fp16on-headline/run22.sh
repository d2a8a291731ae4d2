#!/usr/bin/env bash
# Run 22: fp16on against its control (the same code, the prefetch compiled but never run), to
# separate the prefetch from the code-generation change at fp16 head 128 block 16. Libraries:
# .gpu/t18c/libs = scripts/gpu_prepare.py --vllm 0.10.2 --no-small --no-tree --kernels tuned
# --variant fp16on=fp16on.toml --variant fp16onctl=fp16onctl.toml (fp16on.toml with control = true).
# 1. the held-out shapes at fp16 head 128 block 16 (30 reps x 3 rounds); 2. the fp16 headline (50 reps).
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTHONPATH=$PWD
L=.gpu/t18c/libs; K=/tmp/l22; mkdir -p $K $OUT/r22
LIBS=()
for n in stock fp16on fp16onctl; do
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" $L/libkvpatch_$n.so.xz $K/libkvpatch_$n.so || exit 1
  LIBS+=(--lib "$n=$K/libkvpatch_$n.so:kvpatch_$n")
done
python3 -m kvpatch bench --set heldout --dtypes fp16 --head-sizes 128 --block-sizes 16 --kv auto --kernels dispatched \
  "${LIBS[@]}" --variant-info $L/variants.json --reps 30 --rounds 3 --json $OUT/r22/bench-heldout-fp16-128-16-control.json \
  > $OUT/r22/bench-heldout-fp16-128-16-control.log 2>&1; echo "heldout rc $?"; tail -12 $OUT/r22/bench-heldout-fp16-128-16-control.log
python3 -m kvpatch bench --set headline --dtypes fp16 --kernels dispatched "${LIBS[@]}" --variant-info $L/variants.json \
  --reps 50 --rounds 3 --json $OUT/r22/bench-headline-fp16-control.json > $OUT/r22/bench-headline-fp16-control.log 2>&1
echo "headline rc $?"; tail -12 $OUT/r22/bench-headline-fp16-control.log
cd $OUT && find r22 -name '*.json' -exec gzip -f {} \; ; tar czf r22.tgz r22 && rm -rf r22
