#!/usr/bin/env bash
# Run 21: Llama-3.1-8B's decode step (fp16 + bf16, warm, weight prefetch off; decode-4's command)
# with fp16on as 'patched' (.gpu/t18h/libs: its library holds head 128 block 16, all the 8B step
# uses) against stock: what turning fp16 128/16 on gives a whole step, where the other layers'
# weights and KV pass through L2 between one layer's attention launches.
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTHONPATH=$PWD/.gpu/site:$PWD PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
T0=$SECONDS; L=.gpu/t18h/libs; K=/tmp/l21; mkdir -p $K $OUT/r21
for n in stock fp16on; do
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" $L/libkvpatch_$n.so.xz $K/libkvpatch_$n.so || exit 1
done
printf "stock=$K/libkvpatch_stock.so:kvpatch_stock\npatched=$K/libkvpatch_fp16on.so:kvpatch_fp16on\n" > $K/libs.txt
python3 -m kvpatch.prefetch.decode --libs-file $K/libs.txt --prefetch-lib .gpu/t12/libs/libkvpatch_l2_prefetch.so \
  --layers 8 --rounds 5 --cap off --models llama-3.1-8b --dtypes bf16,fp16 --batches 1,4,16,64 --contexts 1024,4096,16384 \
  --json $OUT/r21/decode_llama8b_warm_fp16on.json --plot $OUT/r21/decode_llama8b_warm_fp16on.png \
  --text $OUT/r21/decode_llama8b_warm_fp16on.txt > $OUT/r21/decode_llama8b_warm_fp16on.log 2>&1
echo "rc $? ($((SECONDS - T0)) s)"; tail -7 $OUT/r21/decode_llama8b_warm_fp16on.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv > $OUT/r21/nvidia-smi-end.csv 2>&1
cd $OUT && find r21 -name '*.json' -exec gzip -f {} \; ; tar czf r21.tgz r21 && rm -rf r21
