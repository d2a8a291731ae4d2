#!/usr/bin/env bash
# Issue 9: tune the L2 weight prefetch on the H200 and bench the pick, in one unattended run
# (<= 5 minutes). Writes $OUT/pf_sweep.tgz (everything) and $OUT/pf_sweep.txt (the summary).
#
#   OUT=$OUT bash scripts/gpu_pf_sweep.sh
#
# Needs: torch with CUDA, kvpatch's deps on PYTHONPATH (default /tmp/site), nvcc (the prefetch
# library is built here by kvpatch.prefetch.kernel.build_prefetch_library), and the attention
# libraries in $KVPATCH_LIBS_TXT (default /tmp/libs/libs.txt: NAME=PATH:PREFIX lines with
# 'stock' and 'patched', fp16+bf16, head 64 and 128, block 16).
# Stages (python -m kvpatch bench-decode-sweep, see its docstring): micro-benchmark of the prefetch
# kernel; stage 1 (one knob at a time) and stage 2 (caps) on Llama-3.1-8B bf16 batch 1/4/8 x
# ctx 1k/4k; the pick; the full decode bench with it (8B bf16+fp16, 1B bf16). Then the GPU tests
# if time is left. Every stage is cut by the budget (KVPATCH_SWEEP_BUDGET seconds, default 230).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the output directory}
mkdir -p "$OUT/pf_sweep"
D=$OUT/pf_sweep
PY=${PYTHON:-python3}
export PYTHONPATH=${PYTHONPATH:-/tmp/site}:$PWD
LIBS_TXT=${KVPATCH_LIBS_TXT:-/tmp/libs/libs.txt}
BUDGET=${KVPATCH_SWEEP_BUDGET:-230}
T0=$SECONDS
say() { echo "[gpu_pf_sweep +$((SECONDS - T0))s] $*" | tee -a "$D/log.txt"; }
finish() {
  local rc=$1
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv > "$D/smi_after.csv" 2>&1
  say "done in $((SECONDS - T0)) s, rc $rc"
  {
    echo "gpu_pf_sweep: rc $rc, $((SECONDS - T0)) s ($(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
    [[ -f $D/summary.txt ]] && cat "$D/summary.txt"
    for f in "$D"/decode_*_warm.txt; do [[ -f $f ]] && { echo; cat "$f"; }; done
    echo; tail -4 "$D/gpu_tests.txt" 2>/dev/null
    echo; tail -8 "$D/log.txt"
  } > "$OUT/pf_sweep.txt" 2>&1
  tar -czf "$OUT/pf_sweep.tgz" -C "$OUT" pf_sweep && rm -rf "$D"
  exit "$rc"
}
[[ -f $LIBS_TXT ]] || { say "missing $LIBS_TXT"; finish 2; }
# libs.txt paths may be relative to its folder
LIBS_ABS=$D/libs.txt
while IFS= read -r line; do
  [[ -z ${line// } || $line == \#* ]] && continue
  name=${line%%=*}; rest=${line#*=}; path=${rest%:*}; prefix=${rest##*:}
  if [[ $path != /* ]]; then  # relative: to the repo root if it is there, else to libs.txt's folder
    if [[ -f $path ]]; then path=$(realpath "$path"); else path=$(cd "$(dirname "$LIBS_TXT")" && realpath -m "$path"); fi
  fi
  echo "$name=$path:$prefix"
done < "$LIBS_TXT" > "$LIBS_ABS"
say "libraries: $(cut -d= -f1 "$LIBS_ABS" | paste -sd, -); budget $BUDGET s"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active --format=csv > "$D/smi_before.csv" 2>&1

say "prefetch library (nvcc)"
PF_LIB=$(timeout 120 "$PY" -c 'from kvpatch.prefetch.kernel import build_prefetch_library as b; print(b("9.0a"))' 2> "$D/build_prefetch.txt") \
  || { cat "$D/build_prefetch.txt" | tail -5 | tee -a "$D/log.txt"; finish 5; }
export KVPATCH_PREFETCH_LIB=$PF_LIB
cp "$(dirname "$PF_LIB")"/{result.json,ptxas.log,l2_prefetch.cu} "$D/" 2>/dev/null
say "prefetch library $PF_LIB"

rc=0
LEFT=$((280 - (SECONDS - T0)))
say "sweep + final bench (budget $BUDGET s, hard limit $LEFT s)"
timeout "$LEFT" "$PY" -m kvpatch bench-decode-sweep --libs-file "$LIBS_ABS" --out "$D" --budget "$BUDGET" --prefetch-lib "$PF_LIB" \
  > "$D/sweep_stdout.txt" 2> "$D/sweep_stderr.txt" || { rc=$?; say "sweep exit $rc"; tail -5 "$D/sweep_stderr.txt" | tee -a "$D/log.txt"; }
LEFT=$((290 - (SECONDS - T0)))
if (( LEFT > 25 )); then
  say "GPU tests ($LEFT s left)"
  export KVPATCH_TEST_LIBS=$(paste -sd, "$LIBS_ABS")
  timeout $((LEFT - 5)) "$PY" -m pytest -q -m gpu --noconftest -p no:cacheprovider tests/test_prefetch_gpu.py > "$D/gpu_tests.txt" 2>&1 || say "GPU tests exit $?"
else
  say "GPU tests skipped ($LEFT s left)"
fi
finish "$rc"
