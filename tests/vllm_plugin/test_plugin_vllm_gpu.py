"""vLLM's own Python and the plugin on a GPU, as a user runs them: ``kvpatch plugin status``
and ``kvpatch plugin check`` (the CLI, in fresh processes), and vLLM's own
``test_paged_attention`` through the real ``vllm._custom_ops``, once with kvpatch's kernels
and once with ``KVPATCH_DISABLE=1``.

Needs CUDA torch, a GPU, and:

* ``KVPATCH_TEST_VLLM_TREE``: the release's source tree (its ``vllm/``,
  ``csrc/torch_bindings.cpp`` and ``tests/``; nothing of it is committed);
* ``KVPATCH_PLUGIN_GPU_LIBS``: stock and patched libraries of that release
  (``python tests/vllm_plugin/test_plugin_gpu.py build DIR``);
* ``KVPATCH_TEST_OUT`` (optional): where the raw results are copied.

What is stubbed, and why, is listed in :mod:`vllm_gpu_stubs` (no vLLM wheel runs on the
GPU machine's torch: the package ``__init__``s, ``vllm.platforms`` and the compiled
``vllm._C``, whose paged-attention kernel is kvpatch's stock twin). The bundle holds the
configurations built (not the release's full set, which takes ten minutes to compile
on two cores); everything from the entry point on is the real plugin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tree, libs = os.environ.get("KVPATCH_TEST_VLLM_TREE"), os.environ.get("KVPATCH_PLUGIN_GPU_LIBS")
    if not torch.cuda.is_available() or not tree or not libs:
        pytest.skip("needs a CUDA GPU, KVPATCH_TEST_VLLM_TREE and KVPATCH_PLUGIN_GPU_LIBS (see the module docstring)")
    from kvpatch.vllm_plugin import KernelSet, schemas_from_bindings, write_bundle

    tree, libs = Path(tree), Path(libs)
    info = json.loads((libs / "libs.json").read_text())
    version = next(line.split(":", 1)[1].strip() for line in (tree / "PKG-INFO").read_text().splitlines()
                   if line.startswith("Version:"))  # fmt: skip
    work = tmp_path_factory.mktemp("plugin-vllm")
    schemas = schemas_from_bindings((tree / "csrc" / "torch_bindings.cpp").read_text(encoding="utf-8"))
    configs = info["patched"]["configs"]
    dims = [sorted({c.split("/")[i] for c in configs}) for i in range(4)]
    write_bundle(libs / info["patched"]["file"], vllm_release=version, header_revision=info.get("revision", ""),
                 marker=info["marker"], archs=("sm_90a",), prefix=info["patched"]["prefix"], configs=configs,
                 kernel_set=KernelSet(tuple(dims[0]), tuple(dims[1]), tuple(map(int, dims[2])), tuple(map(int, dims[3]))),
                 schemas=schemas, scale_by_value=False, directory=work / "bundle")  # fmt: skip
    site = work / "site"
    (site / f"vllm-{version}.dist-info").mkdir(parents=True)  # what importlib.metadata.version("vllm") reads
    (site / f"vllm-{version}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
    )
    ep = site / "kvpatch_entry_point-0.dist-info"  # kvpatch's pyproject entry point, as an install writes it
    ep.mkdir()
    (ep / "METADATA").write_text("Metadata-Version: 2.1\nName: kvpatch-entry-point\nVersion: 0\n")
    (ep / "entry_points.txt").write_text("[vllm.general_plugins]\nkvpatch = kvpatch.vllm_plugin:register\n")
    (site / "sitecustomize.py").write_text("import vllm_gpu_stubs\n\nvllm_gpu_stubs.install()\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("KVPATCH_DISABLE", "VLLM_"))}
    environ.update(PYTHONPATH=os.pathsep.join([str(site), str(HERE), str(ROOT)]), KVPATCH_PLUGIN_DIR=str(work / "bundle"),
                   KVPATCH_TEST_VLLM_TREE=str(tree),
                   KVPATCH_TEST_STOCK_LIB=f"{libs / info['stock']['file']}:{info['stock']['prefix']}",
                   VLLM_USE_V1="0", VLLM_ATTENTION_BACKEND="XFORMERS", PYTHONUNBUFFERED="1")  # fmt: skip
    out = Path(os.environ.get("KVPATCH_TEST_OUT") or work / "out")
    out.mkdir(parents=True, exist_ok=True)
    return dict(tree=tree, env=environ, out=out, work=work, version=version, configs=configs)


def _run(env: dict, *args: str, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env["env"], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd or env["work"])  # fmt: skip


def _keep(env: dict, name: str, proc: subprocess.CompletedProcess) -> None:
    (env["out"] / name).write_text(f"$ rc={proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}\n")


def test_status_says_vllm_will_run_kvpatchs_kernels(env):
    proc = _run(env, "-m", "kvpatch", "plugin", "status", "--gpus", "--json", str(env["out"] / "status.json"))
    _keep(env, "status.txt", proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    d = json.loads((env["out"] / "status.json").read_text())
    assert d["action"] == "register" and d["vllm_version"] == env["version"] and d["notes"] == []
    assert any("sm_90: served" in g for g in d["gpus"]), d["gpus"]


def test_check_is_bit_identical_through_custom_ops_and_forward_decode(env):
    proc = _run(env, "-m", "kvpatch", "plugin", "check", "--json", str(env["out"] / "check.json"))
    _keep(env, "check.txt", proc)
    report = json.loads((env["out"] / "check.json").read_text())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["ok"] and report["decision"]["registered"]
    seen = {(r["path"], r["mode"]) for r in report["results"]}
    assert {p for p, _ in seen} == {"custom_ops", "forward_decode"} and {"eager", "graph replayed"} <= {
        m for _, m in seen
    }
    assert report["timings"] and all(t["stock_us"] > 0 and t["kvpatch_us"] > 0 for t in report["timings"])


ROOT_CONFTEST = '''"""vLLM's test under the plugin: vLLM's Python from the tree, then vLLM's plugin loader."""
import json, os
import vllm_gpu_stubs

