"""Where a library plan's build lives and how it is compiled and linked: one layout for every
plan the JIT path builds (:class:`~kvpatch.jit.plan.VariantPlan`,
:class:`~kvpatch.jit.prefetch_plan.PrefetchPlan`).

A plan gives its content ``key``, the ``cache`` root, the ``library_name``, its ``shards``
and their file names, and the shared ``compile_flags``; everything else is derived here: the
build directory ``<cache>/builds/<key>``, the lock beside it, ``result.json``, the link flags
(part of every key) and the nvcc command lines (compiled to ``.tmp`` names, renamed when done).
"""

from __future__ import annotations

from pathlib import Path

from ..source.cache import BUILDS_DIR

#: How every library is linked (a cache key covers them).
LINK_FLAGS = ("-shared", "-Xcompiler", "-fPIC")


class CacheLayout:
    cache: Path
    shards: int
    compile_flags: tuple[str, ...]
    key: str
    library_name: str

    @property
    def dir(self) -> Path:
        return self.cache / BUILDS_DIR / self.key

    @property
    def lock_path(self) -> Path:
        return self.cache / BUILDS_DIR / f"{self.key}.lock"

    @property
    def library(self) -> Path:
        return self.dir / self.library_name

    @property
    def result_path(self) -> Path:
        return self.dir / "result.json"

    @property
    def link_flags(self) -> tuple[str, ...]:
        return LINK_FLAGS

    def shard_source(self, i: int) -> str:
        raise NotImplementedError

    def shard_object(self, i: int) -> str:
        raise NotImplementedError

    def compile_argv(self, nvcc: Path, i: int, threads: int = 1) -> list[str]:
        argv = [str(nvcc), "-c", self.shard_source(i), "-o", self.shard_object(i) + ".tmp", *self.compile_flags]
        if threads > 1:
            argv.append(f"--threads={threads}")
        return argv

    def link_argv(self, nvcc: Path) -> list[str]:
        objects = [self.shard_object(i) for i in range(self.shards)]
        return [str(nvcc), *self.link_flags, "-o", self.library_name + ".tmp", *objects]
