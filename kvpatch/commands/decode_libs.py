"""What a decode-step GPU run needs, built here (nvcc, no GPU) into one folder
(``bash scripts/gpu_decode.sh --prepare``).

:func:`prepare` fetches one vLLM release (or takes a tree), patches its header into the
decode step's variants (:func:`kvpatch.decode.prepare.decode_variants`: ``stock``, ``patched``
and ``tail``), builds them for the decode step's shapes only (bf16 by default, the models' head
sizes, block 16, auto cache; sm_90a) and the weight-prefetch kernel with its demote mode and
zero-row launch (:class:`~kvpatch.prefetch.kernel.PrefetchKernelSpec` ``demote=True``). Each
library is written xz-compressed (``FILE.so.xz``), with ``libs.txt`` (``NAME=FILE.so:PREFIX``
lines, FILE relative to the folder), ``variants.json`` (markers, flags) and ``build.json`` (each
kernel's registers, spills and SASS check); :func:`kvpatch.decode.prepare.unpack` reads the
folder back on the GPU machine. The same nvcc 13.0 as the H200's gives the same SASS.
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Any, Callable, Sequence

from ..decode.prepare import PREFETCH_LIBRARY, decode_variants, tail_config
from ..gpu.defaults import DEFAULT_ARCH


def prepare(out: str | Path, *, vllm: str = "0.10.2", tree: str | Path | None = None, arch: str = DEFAULT_ARCH,
            dtypes: Sequence[str] = ("bf16",), head_sizes: Sequence[int] = (64, 128), jobs: int | None = None,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """Build everything into ``out``; returns what ``build.json`` records."""
    from .. import jit as B
    from ..prefetch.kernel import PrefetchKernelSpec, build_prefetch_library
    from ..progress import QUIET
    from ..source.fetch import fetch_release
    from ..source.releases import HEADER

    say = progress or (lambda m: None)
    root = Path(tree) if tree is not None else fetch_release(vllm)
    header_path = root / HEADER
    stock = header_path.read_text(encoding="utf-8")
    variants = decode_variants(stock, str(header_path))
    spec = B.make_spec(root, variants, arch, dtypes=list(dtypes), head_sizes=list(head_sizes), block_sizes=[16],
                       kv_cache_dtypes=["auto"])  # fmt: skip
    say(f"building {', '.join(v.name for v in variants)} for {arch}: {', '.join(c.label for c in spec.configs)}")
    result = B.build(spec, jobs=jobs, progress=QUIET)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lines, info = [], {}
    for v, r in zip(spec.variants, result.variants):
        name = Path(r.library).name
        (out / (name + ".xz")).write_bytes(lzma.compress(Path(r.library).read_bytes(), preset=9))
        lines.append(f"{r.name}={name}:{r.prefix}")
        info[r.name] = {"marker": v.marker if v.config is not None else ("weight-tail" if r.name == "tail" else "stock"),
                        "config": v.config.marker() if v.config is not None else None,
                        "compile_flags": list(r.compile_flags), "archs": list(r.archs), "configs": list(r.configs),
                        "sha256": r.library_sha256}  # fmt: skip
        if r.name == "tail":
            info[r.name]["config"] = tail_config().marker()
    pf_spec = PrefetchKernelSpec(demote=True)
    pf = build_prefetch_library(arch, pf_spec)
    (out / (PREFETCH_LIBRARY + ".xz")).write_bytes(lzma.compress(Path(pf).read_bytes(), preset=9))
    say(f"prefetch library {pf} ({pf_spec.marker})")
    (out / "libs.txt").write_text("\n".join(lines) + "\n")
    (out / "variants.json").write_text(json.dumps(info, indent=1) + "\n")
    record = {"vllm": vllm if tree is None else str(tree), "arch": arch, "configs": [c.label for c in spec.configs],
              "prefetch_library": {"file": PREFETCH_LIBRARY, "spec": pf_spec.marker},
              "build": result.to_dict() if hasattr(result, "to_dict") else None}  # fmt: skip
    (out / "build.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    return record
