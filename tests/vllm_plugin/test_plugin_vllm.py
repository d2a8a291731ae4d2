"""vLLM 0.10.2's and 0.6.4's own Python loading the plugin and dispatching to it.

Each case runs ``vllm_driver.py`` in a fresh interpreter with the fetched release's
source tree on ``sys.path`` (never committed): vLLM's real ``load_general_plugins()``
finds the entry point in a temporary ``*.dist-info/entry_points.txt`` (what both
releases' loaders read, through ``importlib.metadata.entry_points(group=
'vllm.general_plugins')``), and the calls go through ``vllm._custom_ops`` and
``PagedAttention.forward_decode``. What the driver stubs, and why, is listed in its
docstring: the ``vllm`` / ``vllm.attention`` / ``vllm.attention.ops`` package
``__init__``s, ``vllm.platforms``, the compiled ``vllm._C`` (defined from the tree's
own schema text, with a CPU kernel for vLLM's), the CPU dispatch key, and the
launcher library (standin.FakeLauncher).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import standin as S  # noqa: E402

import kvpatch  # noqa: E402
from kvpatch.vllm_plugin import schemas_from_bindings  # noqa: E402

pytestmark = [pytest.mark.network, pytest.mark.slow]

ROOT = Path(kvpatch.__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
ALL_OURS = {f"{path} {kind}": S.OURS for path in ("custom_ops", "forward_decode") for kind in ("v1", "v2")}
ALL_STOCK = {k: S.STOCK for k in ALL_OURS}


def _entry_points(where: Path) -> Path:
    info = where / "kvpatch_plugin_test-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvpatch-plugin-test\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[vllm.general_plugins]\nkvpatch = kvpatch.vllm_plugin:register\n")
    return where


def _drive(tree: Path, tmp_path: Path, version: str, **env: str) -> tuple[dict, list[str]]:
    texts = schemas_from_bindings((tree / "csrc" / "torch_bindings.cpp").read_text(encoding="utf-8"))
    bundle = S.make_bundle(tmp_path / "bundle", release=version, schemas=texts)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("KVPATCH_", "VLLM_"))}
    environ.update({"PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]), "KVPATCH_PLUGIN_DIR": str(bundle),
                    "LOADS": "3", **env})  # fmt: skip
    proc = subprocess.run([sys.executable, str(HERE / "vllm_driver.py"), str(tree), str(_entry_points(tmp_path / "ep"))],
                          env=environ, capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("REPORT "))[len("REPORT ") :])
    ours = [line for line in proc.stderr.splitlines() if "[kvpatch]" in line]
    return report, ours


@pytest.fixture(params=["0.10.2", "0.6.4"])
def release(request, vllm_release):
    return request.param, vllm_release(request.param)


def test_plugin_serves_vllms_calls(release, tmp_path):
    version, tree = release
    report, lines = _drive(tree, tmp_path, version)
    assert report["version"] == version and report["float_scales"] is (version == "0.6.4")
    assert report["decision"]["registered"], report["decision"]
    assert report["results"] == ALL_OURS and report["stock_calls"] == 0
    assert report["launches"] == ["v1", "v1", "v2", "v2"]  # custom_ops, then forward_decode, per kernel
    active, inactive = report["kernels"]
    assert len(inactive) == 1 and active != inactive[0]  # ours active, the stand-in for vLLM's shadowed
    assert len(lines) == 1 and "now run kvpatch's patched kernels" in lines[0] and f"vLLM {version}'s" in lines[0]
    assert report["cuda_initialized"] is False and report["heavy"] == []


def test_kill_switch_keeps_vllms_kernels(release, tmp_path):
    version, tree = release
    report, lines = _drive(tree, tmp_path, version, KVPATCH_DISABLE="1")
    assert not report["decision"]["registered"] and report["decision"]["action"] == "off"
    assert report["results"] == ALL_STOCK and report["stock_calls"] == 4 and report["launches"] == []
    assert len(lines) == 1 and "KVPATCH_DISABLE=1 switches the plugin off" in lines[0]


def test_vllm_plugins_filter(release, tmp_path):
    version, tree = release
    report, lines = _drive(tree, tmp_path, version, VLLM_PLUGINS="some_other_plugin")
    assert not report["decision"]["registered"]
    assert report["results"] == ALL_STOCK and lines == []
