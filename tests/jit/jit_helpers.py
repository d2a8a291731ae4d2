"""What the kvpatch.jit tests share: the nvcc marker, the release trees, stock and patched
variants of a tree's header, a session build cache, and KernelInfo/VariantResult makers."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpatch.config import make_config
from kvpatch.errors import BuildError
from kvpatch.jit import HEADER, KernelInfo, Variant, VariantResult, find_nvcc, patched_variants
from kvpatch.patch import unpatch


def have_nvcc() -> bool:
    try:
        find_nvcc()
    except BuildError:
        return False
    return True


#: The marks of a test that compiles with nvcc (skipped without it) against a fetched release
#: tree: slow (a module's ``pytestmark``).
NVCC_MARKS = [
    pytest.mark.slow,
    pytest.mark.network,
    pytest.mark.nvcc,
    pytest.mark.skipif(not have_nvcc(), reason="nvcc not found on PATH (set CUDA_HOME or PATH)"),
]


def needs_release(test):
    """Reads a real release (fetched into the cache once): slow."""
    return pytest.mark.slow(pytest.mark.network(test))


def stock_and_patched(tree: Path) -> tuple[Variant, Variant]:
    """The tree's header without and with the default configuration."""
    path = str(tree / HEADER)
    stock, _ = unpatch(Path(path).read_text(encoding="utf-8"), path)
    first, second = patched_variants(stock, path, {"patched": make_config()})
    return first, second


#: Every query dtype: the SASS check must see the prefetch in each (fp16 is inline asm
#: by default, bf16 and fp32 call the kvpatch_prefetch_l2 helper).
ALL_DTYPES = ["fp16", "bf16", "fp32"]


@pytest.fixture(scope="session")
def tree_0102(vllm_release) -> Path:
    return vllm_release("0.10.2")


@pytest.fixture(scope="session")
def tree_064(vllm_release) -> Path:
    return vllm_release("0.6.4")


@pytest.fixture(scope="session")
def variants_0102(tree_0102) -> tuple[Variant, Variant]:
    return stock_and_patched(tree_0102)


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory) -> Path:
    """One build cache for the session, whichever module asks (builds in it are content-keyed)."""
    path = tmp_path_factory.getbasetemp() / "kvpatch-jit-cache"
    path.mkdir(exist_ok=True)
    return path


def kernel(**kw) -> KernelInfo:
    """A v1 fp16/auto/128/16 sm_90a kernel that holds the prefetch it should, with ``kw`` changed."""
    base = dict(arch="sm_90a", kernel="v1", dtype="fp16", kv_cache_dtype="auto", head_size=128, block_size=16,
                registers=96, spill_stores=0, spill_loads=0, stack_bytes=0, has_prefetch=True, expect_prefetch=True,
                symbol="_Z")  # fmt: skip
    return KernelInfo(**{**base, **kw})


def variant_result(name: str, kernels: tuple[KernelInfo, ...], config: str = "fp16/auto/128/16") -> VariantResult:
    """A variant's build result holding ``kernels`` (no files behind it)."""
    return VariantResult(name, f"kvpatch_{name}", "k", Path("."), Path(f"{name}.so"), (), Path(f"{name}.sass"),
                         ("sm_90a",), (config,), kernels, (), False)  # fmt: skip
