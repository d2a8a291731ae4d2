#!/usr/bin/env bash
# The weight prefetch on the decode step, one GPU run: `kvpatch bench-decode-sweep` (see
# kvpatch/decode/sweep.py) with every stage, results packed into $OUT/decode-run.tgz, a short
# summary printed last.
#
#   here (CPU, nvcc 13.0):  bash scripts/gpu_decode.sh --prepare
#       builds, for bf16, head sizes 64 and 128 (Llama-3.2-1B, Llama-3.1-8B), block 16, sm_90a,
#       the attention libraries stock, patched (the default KV prefetch) and tail (stock + the
#       in-kernel weight prefetch, weight_tail), and the weight-prefetch kernel with its demote
#       mode, into $KVPATCH_DECODE_DIR (default .gpu/decode), xz-compressed (~1.2 MB in all).
#       The same nvcc as the H200's gives the same SASS. .gpu/ is git-ignored: the device call
#       names it in `carry` (.gpu/decode).
#   GPU machine:  OUT=/some/dir bash scripts/gpu_decode.sh      (~3-7 minutes on an H200)
#   GPU machine:  OUT=/some/dir bash scripts/gpu_decode.sh --confirm
#       instead of the sweep: bench-decode with the default windows and every control on shapes
#       the sweep never saw (bf16, batch 2 and 6, context 2k and 8k; ~1 minute)
#   GPU machine:  OUT=/some/dir bash scripts/gpu_decode.sh --heldout
#       the same on models the sweep never saw (Llama-3.2-3B, Qwen2.5-7B; bf16, batch 1, 4 and 8,
#       context 1k and 4k), the in-kernel form and its zero-byte twin included (~1 minute)
#
# Stages, most important first, each cut at its share of KVPATCH_DECODE_BUDGET (default 420 s):
# lead (the default windows with every control: A/A twin, zero-byte arm, the in-kernel form and
# its side-stream twin, patched), micro (GEMM after an idle kernel, clean flush), kernels (each
# window's GEMM and window kernels with vs without its prefetch), steps (each window alone in the
# step), final (the pick with every control, 7 rounds), guard_off (what the evict_last guard
# prevents). The archive is rewritten every 20 s while the run goes on and on TERM/INT, so a run
# cut short keeps what finished ($OUT holds decode-run.tgz and, at the end, summary.txt). No GPU tests (they take longer than this run can spare).
#
# Environment: OUT (required on the GPU), KVPATCH_DECODE_DIR, KVPATCH_DECODE_BUDGET (seconds for
# the stages), KVPATCH_DECODE_STAGES (a comma list, default all), PYTHON (python3).
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${KVPATCH_DECODE_DIR:-.gpu/decode}
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

if [[ ${1:-} == --prepare ]]; then
    rm -rf "$DIR" && mkdir -p "$DIR" || exit 2
    "$PY" - "$DIR" <<'PYEOF' || exit 5
import sys
from kvpatch.commands.decode_libs import prepare
prepare(sys.argv[1], progress=print)
PYEOF
    du -sh "$DIR" && cat "$DIR/libs.txt"
    exit 0
fi

OUT=${OUT:?set OUT to the output directory}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
BUDGET=${KVPATCH_DECODE_BUDGET:-420}
# the work folder stays outside $OUT: only decode-run.tgz and summary.txt come back (the device
# tool returns at most 8 files)
WORK=${TMPDIR:-/tmp}/kvpatch-decode-run
RUN=$WORK/decode-run
rm -rf "$WORK" "$OUT/decode-run.tgz" "$OUT/summary.txt" && mkdir -p "$RUN"
T0=$SECONDS
say() { echo "[gpu_decode +$((SECONDS - T0))s] $*" | tee -a "$RUN/log.txt"; }
pack() {  # everything under $RUN into one archive, atomically
    tar czf "$WORK/decode-run.tgz.tmp" -C "$WORK" decode-run 2>/dev/null && mv -f "$WORK/decode-run.tgz.tmp" "$OUT/decode-run.tgz"
}
PID=""
stop() {
    trap - TERM INT
    say "stopped by a signal: packing what finished (not a complete run)"
    [[ -n $PID ]] && kill -TERM "$PID" 2>/dev/null && sleep 2
    pack
    exit 143
}
trap stop TERM INT

