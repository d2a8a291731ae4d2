"""The decode step's libraries: the pure pieces of what a GPU run carries.

The variants a decode-step run compares, from one header's text (:func:`decode_variants`):

* ``stock``: the release's kernels;
* ``patched``: kvpatch's default KV prefetch (the shipped configuration);
* ``tail``: stock's kernels plus the in-kernel weight prefetch (``weight_tail``, every KV
  prefetch off): the tail of each attention kernel prefetches the head of the layer's o_proj
  weight from the table the run sets (:mod:`kvpatch.prefetch.tail`);

the prefetch library's file name, and :func:`unpack`, which reads a prepared folder back on the
GPU machine. Fetching, building and writing the folder is a command's work
(:func:`kvpatch.commands.decode_libs.prepare`).
"""

from __future__ import annotations

import lzma
from pathlib import Path
from typing import Any

#: The in-kernel form's configuration: no KV prefetch anywhere, the weight tail on.
TAIL_OPTIONS: dict[str, Any] = {"fp16": "off", "bf16": "off", "fp32": "off", "rules": "none", "weight_tail": True}
#: The prefetch library's file name in the folder (compressed: ``.xz`` added).
PREFETCH_LIBRARY = "libkvpatch_l2_prefetch.so"


def tail_config() -> Any:
    from ..config import make_config

    return make_config(**TAIL_OPTIONS)


def decode_variants(stock: str, header_path: str) -> list[Any]:
    """``stock``, ``patched`` (the default configuration) and ``tail`` (:data:`TAIL_OPTIONS`)."""
    from ..config import make_config
    from ..jit import Variant
    from ..patch import patch_header, read_header

    header = read_header(stock, header_path)
    default, tail = make_config(), tail_config()
    return [
        Variant("stock", stock, expect_prefetch=False),
        Variant.patched("patched", patch_header(header, default).patched, default),
        # every v1/v2 kernel holds the tail's bulk prefetch, no reduce kernel does: the SASS check
        Variant("tail", patch_header(header, tail).patched, expect_prefetch=True),
    ]


def unpack(folder: str | Path, dest: str | Path) -> dict[str, Path]:
    """Each ``FILE.xz`` of a prepared folder unpacked into ``dest`` (once: an unpacked file of
    the same size is kept); ``{file name: path}``."""
    src, dst = Path(folder), Path(dest)
    dst.mkdir(parents=True, exist_ok=True)
    out = {}
    for packed in sorted(src.glob("*.xz")):
        target = dst / packed.name.removesuffix(".xz")
        data = lzma.decompress(packed.read_bytes())
        if not (target.is_file() and target.stat().st_size == len(data)):
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(target)
        out[target.name] = target
    return out
