"""kvpatch.gpu.upstream_shim: the import shim under which vLLM's own test_paged_attention runs
unchanged against kvpatch's libraries -- its fp8 conversion, and (network) every import of each
header revision's release test resolved."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvpatch.gpu import upstream as U


def _from_imports(tree: Path, test) -> list[tuple[str, str]]:
    """(module, name) of every from-import of the release's test and its conftest; a
    relative one (0.6.4's ``from .allclose_default import ...``) as its absolute module."""
    imports = []
    for rel in (test.path, str(Path(test.path).parent / "conftest.py")):
        pkg = Path(rel).parent.as_posix().split("/")
        for node in ast.walk(ast.parse((tree / rel).read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = (
                    ".".join(pkg[: len(pkg) - node.level + 1] + [node.module or ""]).strip(".")
                    if node.level
                    else node.module
                )
                imports += [(mod, a.name) for a in node.names]
    return imports


def _types_under_shim(run_dir: Path, imports: list[tuple[str, str]], check: str = "") -> dict[str, str]:
    """In a fresh interpreter with the shim installed in ``run_dir``: the type name of each
    imported name (``Missing``: a placeholder), after running ``check`` there."""
    code = (
        textwrap.dedent(f"""
        import importlib, json, torch
        import kvpatch_upstream_shim as S
        S.install("_vllm_helpers")
        got = {{}}
        for mod, name in {imports!r}:
            if mod.split(".")[0] in ("typing",):
                continue
            got[f"{{mod}}.{{name}}"] = type(getattr(importlib.import_module(mod), name)).__name__
    """)
        + textwrap.dedent(check)
        + "print(json.dumps(got))\n"
    )
    env = dict(os.environ, PYTHONPATH=U.pythonpath_for(run_dir))
    p = subprocess.run([sys.executable, "-c", code], cwd=run_dir, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.slow
@pytest.mark.network
def test_shim_serves_every_import_of_vllm_0_10_2s_test(vllm_release, tmp_path):
    """Every name 0.10.2's test_attention.py and its conftest import resolves under the shim,
    the helpers are 0.10.2's own, and torch.ops._C.paged_attention_v1/v2 exist for opcheck's arguments."""
    pytest.importorskip("torch")
    tree = vllm_release("0.10.2")
    test = U.find_test(tree)
    assert test.path == "tests/kernels/attention/test_attention.py"
    U.write_run_dir(test, tmp_path / "run")
    imports = _from_imports(tree, test)
    assert ("vllm", "_custom_ops") in imports and ("xformers", "ops") in imports
    got = _types_under_shim(
        tmp_path / "run",
        imports,
        check="""
        assert torch.ops._C.paged_attention_v1 is S.paged_attention_v1
        from vllm.utils import create_kv_caches_with_random
        assert create_kv_caches_with_random.__module__ == "_vllm_helpers"
    """,
    )
    assert got["vllm._custom_ops"] == "module" and got["vllm.platforms.current_platform"] == "_Platform"
    assert got["vllm.utils.get_max_shared_memory_bytes"] == "function"
    assert got["tests.kernels.utils.opcheck"] == "function"
    assert got["vllm.attention.layer.Attention"] == "Missing"


def test_shim_convert_fp8_works_on_the_flat_blocks_like_vllms_kernel():
    """vLLM's test dequantises an fp8 key cache [blocks, heads, head/16, block, 16] into a
    tensor shaped with the 16-bit x ([..., head/8, block, 8]): the op converts element by
    element over the flat blocks, so the shapes need not match (they did not in the first
    H200 run: 49 upstream tests failed for stock itself)."""
    torch = pytest.importorskip("torch")
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "kvpatch_shim_under_test", Path(U.__file__).with_name("upstream_shim.py")
    )
    shim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim)
    codes = torch.randint(0, 0x70, (3, 2, 4, 16, 16), dtype=torch.uint8)  # no NaN codes
    out = torch.empty((3, 2, 8, 16, 8), dtype=torch.bfloat16)
    shim.convert_fp8(out, codes, 2.0)
    want = (codes.reshape(-1).view(torch.float8_e4m3fn).float() * 2.0).to(torch.bfloat16)
    assert torch.equal(out.reshape(-1), want)
    back = torch.empty_like(codes)
    shim.convert_fp8(back, out, 2.0)
    assert torch.equal(back, codes)
    # in pieces (bounded temporaries): the same bytes, across piece boundaries that split blocks
    for chunk in (1, 7, 1000, codes.numel() - 1):
        part, again = torch.empty_like(out), torch.empty_like(codes)
        shim.convert_fp8(part, codes, 2.0, chunk=chunk)
        shim.convert_fp8(again, part, 2.0, chunk=chunk)
        assert torch.equal(part, out) and torch.equal(again, codes), chunk


#: Names the shim may leave as placeholders: imported by test_attention.py for its other
#: tests (multi-query / xformers / layer construction), never called by test_paged_attention.
UNUSED_BY_PAGED_ATTENTION = {
    "Attention",
    "MultiHeadAttention",
    "MMEncoderAttention",
    "ops",
    "BlockDiagonalCausalMask",
    "_make_alibi_bias",
    "make_alibi_bias",
}


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("release", ["0.6.4", "0.8.5", "0.9.2", "0.10.0", "0.10.2", "0.11.2", "0.22.1"])
def test_shim_serves_every_import_of_each_releases_test(vllm_release, tmp_path, release):
    """Per header revision's release: every from-import of the test and its conftest
    (relative ones too: 0.6.4 has ``from .allclose_default import ...``) resolves under the
    shim, the helper module imports, and only names test_paged_attention never calls are placeholders."""
    pytest.importorskip("torch")
    tree = vllm_release(release)
    test = U.find_test(tree)
    U.write_run_dir(test, tmp_path / "run")
    got = _types_under_shim(tmp_path / "run", _from_imports(tree, test))
    missing = {k.rsplit(".", 1)[1] for k, v in got.items() if v == "Missing"}
    assert missing <= UNUSED_BY_PAGED_ATTENTION, missing
    assert any(k.endswith(".create_kv_caches_with_random") and v == "function" for k, v in got.items())
