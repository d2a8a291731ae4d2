#!/usr/bin/env bash
# One run on the GPU machine over other header revisions: per release, validate on
# the tuned instantiations (fp16/bf16 x head 64/128/256 x block 16/32 x auto/fp8, v1/v2, GQA/MHA,
# ALiBi on/off) and the held-out bench (stock vs patched, dispatched kernel, warm + cold, 20 reps x
# 3 rounds), into $OUT/<release>/.
#
#   scripts/gpu_releases.sh LIBROOT
#
# LIBROOT holds one folder per release, LIBROOT/<release>/libs, as built on the CPU machine by
#   scripts/gpu_prepare.py --vllm <release> --config TABLE.toml --out LIBROOT/<release>/libs \
#       --kernels tuned --no-small --no-tree
# Releases run in the order of RELEASES (default: every LIBROOT/<release>/libs, by name), each only
# while BUDGET seconds (default 560) leave NEED (default 130) for it. VALIDATE=0 / HELDOUT=0 leave
# that step out. AA=1: the held-out bench also times stock against itself (bench --aa, variant
# stock-aa: the method's own false verdicts at the same points). PACK=1: each release's folder
# becomes one file, OUT/<release>.tgz, as soon as that release is done (the device tool brings
# back only so many files, and a run cut part way keeps the releases it finished). OUT defaults
# to ./gpu-out. What a run writes is the raw data of benchmarks/evidence/ folders (heldout-six-releases/,
# bit-identity/); scripts/summarize_releases.py summarizes such a folder.
set -uo pipefail
LIBROOT=${1:?usage: scripts/gpu_releases.sh LIBROOT}
[[ -d "$LIBROOT" ]] || { echo "error: $LIBROOT is not a folder" >&2; exit 2; }
LIBROOT=$(cd "$LIBROOT" && pwd)
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 KVPATCH_CACHE=${KVPATCH_CACHE:-/tmp/kvc} PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
RELEASES=${RELEASES:-$(cd "$LIBROOT" && for d in */libs; do printf '%s ' "${d%/libs}"; done)}
T0=$SECONDS; BUDGET=${BUDGET:-560}; NEED=${NEED:-130}
UNPACK=${UNPACK:-/tmp/kvpatch-release-libs}
AA_FLAG=(); [[ "${AA:-0}" == 1 ]] && AA_FLAG=(--aa)
source scripts/lib_specs.sh
for v in $RELEASES; do
  left=$(( BUDGET - (SECONDS - T0) ))
  (( left < NEED )) && { echo "$v: skipped, $left s left"; continue; }
  L=$LIBROOT/$v/libs; R=$OUT/$v
  [[ -f $L/libs.txt ]] || { echo "error: $L/libs.txt not found" >&2; exit 2; }
  mkdir -p "$R"
  lib_specs "$L" "$UNPACK/$v"
  LIBS=()
  for spec in "${LIB_SPECS[@]}"; do LIBS+=(--lib "$spec"); done
  cp "$L/variants.json" "$R/"
  if [[ "${VALIDATE:-1}" == 1 ]]; then
    timeout 90 python3 -m kvpatch validate "${LIBS[@]}" --variant-info "$L/variants.json" --dtypes fp16,bf16 \
      --head-sizes 64,128,256 --block-sizes 16,32 --kv auto,fp8 --json "$R/validate.json" > "$R/validate.log" 2>&1
    echo "$v validate rc $? ($((SECONDS - T0)) s)"; tail -2 "$R/validate.log"
  fi
  if [[ "${HELDOUT:-1}" == 1 ]]; then
    LEFT=$(( BUDGET - (SECONDS - T0) - 5 )); (( LEFT > 150 )) && LEFT=150
    timeout $LEFT python3 -m kvpatch bench --set heldout "${LIBS[@]}" --variant-info "$L/variants.json" --kernels dispatched \
      --reps 20 --rounds 3 "${AA_FLAG[@]}" --json "$R/bench-heldout.json" > "$R/bench-heldout.log" 2>&1
    echo "$v heldout rc $? ($((SECONDS - T0)) s)"; grep -A12 "dispatched" "$R/bench-heldout.log" | head -14
  fi
  if [[ "${PACK:-0}" == 1 ]]; then
    tar czf "$OUT/$v.tgz.partial" -C "$OUT" "$v" && rm -rf "${R:?}" && mv "$OUT/$v.tgz.partial" "$OUT/$v.tgz" \
      || echo "error: packing $R failed" >&2
  fi
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv > "$OUT/nvidia-smi-end.csv" 2>&1
echo "total: $((SECONDS - T0)) s"
