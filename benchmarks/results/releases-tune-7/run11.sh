#!/usr/bin/env bash
# Run 11: the GPU tests of the prefetch runtime and the decode step (both time with the new launch order),
# then a small Llama-3.2-1B decode step (tune-7 0.10.2 libs) to compare with run 9's (rotation) numbers.
set -uo pipefail
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=/tmp/kvc PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/r11 /tmp/l11
L=.gpu/r9/0.10.2/libs
for n in stock patched; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" $L/libkvpatch_$n.so.xz /tmp/l11/libkvpatch_$n.so; done
printf 'stock=/tmp/l11/libkvpatch_stock.so:kvpatch_stock\npatched=/tmp/l11/libkvpatch_patched.so:kvpatch_patched\n' > /tmp/l11/libs.txt
export KVPATCH_PREFETCH_LIB=$PWD/.gpu/r5/libs/libkvpatch_l2_prefetch.so
export KVPATCH_TEST_LIBS=stock=/tmp/l11/libkvpatch_stock.so:kvpatch_stock,patched=/tmp/l11/libkvpatch_patched.so:kvpatch_patched
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_prefetch_gpu.py > $OUT/r11/pytest_prefetch_gpu.txt 2>&1; echo "pytest rc $?"; tail -3 $OUT/r11/pytest_prefetch_gpu.txt
timeout 200 python3 -m kvpatch.prefetch.decode --libs-file /tmp/l11/libs.txt --prefetch-lib $KVPATCH_PREFETCH_LIB \
    --layers 8 --rounds 5 --cap off --models llama-3.2-1b --dtypes bf16,fp16 --batches 1,64 --contexts 1024,4096 \
    --json $OUT/r11/decode_llama1b_small.json --text $OUT/r11/decode_llama1b_small.txt > $OUT/r11/decode_llama1b_small.log 2>&1
echo "decode rc $?"; cat $OUT/r11/decode_llama1b_small.txt
cd $OUT && gzip -f r11/*.json; tar czf r11.tgz r11 && rm -rf r11
