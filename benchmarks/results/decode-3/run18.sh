#!/usr/bin/env bash
# Run 18: the weight-prefetch sweep again (scripts/gpu_pf_sweep.sh: stage 1 + 2 on Llama-3.1-8B
# bf16, the pick, the decode bench with it) now that each variant keeps its own controller alive,
# with tune-12's 0.10.2 libraries (.gpu/t12/libs: scripts/gpu_prepare.py --vllm 0.10.2 --config
# benchmarks/results/tune-12/kvpatch.toml --no-small); then Llama-3.2-1B's decode step (fp16 +
# bf16, warm, weight prefetch off) with the same libraries, while time is left. .gpu/site: platformdirs and
# filelock (pip install --target; the GPU image lacks them, and the prefetch library build imports them).
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTHONPATH=$PWD/.gpu/site:$PWD PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
T0=$SECONDS; L=.gpu/t12/libs; K=/tmp/l18; mkdir -p $K $OUT/r18
for f in libkvpatch_stock.so libkvpatch_patched.so; do
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" $L/$f.xz $K/$f || exit 1
done
printf "stock=$K/libkvpatch_stock.so:kvpatch_stock\npatched=$K/libkvpatch_patched.so:kvpatch_patched\n" > $K/libs.txt
KVPATCH_LIBS_TXT=$K/libs.txt KVPATCH_SWEEP_BUDGET=${SWEEP_BUDGET:-220} OUT=$OUT/r18 bash scripts/gpu_pf_sweep.sh
echo "sweep rc $? ($((SECONDS - T0)) s)"; head -12 $OUT/r18/pf_sweep.txt
LEFT=$(( ${BUDGET:-440} - (SECONDS - T0) )); echo "decode 1B: $LEFT s left"
if (( LEFT > 40 )); then
  timeout $LEFT python3 -m kvpatch.prefetch.decode --libs-file $K/libs.txt --prefetch-lib $L/libkvpatch_l2_prefetch.so \
    --layers 8 --rounds 5 --cap off --models llama-3.2-1b --dtypes bf16,fp16 --batches 1,4,16,64 --contexts 1024,4096,16384 \
    --json $OUT/r18/decode_llama1b_warm.json --plot $OUT/r18/decode_llama1b_warm.png --text $OUT/r18/decode_llama1b_warm.txt \
    > $OUT/r18/decode_llama1b_warm.log 2>&1; echo "decode rc $?"; cat $OUT/r18/decode_llama1b_warm.txt
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv > $OUT/r18/nvidia-smi-end.csv 2>&1
echo "total: $((SECONDS - T0)) s"
cd $OUT && find r18 -name '*.json' -exec gzip -f {} \; ; tar czf r18.tgz r18 && rm -rf r18
