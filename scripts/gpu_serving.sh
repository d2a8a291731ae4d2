#!/usr/bin/env bash
# vLLM serving with kvpatch's kernels against vLLM's own, on a GPU machine with torch 2.11
# (CUDA 13) and no network: vLLM 0.10.2's own Python and its own ops rebuilt for that torch,
# kvpatch installed from its wheel, the plugin enabled, then 'kvpatch plugin bench'.
# What is not vLLM's own code, and why it is off the measured path:
# scripts/serving_standins/README.md.
#
#   here (nvcc, no GPU):  bash scripts/gpu_serving.sh --prepare [--config kvpatch.toml]
#       fetches the release, builds vLLM's ops for torch 2.11 (scripts/vllm_ops.py; ~20 min on
#       two cores the first time), downloads the Python packages vLLM needs that the GPU
#       machine lacks, builds kvpatch's wheel and the plugin's bundle (kvpatch build --all;
#       cached; with --config, of that configuration, e.g. one with group = 4), and packs
#       all of it into .gpu/serving/carry (carry that folder).
#   GPU machine:          OUT=/some/dir bash scripts/gpu_serving.sh [--dtype bf16] [--budget S]
#                             [--resume RAW.tar.xz] [--smoke] [-- more 'kvpatch plugin bench' options]
#       installs the carry (once per machine), runs vLLM's own kernel tests on the rebuilt
#       ops, 'kvpatch plugin status --gpus', then the bench; its engine runs are kept in
#       /tmp/kvpatch-serving/raw-DTYPE-BUNDLE (BUNDLE: the carry's bundle digest), so a second
#       call with the same carry on the same machine resumes where a budget stopped the first.
#       $OUT/raw-DTYPE.tar.xz holds them too: --resume with that file goes on from it on a new
#       machine (with the carry whose bundle made them; another is refused). --smoke: one
#       engine start per arm, batch 1 and 64, 64 output tokens. --check: 'kvpatch plugin check'
#       in that environment (vLLM's own Python and rebuilt ops, the carry's bundle) instead of
#       the bench: $OUT/plugin-check.json and .txt, its exit code.
#       ALSO=NAME=CARRY2 (another carry made with --prepare, e.g. CARRY=.gpu/serving/carry-g4m):
#       its bundle is installed beside this carry's and timed as one more arm (--bundle NAME=...),
#       so two configurations read against each other in the same rounds.
#       WORKLOADS='IN:OUT:B,B ...' (space-separated; default 4096:256:8,32, '' for none): the bench's
#       --workload rows this script adds before the options after '--'.
#       OPS_TESTED=DIGEST (the first 16 hex digits of sha256 of the carry's _C.abi3.so.xz, which the
#       log prints): skip vLLM's kernel tests when the carry's ops are exactly those an earlier
#       machine tested (cite that run's record); any other digest runs them as usual.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
VERSION=0.10.2
CARRY=${CARRY:-.gpu/serving/carry}  # another CARRY keeps a second bundle (e.g. --config's) beside the default
WORK=.gpu/serving/work
# The Python packages vLLM 0.10.2 imports that the GPU machine's image lacks (cp312 wheels).
WHEELS=(pydantic==2.11.7 pydantic_core==2.33.2 annotated-types typing-inspection msgspec pyzmq cachetools cbor2
  setproctitle blake3 pybase64 fastapi==0.116.1 starlette==0.47.3 openai==1.107.0 jiter distro sniffio
  openai-harmony partial-json-parser gguf compressed-tensors==0.11.0 frozendict platformdirs)

