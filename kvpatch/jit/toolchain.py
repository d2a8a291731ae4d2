"""The tools a build runs: nvcc (:class:`Toolchain`) and cuobjdump/nvdisasm (:class:`Inspector`)."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..arch import Arch
from ..errors import BuildError


@dataclass(frozen=True)
class Toolchain:
    """The nvcc a build uses: its path, ``--version`` text and ``--list-gpu-arch``."""

    nvcc: Path
    version: str
    gpu_archs: tuple[str, ...]  # ('compute_75', 'compute_80', ...)

    @property
    def release(self) -> str:
        """``'13.0'`` from 'Cuda compilation tools, release 13.0, V13.0.88'."""
        m = re.search(r"release (\d+\.\d+)", self.version)
        return m.group(1) if m else "unknown"

    def supports(self, arch: Arch) -> bool:
        return f"compute_{arch.major}{arch.minor}" in self.gpu_archs

    def supported(self) -> list[str]:
        """The archs nvcc lists, in TORCH_CUDA_ARCH_LIST spelling: ``['7.5', '8.0', ...]``."""
        out = []
        for name in self.gpu_archs:
            digits = name.removeprefix("compute_")
            out.append(f"{digits[:-1]}.{digits[-1]}")
        return sorted(out, key=lambda s: tuple(int(p) for p in s.split(".")))


def find_nvcc() -> Path:
    """``$CUDA_HOME/bin/nvcc`` if that exists, else ``nvcc`` on PATH."""
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        candidate = Path(cuda_home) / "bin" / "nvcc"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("nvcc")
    if found is None:
        raise BuildError("nvcc not found on PATH (set CUDA_HOME or PATH)")
    return Path(found)


@functools.cache
def _toolchain(nvcc: str) -> Toolchain:
    version = run_text([nvcc, "--version"])
    archs = run_text([nvcc, "--list-gpu-arch"]).split()
    return Toolchain(Path(nvcc), version.strip(), tuple(a for a in archs if a.startswith("compute_")))


def toolchain() -> Toolchain:
    """The nvcc :func:`find_nvcc` finds; asked once per process."""
    return _toolchain(str(find_nvcc()))


def nvcc_version_of() -> str | None:
    """``'13.0.88'``: the version of the nvcc a build would use, None without one."""
    from ..config.machine import nvcc_version

    try:
        return nvcc_version(toolchain().version)
    except BuildError:
        return None


def validate_archs(archs: Sequence[Arch], tc: Toolchain) -> None:
    """Raise :class:`BuildError` for an arch this nvcc cannot compile for."""
    bad = [a for a in archs if not tc.supports(a)]
    if bad:
        names = ", ".join(str(a) for a in bad)
        raise BuildError(f"nvcc {tc.release} cannot compile for {names}; it supports {' '.join(tc.supported())}")


@dataclass(frozen=True)
class Inspector:
    """cuobjdump, and the nvdisasm it runs for ``--dump-sass``."""

    cuobjdump: Path
    nvdisasm: Path

    def env(self) -> dict[str, str]:
        """The environment to run cuobjdump in: nvdisasm's directory first on PATH."""
        path = os.environ.get("PATH", "")
        return {**os.environ, "PATH": f"{self.nvdisasm.parent}{os.pathsep}{path}"}


def find_cuda_tool(name: str, nvcc: Path | None = None) -> Path | None:
    """``name`` on PATH, beside nvcc, or in an NVIDIA wheel (``nvidia/*/bin/<name>``)."""
    found = shutil.which(name)
    if found:
        return Path(found)
    if nvcc is not None and (nvcc.parent / name).is_file():
        return nvcc.parent / name
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for candidate in sorted(Path(root).glob(f"*/bin/{name}")):
            if os.access(candidate, os.X_OK):
                return candidate
    return None


def find_inspector(nvcc: Path | None = None) -> Inspector:
    """Both SASS tools, or a :class:`BuildError` saying which wheels provide them."""
    cuobjdump = find_cuda_tool("cuobjdump", nvcc)
    nvdisasm = find_cuda_tool("nvdisasm", nvcc)
    missing = [f"nvidia-cuda-{n}" for n, p in (("cuobjdump", cuobjdump), ("nvdisasm", nvdisasm)) if p is None]
    if missing:
        names = " and ".join(n.removeprefix("nvidia-cuda-") for n in missing)
        raise BuildError(f"{names} not found (needed to check the SASS): pip install {' '.join(missing)}")
    assert cuobjdump is not None and nvdisasm is not None
    return Inspector(cuobjdump, nvdisasm)


def run_text(argv: Sequence[str], **kw) -> str:
    """Run a tool and return its stdout; a :class:`BuildError` with its last line if it fails."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, check=False, **kw)
    except OSError as e:
        raise BuildError(f"cannot run {argv[0]}: {e}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise BuildError(f"{Path(argv[0]).name} failed (exit {done.returncode}): {tail[0]}")
    return done.stdout


def first_error(log: str) -> str:
    """The first line of a tool's output that mentions an error, else its last line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln.lower():
            return ln
    return lines[-1] if lines else "(no output)"
