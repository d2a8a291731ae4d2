#!/usr/bin/env bash
# The weight-prefetch sweep without the lead bench: stages kernels, steps and final of
# `kvpatch bench-decode-sweep` (kvpatch/decode/sweep.py), on what `bash scripts/gpu_decode.sh
# --prepare` built; everything else as scripts/gpu_decode.sh (results in $OUT/decode-run.tgz,
# the summary last).
#
#   OUT=$OUT bash scripts/gpu_pf_sweep.sh
#
# KVPATCH_DECODE_STAGES overrides the stages (lead,micro,kernels,steps,final,guard_off).
exec env KVPATCH_DECODE_STAGES="${KVPATCH_DECODE_STAGES:-kernels,steps,final}" bash "$(dirname "$0")/gpu_decode.sh" "$@"
