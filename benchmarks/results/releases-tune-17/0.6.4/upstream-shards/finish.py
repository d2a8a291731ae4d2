"""Run named cases of vLLM 0.6.4's test_paged_attention against stock and tune-17, two workers
each, and write the report (the cases the two shard runs left unfinished: see README.md).
Usage: python finish.py LIBDIR TREE OUT NAMES.txt"""
import json
import lzma
import sys
from pathlib import Path

from kvpatch.gpu.launch import LibSpec
from kvpatch.gpu.upstream import run_upstream

libdir, tree, out, names = (Path(a) for a in sys.argv[1:5])
unpack = Path("/tmp/kvpatch-finish")
unpack.mkdir(exist_ok=True)
libs = []
for name in ("stock", "patched"):
    so = unpack / f"libkvpatch_{name}.so"
    so.write_bytes(lzma.decompress((libdir / f"libkvpatch_{name}.so.xz").read_bytes()))
    libs.append(LibSpec(name, str(so), f"kvpatch_{name}"))
tests = [t for t in names.read_text().split() if t]
rep = run_upstream(tree, libs, out, release=tree.name, workers=4, timeout=230, tests=tests, progress=print)
(out / "report.json").write_text(json.dumps(rep.to_dict(), indent=1))
print({r.name: (r.passed, r.failed, r.skipped, r.outputs) for r in rep.runs}, rep.identical, rep.notes)
