"""Whether two libraries hold the same SASS, kernel by kernel (their namespaces aside).

    python scripts/sass_same.py A.so[.xz] B.so[.xz] [--skip SUBSTRING ...] > same.txt

Dumps each library with ``cuobjdump --dump-sass`` (on PATH), names each kernel without the
library's own namespace (``kvpatch_<variant>``), and prints one line per kernel both hold: the
digest of its SASS in each (``kvpatch.jit.sass``: instructions without addresses and encodings,
the namespace written ``NS``, as builds record it) and ``same`` or ``DIFFERENT``; then the kernels only one holds, and a total. ``--skip`` leaves out kernels whose name holds
the string (e.g. ``grouped``: the form only kvpatch's own launchers run). Exit 1 when a kernel
both hold differs or none is left to compare; exit 2, with one line, for a library that is not
there or that cuobjdump cannot read, and for an empty ``--skip``.
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvpatch.jit.sass import namespace_pattern, sass_functions  # noqa: E402


def kernels(lib: Path) -> dict[str, str]:
    """Kernel name (namespace removed) -> its SASS digest (:func:`kvpatch.jit.sass.sass_functions`:
    its instructions without addresses and encodings, the namespace written ``NS``)."""
    with tempfile.TemporaryDirectory() as tmp:
        so = lib
        if lib.suffix == ".xz":
            so = Path(tmp) / lib.stem
            so.write_bytes(lzma.decompress(lib.read_bytes()))
        text = subprocess.run(["cuobjdump", "--dump-sass", str(so)], check=True, capture_output=True, text=True).stdout
    namespace = so.name.removeprefix("lib").split(".")[0]  # libkvpatch_X.so -> kvpatch_X
    names = namespace_pattern(namespace)
    return {names.sub("NS", fn.symbol) if names else fn.symbol: fn.digest
            for fn in sass_functions(text.splitlines(), namespace) if fn.symbol}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--skip", action="append", default=[])
    o = ap.parse_args(argv)
    if "" in o.skip:  # an unset variable: it would skip every kernel
        ap.error("--skip '': give a part of a kernel's name")
    for p in (o.a, o.b):
        if not p.is_file():
            ap.error(f"{p}: no such library")
    if shutil.which("cuobjdump") is None:
        ap.error("cuobjdump is not on PATH (it comes with nvcc)")
    try:
        a, b = ({k: v for k, v in kernels(p).items() if not any(s in k for s in o.skip)} for p in (o.a, o.b))
    except (OSError, lzma.LZMAError) as e:
        ap.error(f"cannot read a library: {e}")
    except subprocess.CalledProcessError as e:
        said = (e.stderr or "").strip().splitlines()
        ap.error(f"cuobjdump cannot read {e.cmd[-1]}: {said[-1] if said else f'exit {e.returncode}'}")
    both = sorted(set(a) & set(b))
    differ = [k for k in both if a[k] != b[k]]
    for k in both:
        print(f"{k} {a[k]} {b[k]} {'same' if a[k] == b[k] else 'DIFFERENT'}")
    for k in sorted(set(a) - set(b)):
        print(f"{k} only in {o.a.name}")
    for k in sorted(set(b) - set(a)):
        print(f"{k} only in {o.b.name}")
    print(f"total: {len(both) - len(differ)} of {len(both)} kernels both hold have the same SASS; "
          f"{len(set(a) - set(b))} only in {o.a.name}, {len(set(b) - set(a))} only in {o.b.name}"
          + (f"; skipped: {', '.join(o.skip)}" if o.skip else ""))  # fmt: skip
    return 1 if differ or not both else 0


if __name__ == "__main__":
    sys.exit(main())
