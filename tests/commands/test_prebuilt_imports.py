"""The GPU commands on prebuilt libraries run on a GPU machine that has torch and little else:
they import nothing of what fetching and patching need (GitPython, libclang, the index's
client), and run where platformdirs cannot be imported (their output checks keep kvpatch's cache
where ``KVPATCH_CACHE`` or platformdirs names one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = r"""
import sys
from pathlib import Path

class Absent:  # this machine has no platformdirs
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "platformdirs":
            raise ImportError(f"no module named {name!r}")
        return None

sys.meta_path.insert(0, Absent())
import kvpatch.commands.common as common
import kvpatch.gpu.env as env

class NoGpu(Exception):
    pass

def no_gpu(*a, **k):
    raise NoGpu()

env.require_cuda = no_gpu
common.require_device = lambda device: no_gpu()
libs = Path(sys.argv[1])
for n in ("stock", "patched"):
    (libs / f"lib{n}.so").write_bytes(b"x")
lib_args = [f"stock={libs}/libstock.so:kvpatch_stock", f"patched={libs}/libpatched.so:kvpatch_patched"]
from kvpatch.commands import bench, decode, validate
decode.require_device = common.require_device
bench.require_device = common.require_device
validate.require_device = common.require_device
cases = {
    "bench-decode": lambda: decode.run(decode.DecodeOptions(libs=lib_args, cwd=libs)),
    "bench": lambda: bench.run(bench.BenchOptions(libs=lib_args, cwd=libs)),
    "validate": lambda: validate.run(validate.ValidateOptions(libs=lib_args, cwd=libs)),
}
for name, call in cases.items():
    try:
        call()
    except NoGpu:
        pass
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"git", "clang", "pypi_simple", "requests"})
print("HEAVY", ",".join(heavy))
"""


@pytest.mark.slow
def test_gpu_commands_on_prebuilt_libraries_import_nothing_of_fetching(tmp_path):
    proc = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})  # fmt: skip
    line = next((x for x in proc.stdout.splitlines() if x.startswith("HEAVY")), None)
    assert line is not None, proc.stderr[-2000:]
    assert line == "HEAVY ", line