vllm_gpu_stubs.install(for_test=True)
from vllm.plugins import load_general_plugins

load_general_plugins()
from kvpatch.vllm_plugin import plugin

active, inactive = plugin.active_kernel("_C::paged_attention_v1", "CUDA")
with open(os.environ["KVPATCH_TEST_DECISION"], "w") as f:
    json.dump({"registered": plugin.registration() is not None, "active": active, "inactive": inactive,
               "line": plugin.decide().line()}, f)
'''


@pytest.mark.parametrize("arm", ["kvpatch", "disabled"])
def test_vllms_own_test_paged_attention_through_the_real_custom_ops(env, arm):
    from kvpatch.gpu.upstream import count_cases, junit_cases
    from kvpatch.gpu.upstream_test import find_test, write_run_dir

    run_dir = env["work"] / f"upstream-{arm}"
    run_dir.mkdir()
    test = write_run_dir(find_test(env["tree"]), run_dir)
    (run_dir / "conftest.py").write_text(ROOT_CONFTEST)
    (run_dir / "kvpatch_upstream_shim.py").unlink()  # not used: vllm._custom_ops is the tree's
    decision, junit = env["out"] / f"upstream-{arm}-decision.json", env["out"] / f"upstream-{arm}.xml"
    environ = dict(env["env"], KVPATCH_TEST_DECISION=str(decision),
                   PYTHONPATH=os.pathsep.join([str(run_dir), env["env"]["PYTHONPATH"]]))  # fmt: skip
    if arm == "disabled":
        environ["KVPATCH_DISABLE"] = "1"
    # workers share one GPU's memory (vLLM's caches reach ~10 GiB a case): 8, as validate --upstream
    workers = ["-n", str(max(1, min(8, (os.cpu_count() or 2) - 2)))] if _has_xdist() else []
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers,
                           f"{test.relative_to(run_dir)}::test_paged_attention", f"--junitxml={junit}"],
                          env=environ, cwd=run_dir, capture_output=True, text=True,
                          timeout=float(os.environ.get("KVPATCH_TEST_UPSTREAM_TIMEOUT", 900)))  # fmt: skip
    _keep(env, f"upstream-{arm}.txt", proc)
    counts = count_cases(junit_cases(junit))
    assert proc.returncode == 0 and counts["failed"] == 0 and counts["passed"] >= 64, (counts, proc.stdout[-3000:])
    d = json.loads(decision.read_text())
    assert d["registered"] is (arm == "kvpatch"), d
    # kvpatch's registration shadows the stock twin's; switched off, the twin is the only one
    assert len(d["inactive"]) == (1 if arm == "kvpatch" else 0), d


def _has_xdist() -> bool:
    import importlib.util

    return importlib.util.find_spec("xdist") is not None
