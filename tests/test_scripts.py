"""The shell pieces the GPU-run scripts share (no GPU needed)."""

from __future__ import annotations

import lzma
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _lib_specs(libdir: Path, dest: Path) -> subprocess.CompletedProcess:
    script = 'source scripts/lib_specs.sh; lib_specs "$1" "$2"; printf "%s\\n" "${LIB_SPECS[@]}"'
    return subprocess.run(["bash", "-c", script, "lib_specs", str(libdir), str(dest)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def _release_libs(root: Path, release: str, variants: str) -> None:
    """ROOT/<release>/libs as scripts/gpu_releases.sh reads it: a stock library, libs.txt, variants.json."""
    libs = root / release / "libs"
    libs.mkdir(parents=True)
    (libs / "libkvpatch_stock.so").write_bytes(b"x")
    (libs / "libs.txt").write_text("stock=libkvpatch_stock.so:kvpatch_stock\n")
    (libs / "variants.json").write_text(variants)


def _run_libs(tmp_path: Path) -> Path:
    """A library folder as scripts/gpu_run.sh reads it: stock and patched, and libs.txt."""
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "libkvpatch_stock.so").write_bytes(b"s")
    (libs / "libkvpatch_patched.so").write_bytes(b"p")
    (libs / "libs.txt").write_text(
        "stock=libkvpatch_stock.so:kvpatch_stock\npatched=libkvpatch_patched.so:kvpatch_patched\n"
    )
    return libs


def _fake_python(path: Path, body: str) -> Path:
    """A stand-in for python3 under scripts/gpu_run.sh: its preflight checks pass, and a kvpatch
    command runs ``body`` (bash, with the command's arguments in "$@")."""
    path.write_text('#!/bin/bash\nif [[ "$1" == - ]]; then cat >/dev/null; exit 0; fi\n'
                    'if [[ "$1" == -c ]]; then echo 0; exit 0; fi\n' + body)  # fmt: skip
    path.chmod(0o755)
    return path


def test_lib_specs_lists_libraries_and_unpacks_the_xz_ones(tmp_path: Path) -> None:
    libdir, dest = tmp_path / "libs", tmp_path / "unpacked"
    libdir.mkdir()
    (libdir / "libkvpatch_stock.so.xz").write_bytes(lzma.compress(b"stock bytes"))
    (libdir / "libkvpatch_patched.so").write_bytes(b"patched bytes")
    elsewhere = tmp_path / "other" / "libx.so"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"x")
    (libdir / "libs.txt").write_text("# a comment\nstock=libkvpatch_stock.so:kvpatch_stock\n\n"
                                     f"patched=libkvpatch_patched.so:kvpatch_patched\nx={elsewhere}:kvpatch_x\n")  # fmt: skip
    done = _lib_specs(libdir, dest)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"stock={dest}/libkvpatch_stock.so:kvpatch_stock",
                                        f"patched={libdir}/libkvpatch_patched.so:kvpatch_patched",
                                        f"x={elsewhere}:kvpatch_x"]  # fmt: skip
    assert (dest / "libkvpatch_stock.so").read_bytes() == b"stock bytes"


def test_lib_specs_stops_on_a_missing_library(tmp_path: Path) -> None:
    (tmp_path / "libs.txt").write_text("stock=libkvpatch_stock.so:kvpatch_stock\n")
    done = _lib_specs(tmp_path, tmp_path / "unpacked")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == f"error: {tmp_path}/libkvpatch_stock.so (from {tmp_path}/libs.txt) not found"