if [[ ${1:-} == --prepare ]]; then
  set -e
  CONFIG=()  # --config FILE: the plugin's bundle built with this kvpatch.toml (default: kvpatch's default)
  if [[ ${2:-} == --config ]]; then
    [[ -f ${3:-} ]] || { echo "--config needs a kvpatch.toml" >&2; exit 2; }
    CONFIG=(--config "$(cd "$(dirname "$3")" && pwd)/$(basename "$3")")
  fi
  mkdir -p "$CARRY/wheels" "$WORK/dl"
  TREE=$("$PY" -c "from kvpatch.source.fetch import fetch_release; print(fetch_release('$VERSION'))")
  pipdl() { "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 "$@"; }
  if [[ ! -d $WORK/torch/torch/lib ]]; then  # torch 2.11's headers and libraries (the GPU machine's torch)
    pipdl -d "$WORK/dl" torch==2.11.0
    (cd "$WORK" && unzip -q -o dl/torch-2.11.0-*.whl 'torch/include/*' 'torch/lib/libc10.so' 'torch/lib/libc10_cuda.so' \
      'torch/lib/libtorch.so' 'torch/lib/libtorch_cpu.so' 'torch/lib/libtorch_cuda.so' -d torch)
  fi
  if [[ ! -d $WORK/cuinc ]]; then  # the cuBLAS/cuSOLVER/cuSPARSE headers torch's CUDA headers include
    pipdl -d "$WORK/dl" nvidia-cublas==13.1.0.3 nvidia-cusolver==12.0.4.66 nvidia-cusparse==12.6.3.3
    for w in "$WORK"/dl/nvidia_cu*.whl; do unzip -q -o "$w" '*/include/*' -d "$WORK/cuinc"; done
  fi
  "$PY" scripts/vllm_ops.py --tree "$TREE" --torch-include "$WORK/torch/torch/include" --torch-lib "$WORK/torch/torch/lib" \
    --extra-include "$WORK/cuinc/nvidia/cu13/include" --out "$WORK/ops"
  xz -T0 -6 -c "$WORK/ops/_C.abi3.so" > "$CARRY/_C.abi3.so.xz"
  cp "$WORK/ops/ops.json" "$CARRY/ops.json"
  rm -f "$CARRY"/wheels/*.whl
  pipdl -d "$CARRY/wheels" "${WHEELS[@]}"
  "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$CARRY/wheels" . 2>/dev/null \
    || "$PY" -m pip wheel -q --no-deps -w "$CARRY/wheels" .
  # vLLM's Python, its bindings (the plugin records the op schemas) and its kernel tests.
  tar -C "$TREE" -cJf "$CARRY/vllm-$VERSION.tar.xz" --exclude=__pycache__ vllm tests/__init__.py tests/kernels \
    csrc/torch_bindings.cpp PKG-INFO
  # The plugin's bundle: the patched kernels of vLLM's full set (kvpatch build --all, cached).
  mkdir -p "$WORK/ws"
  # --force: this scratch workspace is the script's own; a header an older kvpatch patched there is replaced
  (cd "$WORK/ws" && kvpatch apply --force --vllm "v$VERSION" "${CONFIG[@]}" >/dev/null \
    && kvpatch build --all --arch 9.0a >/dev/null && rm -rf bundle && kvpatch plugin enable --dir bundle >/dev/null)
  rm -rf "$CARRY/bundle" && mkdir -p "$CARRY/bundle"
  cp "$WORK/ws/bundle/bundle.json" "$CARRY/bundle/"
  for f in "$WORK"/ws/bundle/*.so; do xz -T0 -6 -c "$f" > "$CARRY/bundle/$(basename "$f").xz"; done
  du -sh "$CARRY"
  exit 0
fi

DTYPE=bf16
BUDGET=480
SMOKE=0
CHECK=0
RESUME=
EXTRA=()
WORKLOADS=${WORKLOADS-4096:256:8,32}
while [[ $# -gt 0 ]]; do
  case $1 in
    --dtype) DTYPE=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    --check) CHECK=1; shift ;;
    --resume) RESUME=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
OUT=${OUT:?set OUT to the output directory}
mkdir -p "$OUT"
T0=$SECONDS
say() { echo "[gpu_serving +$((SECONDS - T0))s] $*" | tee -a "$OUT/log.txt"; }
[[ -f $CARRY/_C.abi3.so.xz && -f $CARRY/bundle/bundle.json ]] || { say "missing $CARRY: run --prepare here and carry it"; exit 2; }
BASE=/tmp/kvpatch-serving
SITE=$BASE/site
SRC=$BASE/src
export PYTHONPATH=$SITE:$SRC KVPATCH_PLUGIN_DIR=$BASE/bundle VLLM_HOST_IP=127.0.0.1 PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
if [[ ! -f $BASE/installed ]]; then
  say "installing the carry"
  env -u PYTHONPATH "$PY" -c 'import importlib.metadata as m; print("image: typer", m.version("typer"), "click", m.version("click"))' 2>&1 | tail -1 | tee -a "$OUT/log.txt"
  rm -rf "$BASE" && mkdir -p "$SITE" "$SRC" "$BASE/bundle"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$CARRY"/wheels/*.whl || exit 3
  cp -r scripts/serving_standins/xformers "$SITE/"
  tar -C "$SRC" -xJf "$CARRY/vllm-$VERSION.tar.xz"
  xz -dc "$CARRY/_C.abi3.so.xz" > "$SRC/vllm/_C.abi3.so"
  mkdir -p "$SRC/vllm/vllm_flash_attn/layers"
  touch "$SRC/vllm/vllm_flash_attn/layers/__init__.py"
  cp scripts/serving_standins/rotary.py "$SRC/vllm/vllm_flash_attn/layers/rotary.py"
  mkdir -p "$SITE/vllm-$VERSION.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$VERSION" > "$SITE/vllm-$VERSION.dist-info/METADATA"
  touch "$BASE/installed"
fi
# install_bundle CARRY DEST: a carry's plugin bundle, unpacked into DEST (again only when it changed)
install_bundle() {
  cmp -s "$1/bundle/bundle.json" "$2/bundle.json" && return 0
  say "installing the plugin's bundle of $1 into $2"
  rm -rf "$2" && mkdir -p "$2"
  cp "$1/bundle/bundle.json" "$2/"
  for f in "$1"/bundle/*.xz; do xz -dc "$f" > "$2/$(basename "$f" .xz)"; done
}
install_bundle "$CARRY" "$BASE/bundle"  # this carry's bundle (CARRY may change)
OTHER=()  # ALSO's bundle, as the bench's --bundle
if [[ -n ${ALSO:-} ]]; then
  NAME=${ALSO%%=*}; OCARRY=${ALSO#*=}
  [[ $NAME != "$ALSO" && -f $OCARRY/bundle/bundle.json ]] || { say "ALSO=$ALSO: write NAME=CARRY, a carry made with --prepare"; exit 2; }
  install_bundle "$OCARRY" "$BASE/bundle-$NAME"
  OTHER=(--bundle "$NAME=$BASE/bundle-$NAME")
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv > "$OUT/smi.csv" 2>&1
cd "$BASE"
"$PY" -c 'import torch, vllm, kvpatch, typer, importlib.metadata as m; print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), "| vllm", vllm.__version__, "| kvpatch", kvpatch.__version__, kvpatch.__file__, "| typer", typer.__version__, "| click", m.version("click"))' 2>&1 | tail -1 | tee -a "$OUT/log.txt"

OPS_DIGEST=$(cd "$ROOT" && sha256sum "$CARRY/_C.abi3.so.xz" | cut -c1-16)
say "the carry's rebuilt ops: _C.abi3.so.xz $OPS_DIGEST"
if [[ ! -f $BASE/ops-tested && ${OPS_TESTED:-} == "$OPS_DIGEST" ]]; then
  say "vLLM's kernel tests skipped: OPS_TESTED names these very ops (an earlier run's record of them passing belongs in the evidence)"
  touch "$BASE/ops-tested"
fi
if [[ ! -f $BASE/ops-tested ]]; then
  # three pytest workers fit an H200's memory; on an H100's 80 GB three of them ran one of
  # test_copy_blocks' fp32 cases out of memory (two were not tried): one worker there
  GIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  WORKERS=$(( ${GIB:-0} >= 120000 ? 3 : 1 ))
  say "vLLM's own kernel tests on the rebuilt ops ($WORKERS pytest workers)"
  (cd "$SRC" && timeout 240 "$PY" -m pytest -q -x -p no:cacheprovider -n "$WORKERS" --junitxml="$OUT/ops-tests.xml" \
    tests/kernels/core/test_layernorm.py::test_rms_norm tests/kernels/core/test_activation.py::test_act_and_mul \
    tests/kernels/core/test_pos_encoding.py::test_rotary_embedding \
    tests/kernels/attention/test_cache.py::test_reshape_and_cache tests/kernels/attention/test_cache.py::test_copy_blocks \
    tests/kernels/test_apply_repetition_penalties.py > "$OUT/ops-tests.txt" 2>&1)
  rc=$?
  tail -3 "$OUT/ops-tests.txt" | tee -a "$OUT/log.txt"
  if [[ $rc == 124 ]]; then
    say "vLLM's kernel tests ran out of their 240 s with no failure so far (see ops-tests.xml); going on"
  elif [[ $rc != 0 ]]; then
    say "the rebuilt ops failed vLLM's own tests (rc=$rc)"; exit 6
  fi
  touch "$BASE/ops-tested"
fi

say "kvpatch plugin status --gpus"
"$PY" -m kvpatch plugin status --gpus 2>&1 | tee "$OUT/status.txt" | tail -4

if [[ $CHECK == 1 ]]; then
  say "kvpatch plugin check"
  "$PY" -m kvpatch plugin check --json "$OUT/plugin-check.json" > "$OUT/plugin-check.txt" 2>&1
  rc=$?
  grep -v -e '^INFO' -e '^ ' "$OUT/plugin-check.txt" | tail -12
  say "done (rc=$rc)"
  exit $rc
fi

# one folder per dtype and bundle: a rerun with the same carry resumes, another carry starts its own
BUNDLE_ID=$(cd "$ROOT" && sha256sum "$CARRY/bundle/bundle.json" | cut -c1-16)
[[ -n ${ALSO:-} ]] && BUNDLE_ID=$BUNDLE_ID-$NAME-$(cd "$ROOT" && sha256sum "$OCARRY/bundle/bundle.json" | cut -c1-16)
RAW=$BASE/raw-$DTYPE-$BUNDLE_ID
if [[ -n $RESUME && ! -d $RAW ]]; then  # engine runs of an earlier machine
  [[ $RESUME == /* ]] || RESUME=$ROOT/$RESUME
  mkdir -p "$RAW" && tar -C "$RAW" -xJf "$RESUME" || exit 2
fi
# one bundle per --raw folder: its starts resumed with other kernels would mix two configurations
mkdir -p "$RAW"
if [[ -f $RAW/bundle.sha256 && $(cat "$RAW/bundle.sha256") != "$BUNDLE_ID" ]]; then
  say "--resume $RESUME holds engine runs of another plugin bundle ($(cat "$RAW/bundle.sha256"); this carry's: $BUNDLE_ID): resume them with the carry that made them"
  exit 2
fi
echo "$BUNDLE_ID" > "$RAW/bundle.sha256"
ARGS=(--dtype "$DTYPE" --raw "$RAW" --budget "$BUDGET" --json "$OUT/serving-$DTYPE.json" "${OTHER[@]}")
if [[ $SMOKE == 1 ]]; then
  RAW=$BASE/smoke-$DTYPE
  ARGS=(--dtype "$DTYPE" --raw "$RAW" --starts 1 --batch-sizes 1,64 --output-len 64 --json "$OUT/smoke-$DTYPE.json" "${OTHER[@]}")
else
  for w in $WORKLOADS; do ARGS+=(--workload "$w"); done
fi
say "kvpatch plugin bench ${ARGS[*]} ${EXTRA[*]}"
"$PY" -m kvpatch plugin bench "${ARGS[@]}" "${EXTRA[@]}" > "$OUT/bench-$DTYPE.txt" 2> "$OUT/bench-$DTYPE.err"
rc=$?
tail -40 "$OUT/bench-$DTYPE.txt"
tail -5 "$OUT/bench-$DTYPE.err"
tar -C "$RAW" -cJf "$OUT/raw-$DTYPE.tar.xz" . 2>/dev/null
say "done (rc=$rc)"
exit $rc
