"""Build the libraries scripts/gpu_run.sh needs, here (nvcc, no GPU), into one folder.

    python scripts/gpu_prepare.py --vllm 0.10.2 --out .gpu/libs [--variant NAME=config.toml ...]

Builds vLLM's full kernel set (every dtype, head size, block size and KV-cache dtype
its paged_attention_v1.cu instantiates) for ``stock`` and ``patched`` (kvpatch's
default configuration, or ``--config``), and the headline shapes only (fp16/bf16, head
128, block 16, auto cache) for ``paper`` (the paper preset), ``control`` (the default
with the prefetch compiled in but never run) and any ``--variant NAME=kvpatch.toml``,
for sm_90a. Copies each library into ``--out`` xz-compressed (a full-set library is
~50 MB, ~5x smaller packed; gpu_run.sh unpacks) and writes:

* ``libs.txt``: one ``NAME=FILE.so:PREFIX`` per line (FILE relative to the folder): what
  ``kvpatch validate/bench --lib`` take;
* ``variants.json``: per variant its configuration marker (the ``// kvpatch:begin`` line),
  nvcc compile flags, archs and the configurations built (``--variant-info``);
* ``build.json``: the build result (registers, spills, SASS check per kernel).

nvcc here is the same 13.0 as on the lent H200, whose SASS matched instruction for
instruction (measured before this project's first GPU run). The files of the release that the GPU run reads
(vLLM's kernel test and its helpers, vllm/utils, the launcher that lists the kernel
set) are copied to ``--out``/../vllm-X (a few hundred kB: not the whole tree).
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's kvpatch, not an installed one

from rich.console import Console  # noqa: E402
from rich.markup import escape  # noqa: E402

from kvpatch import jit as B  # noqa: E402
from kvpatch.cli.base import TerminalProgress  # noqa: E402
from kvpatch.commands.common import build_code, local_machine  # noqa: E402
from kvpatch.commands.tune import tune_build_spec  # noqa: E402
from kvpatch.config import load_config_file, make_config  # noqa: E402
from kvpatch.config.toml import check_variant_name  # noqa: E402
from kvpatch.errors import UsageError  # noqa: E402
from kvpatch.render import build_table  # noqa: E402
from kvpatch.source.fetch import fetch_release  # noqa: E402
from kvpatch.source.releases import HEADER, revision_of  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm", default="0.10.2")
    ap.add_argument(
        "--tree",
        type=Path,
        help="a vLLM source tree to build from instead of fetching --vllm (e.g. on the GPU machine)",
    )
    ap.add_argument("--out", type=Path, default=Path(".gpu/libs"))
    ap.add_argument("--arch", default="9.0a")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--config", type=Path, help="kvpatch.toml for 'patched' (default: kvpatch's default)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=config.toml")
    ap.add_argument("--no-tree", action="store_true", help="do not copy the release tree beside the libraries")
    ap.add_argument(
        "--tune",
        action="store_true",
        help="build what `kvpatch tune --lib` takes instead: stock and every candidate of the grid, "
        "for the tuned instantiations only",
    )
    ap.add_argument(
        "--grid",
        action="append",
        default=[],
        help="with --tune: kvpatch tune's --grid (e.g. 'min-group=2;min-ctas=1,1024'; repeatable: the union)",
    )
    ap.add_argument(
        "--incumbent",
        metavar="NAME",
        help="with --tune: also build the configuration in use (--config, or kvpatch's default) as candidate NAME, "
        "for kvpatch tune --incumbent NAME",
    )
    ap.add_argument("--dtype", action="append", default=[], help="with --tune: build only this dtype's instantiations")
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        help="with --tune: build only the instantiations kvpatch tune --only SELECTOR measures (e.g. fp16/128/16)",
    )
    ap.add_argument(
        "--kernels",
        choices=("full", "tuned"),
        default="full",
        help="stock + patched: vLLM's full kernel set, or the tuned instantiations with auto and fp8 caches",
    )
    ap.add_argument("--no-small", action="store_true", help="no paper/control variants")
    ap.add_argument(
        "--variant-kernels",
        choices=("headline", "tuned"),
        default="headline",
        help="what paper/control/--variant are built for: the headline shapes, or the tuned "
        "instantiations with auto and fp8 caches (what the held-out set runs)",
    )
    args = ap.parse_args()
    if args.incumbent is not None:
        try:
            if not args.tune or args.incumbent == "stock":
                raise UsageError("--incumbent goes with --tune and names a candidate other than stock")
            check_variant_name(args.incumbent)
        except UsageError as e:
            ap.error(str(e))

    console = Console(stderr=True)
    tree = args.tree.resolve() if args.tree else fetch_release(args.vllm, console=console)
    path = tree / HEADER
    stock = path.read_text(encoding="utf-8")
    default = make_config(**load_config_file(args.config)) if args.config else make_config()
    small = {} if args.no_small else {"paper": make_config(preset="paper"), "control": replace(default, control=True)}
    for item in args.variant:
        name, _, toml = item.partition("=")
        small[name] = make_config(**load_config_file(Path(toml)))
    if args.tune:
        from kvpatch.tune import candidates, parse_grids

        grids = parse_grids(args.grid)
        configs = candidates(default, grids)
        if args.incumbent:
            if args.incumbent in configs:
                ap.error(f"--incumbent {args.incumbent!r} names one of the grid's candidates")
            configs[args.incumbent] = default
        specs = [tune_build_spec(tree, B.patched_variants(stock, str(path), configs), args.arch,
                                 dtypes=args.dtype or None, only=args.only)]  # fmt: skip
        small = {}
    else:
        full_variants = B.patched_variants(stock, str(path), {"patched": default})
        if args.kernels == "full":
            specs = [B.make_spec(tree, full_variants, args.arch, all_kernels=True)]
        else:
            specs = [_tuned_spec(tree, full_variants, args.arch)]
    small_variants = B.patched_variants(stock, str(path), small)[1:] if small else []
    if small_variants and args.variant_kernels == "headline":
        specs.append(B.make_spec(tree, small_variants, args.arch, dtypes=["fp16", "bf16"], head_sizes=[128],
                                 block_sizes=[16], kv_cache_dtypes=["auto"]))  # fmt: skip
    elif small_variants:
        specs.append(_tuned_spec(tree, small_variants, args.arch))
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    nvcc = local_machine().nvcc
    lines, info, builds = [], {}, []
    progress = TerminalProgress(console)
    for spec in specs:
        result = B.build(spec, jobs=args.jobs, progress=progress)
        progress.close()
        builds.append(result.to_dict())
        for v, r in zip(spec.variants, result.variants):
            dest = out / (Path(r.library).name + ".xz")
            dest.write_bytes(lzma.compress(Path(r.library).read_bytes(), preset=6))
            lines.append(f"{r.name}={Path(r.library).name}:{r.prefix}")
            info[r.name] = {"marker": v.marker, "compile_flags": list(r.compile_flags),
                            "archs": list(r.archs), "configs": len(r.configs), "vllm": revision_of(stock) or args.vllm,
                            "nvcc": nvcc, "code": build_code(r)}  # fmt: skip
        console.print(build_table(result))
        for warning in result.split_warnings() + result.schedule_warnings():
            console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
    (out / "libs.txt").write_text("\n".join(lines) + "\n")
    (out / "variants.json").write_text(json.dumps(info, indent=1) + "\n")
    (out / "build.json").write_text(json.dumps(builds, indent=1) + "\n")
    if not args.no_tree:
        dest = out.parent / f"vllm-{revision_of(stock) or args.vllm}"
        copy_slim_tree(tree, dest)
        console.print(f"tree (the files the GPU run reads): {dest}")
    print("\n".join(lines))


def _tuned_spec(tree: Path, variants: list, arch: str):
    """The tuned instantiations (fp16/bf16 x head 64/128/256 x block 16/32), auto and fp8 caches."""
    return tune_build_spec(tree, variants, arch, kv_cache_dtypes=("auto", "fp8"))


def copy_slim_tree(tree: Path, dest: Path) -> None:
    """What validate --upstream and --full read: the kernel test, its neighbours, vllm/utils, the launcher."""
    from kvpatch.gpu.upstream import find_test

    test = Path(find_test(tree).path)
    wanted = [
        test,
        test.parent / "conftest.py",
        Path("tests/kernels/allclose_default.py"),
        Path("csrc/attention/paged_attention_v1.cu"),
        Path(HEADER),
        Path("vllm/utils.py"),
    ]
    wanted += [d / "__init__.py" for d in list(reversed(test.parents))[1:]]
    wanted += [p.relative_to(tree) for p in (tree / "vllm/utils").glob("*.py")]
    for rel in wanted:
        if (tree / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tree / rel, dest / rel)


if __name__ == "__main__":
    main()
