"""vLLM's ``TORCH_CUDA_ARCH_LIST`` syntax: ``'8.0;9.0a'`` -> :class:`Arch` values."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .errors import UsageError, text_argument

_ARCH_RE = re.compile(r"(?P<major>[0-9]+)\.(?P<minor>[0-9])(?P<suffix>[af]?)(?P<ptx>\+PTX)?", re.IGNORECASE)


@dataclass(frozen=True, order=True)
class Arch:
    """One entry of ``TORCH_CUDA_ARCH_LIST``: ``9.0a`` is ``Arch(9, 0, 'a')``."""

    major: int
    minor: int
    suffix: str = ""  # 'a' (arch-specific, sm_90a) or 'f' (family, CUDA >= 12.9) or ''
    ptx: bool = False  # '+PTX': embed PTX too, for JIT on newer GPUs

    @property
    def sm(self) -> str:
        """``'90a'``."""
        return f"{self.major}{self.minor}{self.suffix}"

    @property
    def code(self) -> str:
        """The SASS target: ``'sm_90a'`` (what cuobjdump and ptxas call it)."""
        return f"sm_{self.sm}"

    @property
    def compute(self) -> str:
        """The virtual architecture: ``'compute_90a'``."""
        return f"compute_{self.sm}"

    def gencode_flags(self) -> list[str]:
        """nvcc flags: ``['-gencode=arch=compute_90a,code=sm_90a']`` (+ PTX for ``+PTX``)."""
        flags = [f"-gencode=arch={self.compute},code={self.code}"]
        if self.ptx:
            flags.append(f"-gencode=arch={self.compute},code={self.compute}")
        return flags

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}" + ("+PTX" if self.ptx else "")


def parse_arch_list(text: str) -> list[Arch]:
    """Parse ``TORCH_CUDA_ARCH_LIST`` syntax: ``'8.0;9.0a'``, ``'8.0 9.0+PTX'``.

    Entries are separated by ``;``, spaces or commas; duplicates are dropped (an SM
    given with and without ``+PTX`` is one entry, with PTX), order is kept. Raises :class:`UsageError` naming the first bad entry.
    """
    entries = [e for e in re.split(r"[;,\s]+", text_argument(text, "the arch list").strip()) if e]
    if not entries:
        raise UsageError("empty arch list: give e.g. --arch 9.0a or --arch '8.0;9.0a'")
    archs: list[Arch] = []
    for entry in entries:
        m = _ARCH_RE.fullmatch(entry)
        if m is None:
            raise UsageError(f"invalid arch {entry!r}: use TORCH_CUDA_ARCH_LIST syntax such as 8.0, 9.0a or 9.0+PTX")
        arch = Arch(int(m["major"]), int(m["minor"]), m["suffix"].lower(), bool(m["ptx"]))
        if arch.suffix == "a" and arch.major < 9:
            raise UsageError(f"invalid arch {entry!r}: the 'a' suffix exists for 9.0 and newer")
        if arch.suffix == "f" and arch.major < 10:
            raise UsageError(f"invalid arch {entry!r}: the 'f' suffix exists for 10.0 and newer")
        same = [i for i, a in enumerate(archs) if a.sm == arch.sm]
        if same:  # '9.0a;9.0a+PTX': one target, with PTX if any entry asks for it
            archs[same[0]] = replace(archs[same[0]], ptx=archs[same[0]].ptx or arch.ptx)
        else:
            archs.append(arch)
    return archs


def is_hopper(code: str) -> bool:
    """Whether a SASS target is Hopper's (sm_90, sm_90a): the only device code the patch prefetches
    in; every other arch compiles stock's code (templates/inject/bulk_prefetch.cuh.j2's on_hopper)."""
    return code_major(code) == 9


def code_major(code: str) -> int:
    """The major version of a SASS target name: ``'sm_90a'`` -> 9, ``'sm_100'`` -> 10."""
    digits = re.match(r"sm_(\d+)", code)
    return int(digits.group(1)[:-1]) if digits else 0