def test_gpu_releases_packs_each_release_as_it_finishes(tmp_path: Path) -> None:
    """PACK=1: one OUT/<release>.tgz per release, no folders left (the device tool brings back few files)."""
    import tarfile

    for v in ("0.6.4", "0.8.5"):
        _release_libs(tmp_path / "root", v, f'{{"release": "{v}"}}')
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "OUT": str(out), "PACK": "1", "VALIDATE": "0", "HELDOUT": "0",
           "UNPACK": str(tmp_path / "unpacked"), "HOME": str(tmp_path)}  # fmt: skip
    done = subprocess.run(["bash", "scripts/gpu_releases.sh", str(tmp_path / "root")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir() if p.name != "nvidia-smi-end.csv") == ["0.6.4.tgz", "0.8.5.tgz"]
    with tarfile.open(out / "0.8.5.tgz") as tar:
        assert tar.extractfile("0.8.5/variants.json").read() == b'{"release": "0.8.5"}'


@pytest.mark.parametrize("aa, expected", [("1", True), ("0", False)])
def test_gpu_releases_passes_the_aa_twin_to_the_held_out_bench(tmp_path: Path, aa: str, expected: bool) -> None:
    """AA=1 adds bench --aa (stock timed against itself) to each release's held-out run; without it,
    the bench runs as before."""
    _release_libs(tmp_path / "root", "0.9.2", "{}")
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls.txt"
    (fake / "python3").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (fake / "python3").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "VALIDATE": "0", "AA": aa,
           "UNPACK": str(tmp_path / "unpacked"), "HOME": str(tmp_path)}  # fmt: skip
    done = subprocess.run(["bash", "scripts/gpu_releases.sh", str(tmp_path / "root")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    bench = [line.split() for line in calls.read_text().splitlines() if "bench" in line.split()]
    assert len(bench) == 1 and "--set" in bench[0]
    assert ("--aa" in bench[0]) is expected


@pytest.mark.slow
def test_gpu_run_packs_what_finished_when_stopped_by_a_signal(tmp_path: Path) -> None:
    """PACK=1 under an outer `timeout`: the run is cut, and OUT still ends as one archive holding
    what was written before the signal (run 26 lost a cut stage's records: too many files)."""
    import tarfile

    libs = _run_libs(tmp_path)
    fake = _fake_python(tmp_path / "python",  # validate writes and hangs
                        'while [[ $# -gt 0 ]]; do [[ "$1" == --json ]] && echo partial > "$2.part"; shift; done\n'
                        'sleep 60\n')  # fmt: skip
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "OUT": str(out), "PACK": "1", "PYTHON": str(fake), "HOME": str(tmp_path),
           "UNPACK": str(tmp_path / "unpacked")}  # fmt: skip
    done = subprocess.run(["timeout", "4", "bash", "scripts/gpu_run.sh", str(libs), "full"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 124, done.stderr  # cut: never a success
    assert "stopped by a signal" in done.stderr
    assert [p.name for p in out.iterdir()] == ["gpu-run.tgz"]
    with tarfile.open(out / "gpu-run.tgz") as tar:
        assert tar.extractfile("./validate-full.json.part").read() == b"partial\n"


def test_gpu_run_packs_the_upstream_records_but_not_vllms_test_files(tmp_path: Path) -> None:
    """PACK=1 after validate --upstream: the archive holds its records and leaves out upstream/run,
    the copy of vLLM's test files it ran (vLLM source, which is never committed with results)."""
    import tarfile

    libs = _run_libs(tmp_path)
    tree = tmp_path / "vllm-0.10.2"
    tree.mkdir()
    fake = _fake_python(tmp_path / "python",  # validate --upstream writes a record and a run dir
                        'while [[ $# -gt 0 ]]; do if [[ "$1" == --upstream-dir ]]; then mkdir -p "$2/run/tests" "$2/record-stock";\n'
                        '  echo vllm > "$2/run/tests/test_attention.py"; echo rec > "$2/record-stock/record-gw0.jsonl"; fi; shift; done\n')  # fmt: skip
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "OUT": str(out), "PACK": "1", "PYTHON": str(fake), "HOME": str(tmp_path),
           "UNPACK": str(tmp_path / "unpacked"), "TREE": str(tree)}  # fmt: skip
    done = subprocess.run(["bash", "scripts/gpu_run.sh", str(libs), "upstream"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert [p.name for p in out.iterdir()] == ["gpu-run.tgz"], done.stderr
    with tarfile.open(out / "gpu-run.tgz") as tar:
        names = tar.getnames()
    assert "./upstream/record-stock/record-gw0.jsonl" in names
    assert not [n for n in names if n.startswith("./upstream/run")]


@pytest.mark.slow
@pytest.mark.network
def test_vllm_ops_registers_each_op_as_the_release_does(vllm_release) -> None:
    """scripts/vllm_ops.py's registration unit: the release's own schema text and dispatch key per
    op (kCUDA, or a catch-all where torch_bindings.cpp gives none), in the release's library, and the
    CUTLASS capability queries answered false in the same unit (ops.h defines a function: one unit)."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import vllm_ops
    finally:
        sys.path.pop(0)
    text = (vllm_release("0.10.2") / "csrc" / "torch_bindings.cpp").read_text(encoding="utf-8")
    regs = vllm_ops.registrations(text)
    assert regs["rms_norm"] == ("ops", "kCUDA", "rms_norm")
    assert regs["reshape_and_cache"] == ("cache_ops", "kCUDA", "reshape_and_cache")
    assert regs["get_device_attribute"] == ("cuda_utils", None, "get_device_attribute")
    assert regs["cutlass_scaled_mm_supports_fp8"] == ("ops", None, "cutlass_scaled_mm_supports_fp8")
    assert (
        regs["per_token_group_fp8_quant"][2] != "per_token_group_fp8_quant"
    )  # an impl whose function has another name
    chosen = {
        op: regs[op]
        for op in ("paged_attention_v1", "swap_blocks", "get_device_attribute", "cutlass_group_gemm_supported")
    }
    unit = vllm_ops.bindings_source(text, chosen)
    assert 'ops.def("paged_attention_v1(Tensor! out, Tensor query, Tensor key_cache,' in unit
    assert 'ops.impl("paged_attention_v1", torch::kCUDA, &paged_attention_v1);' in unit
    assert 'cache_ops.impl("swap_blocks", torch::kCUDA, &swap_blocks);' in unit
    assert 'cuda_utils.impl("get_device_attribute", &get_device_attribute);' in unit
    assert "bool cutlass_group_gemm_supported(int64_t) { return false; }" in unit
    assert unit.count("TORCH_LIBRARY_EXPAND(") == 3 and unit.rstrip().endswith(
        "REGISTER_EXTENSION(TORCH_EXTENSION_NAME)"
    )


def _sass_same(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """scripts/sass_same.py with a stand-in cuobjdump that prints the 'library' file itself."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "cuobjdump"
    fake.write_text('#!/bin/bash\ncat "$2"\n')
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run([sys.executable, "scripts/sass_same.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False, env=env)  # fmt: skip


def _dump(path: Path, prefix: str, kernels: dict[str, str]) -> Path:
    lines = []
    for name, instruction in kernels.items():
        lines += [f"\t\tFunction : _ZN{len(prefix)}{prefix}{len(name)}{name}Ev",
                  f"        /*0000*/                   {instruction} ;    /* 0x000000000000000000000000000000 */"]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def test_sass_same_compares_kernels_across_namespaces_and_refuses_to_compare_nothing(tmp_path: Path) -> None:
    a = _dump(tmp_path / "libkvpatch_a.so", "kvpatch_a", {"k1": "MOV R1, R2", "k2": "EXIT"})
    b = _dump(tmp_path / "libkvpatch_b.so", "kvpatch_b", {"k1": "MOV R1, R2", "k2": "EXIT"})
    c = _dump(tmp_path / "libkvpatch_c.so", "kvpatch_c", {"k1": "MOV R1, R3", "k2": "EXIT"})
    same = _sass_same(tmp_path, str(a), str(b))
    assert same.returncode == 0 and "total: 2 of 2" in same.stdout, same.stderr
    differ = _sass_same(tmp_path, str(a), str(c))
    assert differ.returncode == 1 and "DIFFERENT" in differ.stdout
    nothing = _sass_same(tmp_path, str(a), str(b), "--skip", "k")  # every kernel skipped: no verdict
    assert nothing.returncode == 1 and "total: 0 of 0" in nothing.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["--skip", ""], "--skip ''"), ([], "no such library"), (["--skip", "x"], "no such library")],
)
def test_sass_same_refuses_bad_arguments_in_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    a = _dump(tmp_path / "libkvpatch_a.so", "kvpatch_a", {"k1": "EXIT"})
    proc = _sass_same(tmp_path, str(a), str(tmp_path / "missing.so") if needle == "no such library" else str(a), *args)
    assert proc.returncode == 2 and needle in proc.stderr.splitlines()[-1] and "Traceback" not in proc.stderr
