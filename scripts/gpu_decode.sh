#!/usr/bin/env bash
# The L2 weight prefetch (issue 9) on the GPU machine: GPU tests, the GEMM micro-benchmark
# and the decode-step benchmark; everything it writes goes to $OUT.
#
#   here (CPU, nvcc):  bash scripts/gpu_decode.sh --prepare
#       builds the prefetch library for sm_90a into .gpu/libs/libkvpatch_l2_prefetch.so
#       (same nvcc 13.0 as the H200: same SASS), next to the attention libraries'
#       .gpu/libs/libs.txt (NAME=PATH:PREFIX lines, paths relative to the repo root;
#       'stock' required; head sizes 64 and 128 for both models, fp16 and bf16).
#   GPU machine:       OUT=/some/dir bash scripts/gpu_decode.sh
#
# Knobs (environment): KVPATCH_DECODE_CAP  per-batch weight-prefetch cap in MiB, bucket
#   bounds (default "1:32,2:32,4:32,8:16": 32 MiB up to batch 4, 16 MiB at 5-8, off above;
#   "off" disables, "24" = 24 MiB at every batch); KVPATCH_DECODE_LAYERS (8);
#   KVPATCH_DECODE_ROUNDS (5); KVPATCH_DECODE_COLD (1: also a cold-L2 run of 8B bf16);
#   KVPATCH_LIBS_DIR (.gpu/libs). Budget: the timeouts below add up to 7 minutes; a bench cut short keeps its JSON
#   up to the last finished point.
set -uo pipefail
cd "$(dirname "$0")/.."
LIBS_DIR=${KVPATCH_LIBS_DIR:-.gpu/libs}
PF_LIB=$LIBS_DIR/libkvpatch_l2_prefetch.so
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

if [[ ${1:-} == --prepare ]]; then
  mkdir -p "$LIBS_DIR"
  "$PY" - "$PF_LIB" <<'PYEOF' || exit 5
import shutil, sys
from kvpatch.prefetch.kernel import build_prefetch_library
lib = build_prefetch_library("9.0a")
shutil.copy2(lib, sys.argv[1])
print(f"{sys.argv[1]} (from {lib})")
PYEOF
  exit 0
fi

OUT=${OUT:?set OUT to the output directory}
mkdir -p "$OUT"
CAP=${KVPATCH_DECODE_CAP:-1:32,2:32,4:32,8:16}
LAYERS=${KVPATCH_DECODE_LAYERS:-8}
ROUNDS=${KVPATCH_DECODE_ROUNDS:-5}
T0=$SECONDS
say() { echo "[gpu_decode +$((SECONDS - T0))s] $*" | tee -a "$OUT/log.txt"; }

if [[ ! -f $PF_LIB ]]; then
  say "no $PF_LIB: building the prefetch library here (needs nvcc, cuobjdump)"
  PF_LIB=$("$PY" -c 'from kvpatch.prefetch.kernel import build_prefetch_library as b; print(b("9.0a"))') || { say "build failed"; exit 5; }
fi
export KVPATCH_PREFETCH_LIB=$PF_LIB
[[ -f $LIBS_DIR/libs.txt ]] || { say "missing $LIBS_DIR/libs.txt"; exit 2; }
export KVPATCH_TEST_LIBS=$(grep -v '^\s*#' "$LIBS_DIR/libs.txt" | grep . | paste -sd, -)
say "prefetch library $KVPATCH_PREFETCH_LIB; attention libraries $KVPATCH_TEST_LIBS; cap $CAP; $LAYERS layers; $ROUNDS rounds"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active --format=csv > "$OUT/smi_before.csv" 2>&1
"$PY" -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name())' 2>&1 | tee -a "$OUT/log.txt"

rc=0
say "GPU tests"
timeout 100 "$PY" -m pytest -q -m gpu --noconftest -p no:cacheprovider tests/prefetch/test_prefetch_gpu.py > "$OUT/gpu_tests.txt" 2>&1 || rc=$?
tail -3 "$OUT/gpu_tests.txt" | tee -a "$OUT/log.txt"

say "GEMM micro-benchmark"
timeout 45 "$PY" - "$OUT/micro.json" <<'PYEOF' > "$OUT/micro.txt" 2>&1 || rc=$?
import json, sys
from kvpatch.decode.micro import run_micro_gemm
from kvpatch.render import micro_table
for dtype in ("bf16", "fp16"):
    m = run_micro_gemm(dtype=dtype)
    print(micro_table(m))
    json.dump(m, open(sys.argv[1].replace(".json", f"_{dtype}.json"), "w"), indent=1)
PYEOF
cat "$OUT/micro.txt" | tee -a "$OUT/log.txt"

bench() {  # name, timeout, extra args...
  local name=$1 limit=$2; shift 2
  say "bench-decode $name"
  timeout "$limit" "$PY" -m kvpatch bench-decode --libs-file "$LIBS_DIR/libs.txt" --prefetch-lib "$PF_LIB" \
    --layers "$LAYERS" --rounds "$ROUNDS" --cap "$CAP" \
    --json "$OUT/decode_$name.json" --plot "$OUT/decode_$name.png" --text "$OUT/decode_$name.txt" "$@" \
    > "$OUT/decode_$name.log" 2>&1 || { local r=$?; say "bench-decode $name exit $r"; rc=$r; }
}
bench llama8b_warm 150 --models llama-3.1-8b --dtypes bf16,fp16 --batches 1,4,16,64 --contexts 1024,4096,16384
bench llama1b_warm 50 --models llama-3.2-1b --dtypes bf16 --batches 1,4,16,64 --contexts 1024,4096,16384
if [[ ${KVPATCH_DECODE_COLD:-1} == 1 ]]; then
  bench llama8b_bf16_cold 80 --models llama-3.1-8b --dtypes bf16 --batches 1,4,16,64 --contexts 1024,4096,16384 --cold
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv > "$OUT/smi_after.csv" 2>&1
say "done in $((SECONDS - T0)) s, rc $rc"
for f in "$OUT"/decode_*.txt; do [[ -f $f ]] && { echo; cat "$f"; }; done
exit $rc