[[ -f $DIR/libs.txt ]] || { say "missing $DIR/libs.txt: run 'bash scripts/gpu_decode.sh --prepare' where nvcc is, and carry $DIR"; pack; exit 2; }
LIBS=${TMPDIR:-/tmp}/kvpatch-decode-libs
"$PY" - "$DIR" "$LIBS" <<'PYEOF' 2>&1 | tee -a "$RUN/log.txt" || { say "unpacking the libraries failed"; pack; exit 2; }
import sys
from pathlib import Path
from kvpatch.decode.prepare import unpack
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
files = unpack(src, dst)
lines = []
for line in (src / "libs.txt").read_text().splitlines():
    if line.strip() and not line.startswith("#"):
        name, _, rest = line.partition("=")
        file, _, prefix = rest.rpartition(":")
        lines.append(f"{name}={files[file]}:{prefix}")
(dst / "libs.txt").write_text("\n".join(lines) + "\n")
print("libraries:", ", ".join(lines))
PYEOF
cp "$DIR"/{variants.json,build.json} "$RUN/" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active \
    --format=csv > "$RUN/smi_before.csv" 2>&1
"$PY" -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name())' 2>&1 | tee -a "$RUN/log.txt"
STAGES=()
[[ -n ${KVPATCH_DECODE_STAGES:-} ]] && STAGES=(--stages "$KVPATCH_DECODE_STAGES")

if [[ ${1:-} == --confirm || ${1:-} == --heldout ]]; then
    if [[ $1 == --confirm ]]; then
        NAME=confirm; SHAPES=(--models llama-3.1-8b,llama-3.2-1b --batches 2,6 --contexts 2048,8192)
    else
        NAME=heldout; SHAPES=(--models llama-3.2-3b,qwen2.5-7b --batches 1,4,8 --contexts 1024,4096 --tail 8:32@evict_normal)
    fi
    say "bench-decode, default windows, held-out shapes ($NAME)"
    PYTHONUNBUFFERED=1 timeout --signal=TERM 240 "$PY" -m kvpatch bench-decode --libs-file "$LIBS/libs.txt" \
        --prefetch-lib "$LIBS/libkvpatch_l2_prefetch.so" --dtypes bf16 "${SHAPES[@]}" \
        --json "$RUN/decode_$NAME.json" --text "$RUN/decode_$NAME.txt" \
        > "$RUN/${NAME}_stdout.txt" 2> "$RUN/${NAME}_stderr.txt"
    RC=$?
    say "done in $((SECONDS - T0)) s, rc $RC"
    pack
    tail -30 "$RUN/decode_$NAME.txt" 2>/dev/null || tail -15 "$RUN/${NAME}_stderr.txt"
    exit "$RC"
fi

say "bench-decode-sweep, budget $BUDGET s"
export PYTHONUNBUFFERED=1
timeout --signal=TERM $((BUDGET + 120)) "$PY" -m kvpatch bench-decode-sweep --libs-file "$LIBS/libs.txt" \
    --prefetch-lib "$LIBS/libkvpatch_l2_prefetch.so" --out "$RUN" --budget "$BUDGET" "${STAGES[@]}" \
    > "$RUN/sweep_stdout.txt" 2> "$RUN/sweep_stderr.txt" &
PID=$!
n=0
while kill -0 "$PID" 2>/dev/null; do
    sleep 2
    n=$((n + 1))
    if (( n % 10 == 0 )); then
        pack
        tail -1 "$RUN/sweep_stderr.txt" 2>/dev/null | cut -c1-200
    fi
done
wait "$PID"; RC=$?
PID=""
[[ $RC -ne 0 ]] && { say "bench-decode-sweep exit $RC"; tail -5 "$RUN/sweep_stderr.txt" | tee -a "$RUN/log.txt"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv > "$RUN/smi_after.csv" 2>&1
say "done in $((SECONDS - T0)) s, rc $RC"
pack
echo
if [[ -f $RUN/summary.txt ]]; then
    cp "$RUN/summary.txt" "$OUT/summary.txt"
    cat "$RUN/summary.txt"
else
    echo "no summary (the sweep did not finish): the last lines of its log:"
    tail -15 "$RUN/sweep_stderr.txt" 2>/dev/null
fi
exit "$RC"
