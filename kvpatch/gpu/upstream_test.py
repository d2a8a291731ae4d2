"""vLLM's own kernel test, found in a tree and copied into a run directory (pure: no GPU).

The release's ``test_paged_attention`` (``tests/kernels/attention/test_attention.py``
from vLLM 0.8.5 on, ``tests/kernels/test_attention.py`` before) is copied byte for
byte into a run directory with the files it needs from the same tree (its
``conftest.py``, ``allclose_default.py``, the ``__init__.py`` files) and an import
shim (:mod:`kvpatch.gpu.upstream_shim`) that provides ``vllm._custom_ops`` and the
rest of what the test imports, backed by one kvpatch library. vLLM's KV-cache
helpers (``create_kv_caches_with_random`` and what it calls) are extracted unchanged
from the tree's ``vllm/utils``. :mod:`.upstream` runs it.
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import GpuCheckError
from ..fsutil import write_atomic

#: Where vLLM keeps the test, newest layout first.
TEST_PATHS = ("tests/kernels/attention/test_attention.py", "tests/kernels/test_attention.py")
TEST_FUNCTION = "test_paged_attention"
#: The helpers the test's kv_cache_factory fixture needs from vllm/utils, extracted unchanged.
HELPER_NAMES = ("STR_DTYPE_TO_TORCH_DTYPE", "_generate_random_fp8", "get_kv_cache_torch_dtype",
                "create_kv_caches_with_random", "create_kv_caches_with_random_flash",
                "set_random_seed", "nvfp4_kv_cache_full_dim")  # fmt: skip
#: Helper names only some releases have (0.22 seeds through set_random_seed).
OPTIONAL_HELPERS = ("create_kv_caches_with_random_flash", "set_random_seed", "nvfp4_kv_cache_full_dim")
SHIM_MODULE = "kvpatch_upstream_shim"
#: What a test that ran out of GPU memory reports (torch's exception and its message).
OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory")
HELPERS_MODULE = "_vllm_helpers"


class UpstreamError(GpuCheckError, RuntimeError):
    """The tree has no usable kernel test (or a helper it needs), or vLLM's test could not be run
    (exit 6, as a GPU check that failed; still a RuntimeError for the callers that catch one)."""


@dataclass(frozen=True)
class UpstreamTest:
    tree: Path
    path: str  # relative to the tree
    function: str = TEST_FUNCTION

    @property
    def node_id(self) -> str:
        return f"{self.path}::{self.function}"


def find_test(tree: str | Path) -> UpstreamTest:
    """The release's paged-attention kernel test, or :class:`UpstreamError`."""
    root = Path(tree)
    for rel in TEST_PATHS:
        p = root / rel
        if p.is_file() and f"def {TEST_FUNCTION}(" in p.read_text(encoding="utf-8", errors="replace"):
            return UpstreamTest(root, rel)
    raise UpstreamError(f"{root} has no {TEST_FUNCTION} in {' or '.join(TEST_PATHS)}")


def _utils_files(root: Path) -> list[Path]:
    files = [root / "vllm/utils.py"] + sorted((root / "vllm/utils").glob("*.py"))
    return [f for f in files if f.is_file()]


def helper_source(tree: str | Path, names: Sequence[str] = HELPER_NAMES) -> str:
    """The source of ``names`` (functions and assignments) from the tree's ``vllm/utils``
    module(s), unchanged, behind the imports they use. Missing names raise UpstreamError
    except ``create_kv_caches_with_random_flash`` (absent in some releases)."""
    root = Path(tree)
    found: dict[str, str] = {}
    for f in _utils_files(root):
        text = f.read_text(encoding="utf-8")
        try:
            mod = ast.parse(text)
        except SyntaxError:
            continue
        for node in mod.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
                key = node.name
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                key = next((t.id for t in targets if isinstance(t, ast.Name) and t.id in names), None)
            else:
                continue
            if key and key not in found:
                start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
                lines = text.splitlines()[start - 1 : node.end_lineno]
                found[key] = f"# from {f.relative_to(root)}\n" + "\n".join(lines)
    missing = [n for n in names if n not in found and n not in OPTIONAL_HELPERS]
    if missing:
        raise UpstreamError(f"{root}: cannot find {', '.join(missing)} in vllm/utils")
    head = (
        '"""vLLM helpers extracted unchanged by kvpatch (see kvpatch.gpu.upstream)."""\n'
        "import random\nfrom functools import cache\nfrom typing import Any, Dict, List, Optional, Tuple, Union\n\nimport torch\n"
        "from vllm.platforms import current_platform  # the shim's; vLLM <= 0.6 helpers use the module global\n"
        "try:\n    import numpy as np\nexcept ImportError:  # only seed_everything would use it\n    np = None\n\n"
    )
    return head + "\n\n".join(found[n] for n in names if n in found) + "\n"


ROOT_CONFTEST = f'''"""Written by kvpatch validate --upstream: serve vllm.* from the shim before the test imports it."""
import {SHIM_MODULE}

{SHIM_MODULE}.install("{HELPERS_MODULE}")
'''


def write_run_dir(test: UpstreamTest, dest: str | Path) -> Path:
    """The run directory: the test and its neighbours copied unchanged, the shim, the
    extracted helpers, a root conftest.py and a pytest.ini. Returns the test's path."""
    dest = Path(dest)
    root = test.tree
    rel = Path(test.path)
    copies = [rel, rel.parent / "conftest.py", Path("tests/kernels/allclose_default.py")]
    for d in [*reversed(rel.parents)][1:]:  # tests/, tests/kernels/, ...
        copies.append(d / "__init__.py")
    for c in copies:
        src = root / c
        if src.is_file():
            (dest / c).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest / c)
    write_atomic(dest / f"{SHIM_MODULE}.py", (Path(__file__).parent / "upstream_shim.py").read_text(encoding="utf-8"))
    write_atomic(dest / f"{HELPERS_MODULE}.py", helper_source(root))
    write_atomic(dest / "conftest.py", ROOT_CONFTEST)
    write_atomic(dest / "pytest.ini", "[pytest]\naddopts = -p no:cacheprovider\n")
    return dest / rel
