"""The counts kvpatch prints say what they count: a full build's kernels and configurations,
and a plugin bundle's configurations."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from kvpatch.jit.result import BuildResult, KernelInfo, VariantResult
from kvpatch.render import build_table, enable_lines, status_lines


def _kernel(**kw) -> KernelInfo:
    base = dict(arch="sm_90a", kernel="v1", dtype="fp16", kv_cache_dtype="auto", head_size=128, block_size=16,
                registers=96, spill_stores=0, spill_loads=0, stack_bytes=0, has_prefetch=False, expect_prefetch=False,
                symbol="_Z")  # fmt: skip
    return KernelInfo(**{**base, **kw})


def _printed(renderable) -> str:
    out = io.StringIO()
    Console(file=out, width=300).print(renderable)
    return " ".join(out.getvalue().split())


def test_a_full_builds_table_says_what_its_kernels_and_configurations_count() -> None:
    kernels = tuple(_kernel(kernel=k, head_size=h, block_size=b) for k in ("v1", "v2") for h in (64, 128)
                    for b in (8, 16, 32)) * 6  # fmt: skip
    stock = VariantResult("stock", "kvpatch_stock", "k", Path("."), Path("s.so"), (), Path("s.sass"), ("sm_90a",),
                          (), kernels, (), False)  # fmt: skip
    text = _printed(build_table(BuildResult((stock,), 1.0, ())))
    assert "per variant" in text  # the large form: counts, not kernels
    assert ("kernels: per arch, v1 and v2 of each configuration and v2's reduce kernel per dtype and head size; "
            "configurations: dtype x KV-cache dtype x head size x block size") in text  # fmt: skip


def test_a_bundles_configurations_are_said_as_what_they_are() -> None:
    what = "243 configurations (dtype x KV-cache dtype x head size x block size, each its v1 and v2 kernels)"
    manifest = SimpleNamespace(vllm_release="0.10.2", marker="m", library="lib.so", library_bytes=2**20,
                               configs=["c"] * 243, archs=["sm_90a"])  # fmt: skip
    report = SimpleNamespace(manifest=manifest, cached=True, directory="d", library="l", installed_vllm=None)
    assert what in " ".join(enable_lines(report))
    decision = SimpleNamespace(line=lambda: "on", bundle="b", action="on", fix=None, release="0.10.2",
                               header_revision="r", configs=243, archs=["sm_90a"], vllm_version=None, unserved=None,
                               gpus=[], notes=[])  # fmt: skip
    assert what in " ".join(status_lines(decision))
