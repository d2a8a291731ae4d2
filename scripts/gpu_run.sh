#!/usr/bin/env bash
# One run on the GPU machine: validate --full, validate --upstream, bench --set headline and
# bench --set heldout on prebuilt libraries, JSON + plots into $OUT, summaries printed last.
#
#   scripts/gpu_run.sh [LIBDIR] [STAGES]
#
# LIBDIR  (default .gpu/libs) holds what scripts/gpu_prepare.py writes on the CPU machine:
#         libs.txt (NAME=FILE.so:PREFIX per line, FILE relative to LIBDIR; FILE.so.xz is
#         unpacked to $UNPACK first), variants.json (each variant's marker and
#         compile flags), and beside it the release files in ../vllm-X (TREE overrides).
# STAGES  comma list of: full, upstream, headline, heldout (default: all four), decode (kvpatch
#         bench-decode over the HELDOUT_NAMES libraries: the model-shaped decode step, Llama-3.1-8B and
#         -3.2-1B, fp16 and bf16, weight prefetch off; needs their head-64/128 block-16 kernels, e.g.
#         gpu_prepare.py --kernels tuned), or tune (alone: LIBDIR from `gpu_prepare.py --tune`;
#         writes $OUT/kvpatch.toml and tune.json).
#         The first two run at the same time (upstream is pytest on the CPU cores; full is one
#         process); the benches run alone afterwards, so nothing else shares the GPU.
#
# Environment: OUT (default ./gpu-out), TREE (the vLLM release files), PYTHON (python3),
# WORKERS (pytest-xdist workers for upstream, in all; default 8), UPSTREAM_SHARD (K/N: validate
# --upstream-shard, the K-th of N shares of vLLM's test cases, for a test too long for one call),
# UPSTREAM_TIMEOUT (seconds: validate --upstream-timeout; at the limit pytest is interrupted and the
# report counts what finished, marked cut),
# HEADLINE_REPS / HELDOUT_REPS (50 / 30), ROUNDS (3), HEADLINE_KERNELS (v1,v2 or dispatched),
# HELDOUT_NAMES (the libraries the held-out bench and the decode stage compare; default stock,patched), DECODE_ROUNDS (5),
# TUNE_REPS (20), TUNE_DTYPES (tune --dtype: e.g. fp16; default every tuned dtype), TUNE_ONLY (tune --only, comma-separated: e.g. fp16/128/16,fp16/256/16), TUNE_QUICK=1 (tune --quick: 144 of the 324 tuning points), TUNE_INCUMBENT (tune --incumbent NAME: a library built by gpu_prepare.py --tune --incumbent NAME),
# AA=1 (both benches also time stock against itself: bench --aa, variant stock-aa),
# UNPACK (where .so.xz libraries are unpacked; default /tmp/kvpatch-libs: never under OUT, whose
# files the device tool brings back), PACK=1 (end with OUT holding one file, gpu-run.tgz, of all
# the results, less upstream/run, vLLM's test files as it ran them: the device tool brings back
# at most 8 files, and a run writes more; also when the run is stopped by TERM or INT, e.g. an
# outer timeout: it then exits 143 with what finished packed).
# Budget on an H200 (16 cores): upstream ~3 min beside full ~1 min; headline ~1.5 min
# (4 variants, both kernels); heldout ~2.5 min (stock + patched, dispatched kernel only).
set -uo pipefail
# a LIBDIR given relative to where this was started, before the cd to the checkout
[[ -n "${1:-}" && -d "$1" ]] && set -- "$(cd "$1" && pwd)" "${@:2}"
[[ -n "${OUT:-}" && "$OUT" != /* ]] && OUT="$PWD/$OUT"
cd "$(dirname "$0")/.."

LIBDIR=${1:-.gpu/libs}
STAGES=${2:-full,upstream,headline,heldout}
for s in ${STAGES//,/ }; do
    case "$s" in full|upstream|headline|heldout|decode|tune) ;;
        *) echo "error: unknown stage '$s' (full, upstream, headline, heldout, decode, tune)" >&2; exit 2 ;;
    esac
done
OUT=${OUT:-./gpu-out}
PY=${PYTHON:-python3}
ROUNDS=${ROUNDS:-3}
HEADLINE_REPS=${HEADLINE_REPS:-50}
HELDOUT_REPS=${HELDOUT_REPS:-30}
HEADLINE_KERNELS=${HEADLINE_KERNELS:-v1,v2}
HELDOUT_NAMES=${HELDOUT_NAMES:-stock,patched}
AA_FLAG=(); [[ "${AA:-0}" == 1 ]] && AA_FLAG=(--aa)
NPROC=$(nproc 2>/dev/null || echo 4)
# 8 in all (4 per library, both at once): 14 ran the H200 out of memory (vLLM's test
# allocates caches of several GiB per worker); expandable segments cut fragmentation.
WORKERS=${WORKERS:-$(( NPROC > 9 ? 8 : (NPROC > 3 ? NPROC - 2 : 1) ))}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# this run's stages write afresh: no earlier run's results are summarised as this one's
has() { [[ ",$STAGES," == *",$1,"* ]]; }
has full && rm -f "$OUT/validate-full.json" "$OUT/validate-full.log"
has upstream && rm -f "$OUT/upstream.json" "$OUT/upstream.log"
has headline && rm -f "$OUT/bench-headline.json" "$OUT/bench-headline.png" "$OUT/bench-headline.log"
has heldout && rm -f "$OUT/bench-heldout.json" "$OUT/bench-heldout.png" "$OUT/bench-heldout.log"
has tune && rm -f "$OUT/kvpatch.toml" "$OUT/tune.json" "$OUT/tune.json.gz" "$OUT/tune.log"
has decode && rm -f "$OUT/bench-decode.json" "$OUT/bench-decode.txt" "$OUT/bench-decode.log"
T0=$(date +%s)
say() { printf '[%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*" >&2; }
# PACK=1: everything under OUT into one archive, OUT/gpu-run.tgz (also when stopped by a signal,
# e.g. an outer `timeout`: what finished is kept, not left to the device tool's file limit), less
# upstream/run: the copy of vLLM's test files that validate --upstream ran (vLLM source, not a
# result; TREE has them)
pack() {
    [[ "${PACK:-0}" == 1 ]] || return 0
    tar czf "$OUT/../gpu-run.tgz.partial" --exclude=./upstream/run -C "$OUT" . && rm -rf "${OUT:?}"/* && mv "$OUT/../gpu-run.tgz.partial" "$OUT/gpu-run.tgz" \
        || { echo "error: packing $OUT failed" >&2; return 1; }
}
trap 'trap - TERM INT; say "stopped by a signal: packing what finished (not a complete run)"; pack; exit 143' TERM INT

# ---------------------------------------------------------------- preflight
if [[ ! -f "$LIBDIR/libs.txt" ]]; then
    echo "error: $LIBDIR/libs.txt not found (build it here with: python scripts/gpu_prepare.py --out $LIBDIR)" >&2
    exit 2
fi
if [[ -z "${TREE:-}" ]]; then
    TREE=$(ls -d "$LIBDIR"/../vllm-* 2>/dev/null | head -1)
fi
$PY - <<'EOF' || exit 2
import importlib.util, sys
missing = [m for m in ("torch", "typer", "rich", "jinja2") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"error: missing Python packages: {', '.join(missing)}")
import torch
if not torch.cuda.is_available():
    sys.exit(f"error: torch {torch.__version__} sees no CUDA GPU")
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on {torch.cuda.get_device_name(0)}; "
      f"pytest-xdist: {'yes' if importlib.util.find_spec('xdist') else 'no'}; "
      f"matplotlib: {'yes' if importlib.util.find_spec('matplotlib') else 'no (no plots)'}", file=sys.stderr)
EOF
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active \
    --format=csv > "$OUT/nvidia-smi-start.csv" 2>&1 || true

# unpack and list the libraries: ALL (every line), PAIR (stock + patched: the full kernel set)
source scripts/lib_specs.sh
lib_specs "$LIBDIR" "${UNPACK:-${TMPDIR:-/tmp}/kvpatch-libs}"
ALL=()
PAIR=()
HELD=()
for spec in "${LIB_SPECS[@]}"; do
    name=${spec%%=*}
    ALL+=(--lib "$spec")
    [[ "$name" == stock || "$name" == patched ]] && PAIR+=(--lib "$spec")
    [[ ",$HELDOUT_NAMES," == *",$name,"* ]] && HELD+=(--lib "$spec")
done
INFO=()
[[ -f "$LIBDIR/variants.json" ]] && INFO=(--variant-info "$LIBDIR/variants.json")
TREEOPT=()
[[ -n "$TREE" ]] && TREEOPT=(--tree "$TREE")
say "libraries: ${ALL[*]}"
say "tree: ${TREE:-none}; out: $OUT"

KV=("$PY" -m kvpatch)
RC=0

# ---------------------------------------------------------------- correctness (concurrent)
UP_PID=""
if has upstream; then
    if [[ -z "$TREE" ]]; then
        say "upstream: no release tree (TREE) -- skipped"
    else
        say "upstream: vLLM's test_paged_attention x {stock, patched}, $WORKERS workers"
        "${KV[@]}" validate --no-matrix --upstream "${TREEOPT[@]}" "${PAIR[@]}" "${INFO[@]}" \
            --upstream-dir "$OUT/upstream" --workers "$WORKERS" --json "$OUT/upstream.json" \
            ${UPSTREAM_SHARD:+--upstream-shard "$UPSTREAM_SHARD"} ${UPSTREAM_TIMEOUT:+--upstream-timeout "$UPSTREAM_TIMEOUT"} \
            > "$OUT/upstream.log" 2>&1 &
        UP_PID=$!
    fi
fi
if has full; then
    say "validate --full (stock vs patched, every instantiation vLLM builds)"
    "${KV[@]}" validate --full "${TREEOPT[@]}" "${PAIR[@]}" "${INFO[@]}" --json "$OUT/validate-full.json" \
        > "$OUT/validate-full.log" 2>&1
    rc=$?; [[ $rc -ne 0 ]] && RC=$rc
    say "validate --full: rc $rc"
fi
if [[ -n "$UP_PID" ]]; then
    wait "$UP_PID"
    rc=$?; [[ $rc -ne 0 ]] && RC=$rc
    say "upstream: rc $rc"
fi

# ---------------------------------------------------------------- tune (alone on the GPU)
if has tune; then
    QUICK=(); [[ "${TUNE_QUICK:-0}" == 1 ]] && QUICK=(--quick)
    TD=${TUNE_DTYPES:-}; for d in ${TD//,/ }; do QUICK+=(--dtype "$d"); done
    TO=${TUNE_ONLY:-}; for d in ${TO//,/ }; do QUICK+=(--only "$d"); done
    [[ -n "${TUNE_INCUMBENT:-}" ]] && QUICK+=(--incumbent "$TUNE_INCUMBENT")
    say "tune: $(( ${#ALL[@]} / 2 )) libraries (stock + candidates), validate per kernel, bench the tuning set"
    "${KV[@]}" tune "${ALL[@]}" "${INFO[@]}" "${QUICK[@]}" --reps "${TUNE_REPS:-20}" --rounds "$ROUNDS" \
        -o "$OUT/kvpatch.toml" --json "$OUT/tune.json" > "$OUT/tune.log" 2>&1
    rc=$?; [[ $rc -ne 0 ]] && RC=$rc
    say "tune: rc $rc"
    gzip -f "$OUT/tune.json" 2>/dev/null || true
fi

# ---------------------------------------------------------------- timing (alone on the GPU)
PLOT_OK=$($PY -c "import importlib.util; print(int(importlib.util.find_spec('matplotlib') is not None))")
plot() { [[ "$PLOT_OK" == 1 ]] && echo "--plot" "$1"; }
if has headline; then
    say "bench --set headline (all variants, kernels $HEADLINE_KERNELS, warm + cold)"
    "${KV[@]}" bench --set headline "${ALL[@]}" "${INFO[@]}" --kernels "$HEADLINE_KERNELS" --reps "$HEADLINE_REPS" --rounds "$ROUNDS" \
        "${AA_FLAG[@]}" --json "$OUT/bench-headline.json" $(plot "$OUT/bench-headline.png") > "$OUT/bench-headline.log" 2>&1
    rc=$?; [[ $rc -ne 0 ]] && RC=$rc
    say "headline: rc $rc"
fi
if has heldout; then
    say "bench --set heldout ($HELDOUT_NAMES, the dispatched kernel, warm + cold)"
    "${KV[@]}" bench --set heldout "${HELD[@]}" "${INFO[@]}" --kernels dispatched --reps "$HELDOUT_REPS" \
        --rounds "$ROUNDS" "${AA_FLAG[@]}" --json "$OUT/bench-heldout.json" $(plot "$OUT/bench-heldout.png") \
        > "$OUT/bench-heldout.log" 2>&1
    rc=$?; [[ $rc -ne 0 ]] && RC=$rc
    say "heldout: rc $rc"
fi
if has decode; then
    say "bench-decode ($HELDOUT_NAMES: Llama-3.1-8B and -3.2-1B shapes, fp16 + bf16, 8 layers, weight prefetch off)"
    "${KV[@]}" bench-decode "${HELD[@]}" --models llama-3.1-8b,llama-3.2-1b --dtypes bf16,fp16 --layers 8 \
        --rounds "${DECODE_ROUNDS:-5}" --cap off --json "$OUT/bench-decode.json" --text "$OUT/bench-decode.txt" \
        > "$OUT/bench-decode.log" 2>&1
    rc=$?; [[ $rc -ne 0 ]] && RC=$rc
    say "decode: rc $rc"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv > "$OUT/nvidia-smi-end.csv" 2>&1 || true

# ---------------------------------------------------------------- summaries
$PY - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]

def load(name):
    p = os.path.join(out, name)
    if not os.path.isfile(p):
        return None
    with open(p) as f:
        return json.load(f)

v = load("validate-full.json")
if v:
    c = v["counts"]
    print(f"== validate --full: {c['cases']} configurations: {c['passed']} passed, {c['failed']} failed, "
          f"{c['skipped']} skipped; identical {v['identical']}; worst ref error {v['max_ref_error']}")
    for k, n in sorted(v.get("mismatch_groups", {}).items()):
        print(f"   mismatch  {k}: {n}")
    for s in v.get("skipped", [])[:5]:
        print(f"   skipped   {s}")
u = load("upstream.json")
if u and "upstream" in u:
    u = u["upstream"]
    print(f"== validate --upstream: {u['test_id']} ({u['seconds']:.0f} s), ok={u['ok']}")
    for r in u["runs"]:
        print(f"   {r['name']:8s} passed {r['passed']} failed {r['failed']} skipped {r['skipped']} "
              f"errors {r['errors']} outputs {r['outputs']} rc {r['returncode']}")
    for name, c in u["identical"].items():
        print(f"   {name}: {c['identical']}/{c['compared']} outputs == {u['baseline']} bit for bit")
        for k in u["differing"].get(name, [])[:10]:
            print(f"      differs: {k}")
    for n in u["notes"][:5]:
        print(f"   note: {n}")
for name in ("bench-headline.json", "bench-heldout.json"):
    b = load(name)
    if not b:
        continue
    print(f"== bench {b['point_set']}: {len(b['results'])} results, {b['seconds']:.0f} s, "
          f"{b['flagged_rounds']}/{len(b['rounds'])} rounds power-capped/throttled, "
          f"{len(b['mismatches'])} mismatches, {len(b['skipped_points'])} points skipped")
    lead = (b.get("settings") or {}).get("lead")
    if lead:
        print(f"   timing: {lead['chunks']} chunks, {lead['retried']} timed again, {lead['host_bound']} host-bound")
    print(f"   {'variant':9s} {'dtype':5s} {'mode':5s} {'n':>3s} {'min':>5s} {'median':>6s} {'geomean':>7s} "
          f"{'faster':>6s} {'noise':>5s} {'slower':>6s} {'of them on stock code':>21s}")
    for r in b["summary"]:
        if r["scope"] == "dispatched":
            sc = r.get("slower_stock_code")
            print(f"   {r['variant']:9s} {r['dtype']:5s} {r['mode']:5s} {r['n']:3d} {r['min']:5.2f} {r['median']:6.2f} "
                  f"{r['geomean']:7.2f} {r['faster']:6d} {r['noise']:5d} {r['slower']:6d} {'?' if sc is None else sc:>21}")
    if b["point_set"] == "heldout":
        slow = {}
        for r in b["results"]:
            t = r["variants"].get("patched")
            if t and r["dispatched"] and t["verdict"] == "slower":
                key = f"{r['point']['dtype']} {r['mode']} {r['point']['num_heads']}/{r['point']['num_kv_heads']} " \
                      f"h{r['point']['head_size']} b{r['point']['block_size']} {r['point']['kv_cache_dtype']}"
                slow.setdefault(key, []).append(f"B{r['point']['batch']}/{r['point']['context']}:{t['speedup']:.2f}")
        for k, pts in sorted(slow.items()):
            print(f"   slower: {k}: {' '.join(pts)}")
EOF
if has decode && [[ -f "$OUT/bench-decode.txt" ]]; then
    echo "== bench-decode ($OUT/bench-decode.txt)"
    cat "$OUT/bench-decode.txt"
fi
if has tune && [[ -f "$OUT/tune.log" ]]; then
    echo "== tune (the end of tune.log; the table: $OUT/kvpatch.toml)"
    tail -n 40 "$OUT/tune.log"
fi
trap - TERM INT
pack || RC=1  # PACK=1: one archive of everything this run wrote (logs, JSON, plots, upstream/ records)
say "done: rc $RC; files in $OUT"
ls -la "$OUT" >&2
exit $RC
