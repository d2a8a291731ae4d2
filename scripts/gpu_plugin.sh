#!/usr/bin/env bash
# The vLLM plugin on the GPU machine: the plugin's GPU tests, then vLLM 0.10.2's own Python
# with the plugin ('kvpatch plugin status' and 'kvpatch plugin check' as a user runs them, and
# vLLM's own test_paged_attention through the real vllm._custom_ops, with and without
# KVPATCH_DISABLE=1). Everything it writes goes to $OUT.
#
#   here (CPU, nvcc):  bash scripts/gpu_plugin.sh --prepare
#       builds stock and patched libraries of vLLM 0.10.2 for sm_90a into .gpu/plugin-libs
#       (same nvcc 13.0 as the H200: same SASS) and copies the release's Python, its
#       torch_bindings.cpp and its kernel tests into .gpu/vllm-0.10.2 (ignored by git:
#       carry '.gpu').
#   GPU machine:       OUT=/some/dir bash scripts/gpu_plugin.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERSION=0.10.2
LIBS=.gpu/plugin-libs
TREE=.gpu/vllm-$VERSION
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

if [[ ${1:-} == --prepare ]]; then
  "$PY" tests/vllm_plugin/test_plugin_gpu.py build "$LIBS" || exit 5
  "$PY" - "$VERSION" "$TREE" <<'PYEOF' || exit 3
import shutil, sys
from pathlib import Path
from kvpatch.source.fetch import fetch_release
src, dest = fetch_release(sys.argv[1]), Path(sys.argv[2])
shutil.rmtree(dest, ignore_errors=True)
shutil.copytree(src / "vllm", dest / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
shutil.copytree(src / "tests" / "kernels", dest / "tests" / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
for rel in ("tests/__init__.py", "csrc/torch_bindings.cpp", "PKG-INFO"):
    (dest / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / rel, dest / rel)
print(f"{dest} (vLLM {sys.argv[1]}'s Python, bindings and kernel tests)")
PYEOF
  du -sh .gpu
  exit 0
fi

OUT=${OUT:?set OUT to the output directory}
mkdir -p "$OUT"
T0=$SECONDS
say() { echo "[gpu_plugin +$((SECONDS - T0))s] $*" | tee -a "$OUT/log.txt"; }
[[ -f $LIBS/libs.json && -d $TREE/vllm ]] || { say "missing $LIBS or $TREE: run --prepare here and carry .gpu"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv > "$OUT/smi.csv" 2>&1
"$PY" -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name())' 2>&1 | tee -a "$OUT/log.txt"

export KVPATCH_PLUGIN_GPU_LIBS=$PWD/$LIBS KVPATCH_TEST_VLLM_TREE=$PWD/$TREE KVPATCH_TEST_OUT=$OUT/vllm
mkdir -p "$OUT/vllm"
say "plugin GPU tests (stand-in ops) and vLLM $VERSION's own Python with the plugin"
timeout 540 "$PY" -m pytest -v -m gpu -p no:cacheprovider --junitxml="$OUT/junit.xml" \
  tests/vllm_plugin/test_plugin_gpu.py tests/vllm_plugin/test_plugin_vllm_gpu.py > "$OUT/tests.txt" 2>&1
rc=$?
tail -15 "$OUT/tests.txt" | tee -a "$OUT/log.txt"
say "done (rc=$rc)"
exit $rc
