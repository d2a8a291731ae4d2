"""The two tests of vLLM's test_paged_attention that ran out of GPU memory in this run's parallel
pass (8 xdist workers), run again alone against the same libraries (stock and tune-17), with the
outputs compared bit for bit as `validate --upstream` does. On the GPU machine, from the checkout:

    OUT=... PYTHONPATH=$PWD python3 benchmarks/results/releases-tune-17/0.10.2/upstream_again.py .gpu/t17/libs
"""
import json
import lzma
import os
import sys
from pathlib import Path

from kvpatch.gpu.launch import LibSpec
from kvpatch.gpu.upstream import run_upstream

TESTS = ["test_paged_attention[cuda:0-0-fp8-dtype0-32-True-256-num_heads0-7-v1]",
         "test_paged_attention[cuda:0-0-fp8-dtype0-32-True-256-num_heads1-7-v2]"]
libdir = Path(sys.argv[1])
out = Path(os.environ["OUT"]) / "upstream-again"
unpacked = Path("/tmp/upstream-again-libs")
unpacked.mkdir(parents=True, exist_ok=True)
libs = []
for line in (libdir / "libs.txt").read_text().split():
    name, rest = line.split("=", 1)
    file, prefix = rest.rsplit(":", 1)
    (unpacked / file).write_bytes(lzma.open(libdir / f"{file}.xz").read())
    libs.append(LibSpec(name, str(unpacked / file), prefix))
rep = run_upstream(libdir.parent / "vllm-0.10.2", libs, out, release="0.10.2", workers=2, tests=TESTS)
(out / "report.json").write_text(json.dumps(rep.to_dict(), indent=1))
for r in rep.runs:
    print(r.name, "passed", r.passed, "failed", r.failed, "outputs", r.outputs, "rc", r.returncode)
print("identical", rep.identical, "differing", rep.differing, "notes", rep.notes, "ok", rep.ok)
