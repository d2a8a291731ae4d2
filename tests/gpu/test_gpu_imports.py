"""The GPU machine runs validate, bench and tune on prebuilt libraries with torch and little
else: no libclang, no git, maybe no numpy or matplotlib. Every module imports there, and the
GPU side of each command runs without the build side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from gpu_helpers import WITHOUT_CLANG_AND_GIT

pytestmark = pytest.mark.slow  # fresh interpreters


def _runs_ok(code: str, **kw) -> None:
    """``code`` runs in a fresh interpreter and prints ``ok``."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, **kw)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1:] == ["ok"], r.stdout[-2000:] + r.stderr[-2000:]


def test_every_module_imports_without_torch_numpy_matplotlib_libclang_or_git():
    """torch, numpy and matplotlib are imported inside functions only, libclang and git only
    where a header is parsed or a repository touched; parsing a header without libclang is a
    one-line PatchError."""
    code = WITHOUT_CLANG_AND_GIT + textwrap.dedent("""
        for m in ('torch', 'numpy', 'matplotlib'):
            sys.modules[m] = None
        import importlib, pkgutil
        import kvpatch
        names = [m.name for m in pkgutil.walk_packages(kvpatch.__path__, "kvpatch.") if m.name != "kvpatch.__main__"]
        for name in names:
            importlib.import_module(name)
        assert {"kvpatch.gpu.upstream_shim", "kvpatch.commands.validate", "kvpatch.commands.bench",
                "kvpatch.commands.tune", "kvpatch.gpu.plot", "kvpatch.cli", "kvpatch.render"} <= set(names)
        assert not [m for m in sys.modules if m.startswith(("clang", "git"))]
        from kvpatch.gpu.dispatch import uses_v1
        from kvpatch.gpu.validate import vllm_sizes
        from kvpatch.commands.common import local_machine
        assert uses_v1(64, 32, 1024) and vllm_sizes('/nonexistent')[0][0] == 32
        assert local_machine(arch="sm_90a").arch == "sm_90a"
        from kvpatch.errors import PatchError
        import kvpatch.patch
        try:
            kvpatch.patch.find_sites("int x;", "a.cuh")
        except PatchError as e:
            assert "libclang" in str(e) and "\\n" not in str(e), e
            print("ok")
    """)
    _runs_ok(code)


def test_bench_reports_need_no_libclang():
    """Reading variant markers into a bench summary imports nothing of the build side."""
    code = WITHOUT_CLANG_AND_GIT + textwrap.dedent("""
        import json
        import kvpatch.cli, kvpatch.commands.bench, kvpatch.commands.validate, kvpatch.commands.tune, kvpatch.tune
        from kvpatch.config import make_config
        from kvpatch.gpu import bench_report as Br, points as P
        p = P.BenchPoint("fp16", 4, 1024)
        names = ["stock", "v"]
        raw = {(p, p.dispatched, "warm"): {"stock": [[10.0]] * 3, "v": [[10.5], [10.6], [10.4]]}}
        info = {"stock": {"marker": "stock"}, "v": {"marker": make_config(inherit_rules=False, fp16="off").marker()}}
        rep = Br.BenchReport("stock", names, Br.finish_results(raw, names, 4e12), {}, {}, variant_info=info)
        row = json.loads(rep.to_json())["summary"][0]
        assert row["slower"] == 1 and row["slower_stock_code"] == 1, row
        assert not [m for m in sys.modules if m.startswith(("clang", "git", "kvpatch.jit"))]
        print("ok")
    """)
    _runs_ok(code)


@pytest.mark.parametrize("command", ["tune", "validate", "bench"])
def test_commands_on_prebuilt_libraries_need_no_libclang(tmp_path, command):
    """tune, validate and bench given --lib get as far as the GPU check without libclang or git
    (the H200 has neither): here, with no GPU, that is the one-line "no CUDA" error, exit 5."""
    lib = tmp_path / "libx.so"
    lib.write_bytes(b"")
    code = WITHOUT_CLANG_AND_GIT + textwrap.dedent("""
        from kvpatch.cli import run
        sys.argv = ["kvpatch"] + sys.argv[1:]
        run()
    """)
    args = [command, "--lib", f"stock={lib}:kvpatch_stock", "--lib", f"v={lib}:kvpatch_v"]
    if command == "tune":  # a candidate's configuration is its marker: checked before the GPU is
        from kvpatch.config import make_config

        (tmp_path / "variants.json").write_text(json.dumps({"v": make_config(lookahead=2).marker()}))
        args += ["--variant-info", str(tmp_path / "variants.json")]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=env,
                       cwd=tmp_path)  # fmt: skip
    assert r.returncode == 5, r.stderr[-2000:]
    assert "blocked" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert r.stderr.startswith(f"error: kvpatch {command}: ") and "torch" in r.stderr
