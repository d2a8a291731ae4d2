"""What the plugin pulls into vLLM's processes: nothing heavy, and no CUDA.

Each check runs in a fresh interpreter. Stubbed where it registers: the ops'
namespace and vLLM's kernel (standin.define_ops, CPU key) and the launcher
(standin.FakeLauncher); the device operations are the real CUDA ones
(kernel.CudaDevice), which registering must not touch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # each test starts a Python that imports torch

import kvpatch  # noqa: E402

ROOT = Path(kvpatch.__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
HEAVY = ("clang", "jinja2", "typer", "rich", "git", "filelock", "platformdirs", "pypi_simple", "requests")

REPORT = f"""
import json, sys
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
torch = sys.modules.get("torch")
print("REPORT " + json.dumps({{"heavy": heavy, "torch": torch is not None,
      "cuda": bool(torch and torch.cuda.is_initialized()), "decision": globals().get("d") and d.to_dict()}}))
"""


def _run(code: str, tmp_path: Path, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KVPATCH_")}
    environ.update({"PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]), "KVPATCH_PLUGIN_DIR": str(tmp_path / "none"),
                    **env})  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code + REPORT], env=environ, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("REPORT "))
    return json.loads(line[len("REPORT ") :])


def test_importing_the_package_imports_no_torch(tmp_path):
    got = _run("import kvpatch.vllm_plugin", tmp_path)
    assert got["heavy"] == [] and not got["torch"]


def test_register_imports_nothing_heavy_and_no_cuda(tmp_path):
    code = f"""
from pathlib import Path
import standin as S
from kvpatch.vllm_plugin import Target, register
ns = S.unique_namespace()
keep = S.define_ops(ns, S.TENSOR_SCALES)
bundle = S.make_bundle(Path({str(tmp_path)!r}) / "bundle")
t = S.make_target(ns, bundle, S.FakeLauncher(S.SMALL_SET.labels()))
d = register(Target(**{{**t.__dict__, "device": None}}))  # the CUDA device operations
assert d.registered, d.line()
"""
    got = _run(code, tmp_path)
    assert got["heavy"] == [] and got["cuda"] is False and got["decision"]["registered"]


def test_refusal_with_vllms_defaults_imports_nothing_heavy(tmp_path):
    """The entry point as vLLM calls it, in an environment with a bundle but no vLLM."""
    code = f"""
from pathlib import Path
import standin as S
S.make_bundle(Path({str(tmp_path)!r}) / "bundle")
from kvpatch.vllm_plugin import register
d = register()
"""
    got = _run(code, tmp_path, KVPATCH_PLUGIN_DIR=str(tmp_path / "bundle"))
    assert got["heavy"] == [] and got["cuda"] is False
    assert got["decision"]["action"] == "refuse" and "vLLM" in got["decision"]["reason"]


@pytest.mark.parametrize("env", [{"KVPATCH_DISABLE": "1"}, {}])
def test_switched_off_or_not_enabled_imports_not_even_torch(tmp_path, env):
    got = _run("from kvpatch.vllm_plugin import register\nd = register()", tmp_path, **env)
    assert not got["torch"] and got["decision"]["action"] == "off"
