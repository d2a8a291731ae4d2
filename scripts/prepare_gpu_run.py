"""Build variant libraries here (no GPU needed) for a run on a GPU machine.

    python scripts/prepare_gpu_run.py --vllm 0.10.2 --out .gpu/run --set bench \
        --variant patched= --variant kvhead=scope=kv-head,placement=end ...

Each ``--variant NAME=key=value,...`` is a patch configuration (empty: the default).
``stock`` is always built. Libraries are copied into ``--out`` with ``libs.txt``
(one ``NAME=PATH:PREFIX`` per line, paths relative to the repository root, the form
``kvpatch bench --lib`` takes) and ``variants.json`` (each variant's
configuration), so that a command on the GPU machine needs nothing but this folder.
nvcc here is the same 13.0 as on the lent H200, whose SASS matched instruction for
instruction (see ../shared/NOTES.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from rich.console import Console

from kvpatch import build as B
from kvpatch.config import make_config, parse_override
from kvpatch.render import build_table
from kvpatch.source.fetch import HEADER, fetch_release

SETS = {
    # the bench's default matrix: GQA 32/8, head 128, block 16, fp16 + bf16, auto cache
    "bench": dict(dtypes=["fp16", "bf16"], head_sizes=[128], block_sizes=[16], kv_cache_dtypes=["auto"]),
    # kvpatch validate's default matrix (not --full: that is every size vLLM builds)
    "validate": dict(dtypes=["fp16", "bf16", "fp32"], head_sizes=[64, 128, 256], block_sizes=[16, 32],
                     kv_cache_dtypes=["auto", "fp8"]),
    # spot checks: other head/block sizes and the fp8 cache
    "spot": dict(dtypes=["fp16", "bf16"], head_sizes=[64, 128, 256], block_sizes=[16, 32],
                 kv_cache_dtypes=["auto", "fp8"]),
}  # fmt: skip


def parse_variant(text: str) -> tuple[str, dict]:
    """``NAME=key=value,...`` -> (name, options), the settings read as ``--fp16`` reads its own."""
    name, _, rest = text.partition("=")
    return name, parse_override(rest)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm", default="0.10.2")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", choices=sorted(SETS), default="bench")
    ap.add_argument("--arch", default="9.0a")
    ap.add_argument("--variant", action="append", default=[])
    args = ap.parse_args()

    console = Console(stderr=True)
    tree = fetch_release(args.vllm, console=console)
    path = tree / HEADER
    stock = path.read_text(encoding="utf-8")
    configs = {name: make_config(**options) for name, options in map(parse_variant, args.variant)}
    variants = B.patched_variants(stock, str(path), configs)
    spec = B.make_spec(tree, variants, args.arch, **SETS[args.set])
    result = B.build(spec, console=console)
    if result.problems():
        raise SystemExit("SASS check failed: " + "; ".join(result.problems()))
    args.out.mkdir(parents=True, exist_ok=True)
    lines = []
    for v in result.variants:
        dest = args.out / Path(v.library).name
        shutil.copy2(v.library, dest)
        lines.append(f"{v.name}={dest}:{v.prefix}")
    (args.out / "libs.txt").write_text("\n".join(lines) + "\n")
    markers = {"stock": "stock", **{name: cfg.marker() for name, cfg in configs.items()}}
    (args.out / "variants.json").write_text(json.dumps(markers, indent=1) + "\n")
    (args.out / "build.json").write_text(json.dumps(result.to_dict(), indent=1) + "\n")
    console.print(build_table(result))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
