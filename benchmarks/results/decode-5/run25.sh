#!/usr/bin/env bash
# Run 25: the decode step (Llama-3.1-8B and Llama-3.2-1B, fp16 + bf16, warm, weight prefetch
# off) with tune-23's 0.10.2 libraries (.gpu/t23/libs: scripts/gpu_prepare.py --vllm 0.10.2
# --out .gpu/t23/libs, the default = tune-23), the same command as decode-4's
# (tune-17). The weight-prefetch library is decode-3's build (.gpu/t12/libs; its sources have
# not changed since); .gpu/site: platformdirs and filelock, which the GPU image lacks.
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTHONPATH=$PWD/.gpu/site:$PWD PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
T0=$SECONDS; L=.gpu/t23/libs; K=/tmp/l25; mkdir -p $K $OUT/r25
for f in libkvpatch_stock.so libkvpatch_patched.so; do
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" $L/$f.xz $K/$f || exit 1
done
printf "stock=$K/libkvpatch_stock.so:kvpatch_stock\npatched=$K/libkvpatch_patched.so:kvpatch_patched\n" > $K/libs.txt
for m in llama-3.1-8b:8b llama-3.2-1b:1b; do
  python3 -m kvpatch.prefetch.decode --libs-file $K/libs.txt --prefetch-lib .gpu/t12/libs/libkvpatch_l2_prefetch.so \
    --layers 8 --rounds 5 --cap off --models ${m%%:*} --dtypes bf16,fp16 --batches 1,4,16,64 --contexts 1024,4096,16384 \
    --json $OUT/r25/decode_llama${m##*:}_warm.json --plot $OUT/r25/decode_llama${m##*:}_warm.png \
    --text $OUT/r25/decode_llama${m##*:}_warm.txt > $OUT/r25/decode_llama${m##*:}_warm.log 2>&1
  echo "${m%%:*} rc $? ($((SECONDS - T0)) s)"; tail -6 $OUT/r25/decode_llama${m##*:}_warm.txt
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv > $OUT/r25/nvidia-smi-end.csv 2>&1
echo "total: $((SECONDS - T0)) s"
cd $OUT && find r25 -name '*.json' -exec gzip -f {} \; ; tar czf r25.tgz r25 && rm -rf r25
