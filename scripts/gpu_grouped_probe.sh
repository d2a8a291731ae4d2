#!/usr/bin/env bash
# The grouped form's probe (benchmarks/grouped_probe/): vLLM's stock decode kernels, kvpatch's shipped
# patched kernels and the grouped prototype, timed side by side in one process on a GPU.
#
#   here (nvcc, no GPU):  bash scripts/gpu_grouped_probe.sh --prepare
#       builds vLLM 0.10.2's full kernel set, stock and patched (kvpatch build --all, cached), and
#       compiles the probe against those two headers into .gpu/grouped_probe/gqa_bench (carry it)
#   GPU machine:          OUT=/some/dir bash scripts/gpu_grouped_probe.sh
#       runs it: $OUT/gqa.txt (its columns: benchmarks/evidence/grouped-probe/run.toml)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.gpu/grouped_probe
if [[ ${1:-} == --prepare ]]; then
  mkdir -p "$BIN/ws"
  (cd "$BIN/ws" && { [[ -f .kvpatch/state.json ]] || kvpatch apply --vllm v0.10.2 >/dev/null; } \
    && kvpatch build --all --arch 9.0a --json ../build.json >/dev/null)
  dirs=$(python3 -c "import json,os; r=json.load(open('$BIN/build.json')); print(' '.join(os.path.dirname(v['library']) for v in r['variants']))")
  read -r STOCK PATCHED <<< "$dirs"
  F=(-std=c++17 -O2 -DNDEBUG --expt-relaxed-constexpr -DENABLE_FP8 -gencode=arch=compute_90a,code=sm_90a)
  P=benchmarks/grouped_probe
  nvcc "${F[@]}" -Dvllm=kvs -I"$STOCK/src/csrc" -I"$STOCK/stubs" -I$P -c $P/stock.cu -o "$BIN/stock.o"
  nvcc "${F[@]}" -Dvllm=kvp -I"$PATCHED/src/csrc" -I"$PATCHED/stubs" -I$P -c $P/patched.cu -o "$BIN/patched.o"
  nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -c $P/main.cu -o "$BIN/main.o"
  nvcc -gencode=arch=compute_90a,code=sm_90a -o "$BIN/gqa_bench" "$BIN/main.o" "$BIN/stock.o" "$BIN/patched.o"
  rm -f "$BIN"/*.o
  exit 0
fi
OUT=${OUT:?set OUT to the output directory}
mkdir -p "$OUT"
timeout 240 "$BIN/gqa_bench" > "$OUT/gqa.txt"
