"""What a build says while it runs: each variant's SASS reading is announced with what it reads
(cuobjdump's dump of vLLM's full set takes minutes, and said nothing until it ended)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from kvpatch.arch import Arch
from kvpatch.jit import Toolchain
from kvpatch.jit.library import Processes, build_libraries
from kvpatch.jit.prefetch_plan import PrefetchBuild, PrefetchPlan
from kvpatch.jit.sass import kernel_count
from kvpatch.jit.spec import KernelConfig
from kvpatch.progress import Recorder

#: vLLM 0.10.2's full set: 3 dtypes x 3 cache dtypes x 9 head sizes x 3 block sizes.
FULL = [KernelConfig(d, kv, h, b) for d in ("fp16", "bf16", "fp32") for kv in ("auto", "fp8", "fp8_e5m2")
        for h in (32, 64, 80, 96, 112, 120, 128, 192, 256) for b in (8, 16, 32)]  # fmt: skip


@dataclass(frozen=True)
class _VariantLike(PrefetchPlan):
    """A plan with a variant's configurations whose inspection reads nothing."""

    configs: tuple[KernelConfig, ...] = ()

    def inspect(self, tools: Any, step: Callable[[str, Callable[[], None]], None]) -> PrefetchBuild:
        step("cuobjdump --dump-sass", lambda: None)
        return PrefetchBuild(self.library, tuple(str(a) for a in self.archs), self.marker, "", {})


def _nvcc(self: Processes, argv: list[str], cwd: Path) -> tuple[int, str]:
    (cwd / argv[argv.index("-o") + 1]).write_bytes(b"\0")
    return 0, ""


def test_the_full_set_counts_the_tables_513_kernels_per_arch() -> None:
    assert len(FULL) == 243
    assert kernel_count(FULL) == 513 and kernel_count(FULL, 2) == 1026


def test_a_build_says_what_it_reads_before_each_variants_sass(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(Processes, "run", _nvcc)
    archs = (Arch(9, 0, "a"),)
    plans = [_VariantLike("// stock\n", "m", archs, "release 13.0", tmp_path, name="stock", configs=tuple(FULL)),
             _VariantLike("// small\n", "m", archs, "release 13.0", tmp_path, name="patched", configs=tuple(FULL[:2]))]  # fmt: skip
    rec = Recorder()
    build_libraries(plans, tc=Toolchain(Path("nvcc"), "release 13.0", ()), tools=None, jobs=1, progress=rec)  # type: ignore[arg-type]
    said = [line for line in rec.lines if "reading the SASS" in line]
    assert said == [
        "stock: reading the SASS of 513 kernels (v1 and v2 of 243 configurations and their reduce kernels, sm_90a) "
        "to check the prefetch; minutes for vLLM's full set",
        "patched: reading the SASS of 5 kernels (v1 and v2 of 2 configurations and their reduce kernels, sm_90a) "
        "to check the prefetch",
    ]
    # said before the step it announces
    assert rec.lines.index(said[0]) < rec.lines.index(next(x for x in rec.lines if "cuobjdump" in x))
