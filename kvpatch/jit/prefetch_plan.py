"""The L2 weight-prefetch kernel's library as a :class:`~kvpatch.jit.library.LibraryPlan`:
one generated translation unit, compiled with the same flag set as the attention kernels
(:func:`~kvpatch.jit.flags.vllm_nvcc_flags`), through the one JIT path, SASS checked by
:func:`~kvpatch.jit.sass.check_prefetch_library`. Its source comes from
:mod:`kvpatch.prefetch.kernel` (which renders the template and loads the library)."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..arch import Arch
from ..errors import UsageError
from ..progress import QUIET, Progress
from .flags import vllm_nvcc_flags
from .layout import CacheLayout
from .toolchain import Inspector, toolchain, validate_archs

#: Bump when the generated code or the cache layout changes: every cache key changes.
PREFETCH_BUILD_FORMAT = 3
#: The library's file name in its cache directory.
LIBRARY_NAME = "libkvpatch_l2_prefetch.so"
SOURCE = "l2_prefetch.cu"


@dataclass(frozen=True)
class PrefetchBuild:
    """What a build of the prefetch library produced (``result.json``'s form)."""

    library: Path
    archs: tuple[str, ...]
    spec: str  # the kernel spec's marker
    nvcc: str
    sass: dict[str, dict[str, int]]  # arch -> {"bulk": n, "line": n}
    library_bytes: int = 0
    library_sha256: str = ""


@dataclass(frozen=True)
class PrefetchPlan(CacheLayout):
    """The build of one prefetch kernel source for some archs (paths under :attr:`dir`)."""

    source: str
    marker: str
    archs: tuple[Arch, ...]
    nvcc_version: str
    cache: Path
    name: str = "l2-prefetch"
    shards: int = 1
    compile_flags: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        flags = [*vllm_nvcc_flags(), "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden"]
        for arch in self.archs:
            flags += arch.gencode_flags()
        object.__setattr__(self, "compile_flags", (*flags, "-Xptxas", "-v"))

    @property
    def files(self) -> tuple[tuple[str, str], ...]:
        return ((SOURCE, self.source),)

    @functools.cached_property
    def key(self) -> str:
        blob = json.dumps({"format": PREFETCH_BUILD_FORMAT, "source": self.source, "flags": self.compile_flags,
                           "link": self.link_flags, "nvcc": self.nvcc_version}, sort_keys=True)  # fmt: skip
        return "l2prefetch-" + hashlib.sha256(blob.encode()).hexdigest()[:20]

    @property
    def library_name(self) -> str:
        return LIBRARY_NAME

    def shard_source(self, i: int) -> str:
        return SOURCE

    def shard_object(self, i: int) -> str:
        return "l2_prefetch.o"

    def shard_log(self, i: int) -> str:
        return "ptxas.log"

    def inspect(self, tools: Inspector, step: Callable[[str, Callable[[], None]], None]) -> PrefetchBuild:
        from .sass import check_prefetch_library, dump_sass_text

        found: dict[str, Any] = {}

        def dump() -> None:
            text = dump_sass_text(tools, self.library, self.dir / "kernel.sass")
            found["sass"] = check_prefetch_library(text.splitlines(), self.archs)

        step("cuobjdump --dump-sass", dump)
        release = next((ln.strip() for ln in self.nvcc_version.splitlines() if "release" in ln), "")
        return PrefetchBuild(self.library, tuple(str(a) for a in self.archs), self.marker, release, found["sass"])

    def read_result(self, data: dict) -> PrefetchBuild:
        return PrefetchBuild(library=self.library, archs=tuple(data["archs"]), spec=data["spec"], nvcc=data["nvcc"],
                             sass=data["sass"], library_bytes=data["library_bytes"],
                             library_sha256=data["library_sha256"])  # fmt: skip

    def result_json(self, result: PrefetchBuild) -> dict:
        return {"archs": list(result.archs), "spec": result.spec, "nvcc": result.nvcc, "sass": result.sass,
                "library": LIBRARY_NAME, "library_bytes": result.library_bytes,
                "library_sha256": result.library_sha256}  # fmt: skip


def build_prefetch_library(source: str, marker: str, archs: Sequence[Arch], *, cache: Path | None = None,
                           progress: Progress = QUIET) -> PrefetchBuild:  # fmt: skip
    """Build (or take from the cache) the prefetch library of ``source`` for ``archs``."""
    from ..source.cache import cache_root
    from .library import build_libraries
    from .toolchain import find_inspector

    old = [str(a) for a in archs if a.major < 8]
    if old:
        raise UsageError(f"the L2 prefetch needs sm_80 or newer; cannot build for {', '.join(old)}")
    tc = toolchain()
    validate_archs(archs, tc)
    plan = PrefetchPlan(source, marker, tuple(archs), tc.version, Path(cache) if cache is not None else cache_root())
    return build_libraries([plan], tc=tc, tools=find_inspector(tc.nvcc), jobs=1, progress=progress)[plan.name]
