"""What a build compiles for and with: vLLM's ``TORCH_CUDA_ARCH_LIST`` syntax (kvpatch.arch),
the nvcc that is found and the archs it targets, and the SASS tools (kvpatch.jit.toolchain)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from kvpatch.arch import is_hopper
from kvpatch.errors import BuildError, UsageError
from kvpatch.jit import Arch, Toolchain, find_inspector, find_nvcc, parse_arch_list, validate_archs

# kvpatch.jit re-exports a function named like the module (toolchain)
TOOLCHAIN = importlib.import_module("kvpatch.jit.toolchain")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("9.0a", [Arch(9, 0, "a")]),
        ("9.0", [Arch(9, 0)]),
        ("8.0;9.0a", [Arch(8, 0), Arch(9, 0, "a")]),
        ("8.0 9.0", [Arch(8, 0), Arch(9, 0)]),
        ("9.0+PTX", [Arch(9, 0, ptx=True)]),
        (" 8.6 ; 8.6;10.0a ", [Arch(8, 6), Arch(10, 0, "a")]),
    ],
)
def test_parse_arch_list(text, expected):
    assert parse_arch_list(text) == expected


@pytest.mark.parametrize("text", ["", " ; ", "sm_90", "90a", "9", "9.0b", "8.0a", "9.0+SASS", "nine"])
def test_parse_arch_list_rejects(text):
    with pytest.raises(UsageError) as e:
        parse_arch_list(text)
    assert "\n" not in str(e.value)


def test_gencode_flags():
    assert Arch(9, 0, "a").gencode_flags() == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert Arch(8, 0).gencode_flags() == ["-gencode=arch=compute_80,code=sm_80"]
    assert Arch(9, 0, ptx=True).gencode_flags() == [
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90",
    ]
    assert [str(a) for a in parse_arch_list("8.0;9.0a;9.0+PTX")] == ["8.0", "9.0a", "9.0+PTX"]


def test_validate_archs_names_supported_ones():
    tc = Toolchain(
        Path("nvcc"), "Cuda compilation tools, release 13.0, V13.0.88", ("compute_75", "compute_80", "compute_90")
    )
    validate_archs(parse_arch_list("8.0;9.0a"), tc)
    with pytest.raises(BuildError, match=r"nvcc 13.0 cannot compile for 7.0; it supports 7.5 8.0 9.0"):
        validate_archs(parse_arch_list("7.0;9.0a"), tc)


def test_missing_nvcc(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BuildError, match=r"^nvcc not found on PATH \(set CUDA_HOME or PATH\)$"):
        find_nvcc()


def test_cuda_home_wins_over_path(monkeypatch, tmp_path):
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert find_nvcc() == nvcc


def test_missing_sass_tools(monkeypatch):
    monkeypatch.setattr(TOOLCHAIN, "find_cuda_tool", lambda name, nvcc=None: None)
    with pytest.raises(BuildError, match="pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"):
        find_inspector()
    monkeypatch.setattr(TOOLCHAIN, "find_cuda_tool", lambda name, nvcc=None: None if name == "nvdisasm" else Path(name))
    with pytest.raises(BuildError, match=r"^nvdisasm not found .*: pip install nvidia-cuda-nvdisasm$"):
        find_inspector()


@pytest.mark.parametrize(("code", "hopper"), [("sm_90a", True), ("sm_90", True), ("sm_100", False), ("sm_100f", False),
                                              ("sm_120", False), ("sm_89", False), ("sm_80", False)])  # fmt: skip
def test_only_hoppers_sass_is_expected_to_prefetch(code: str, hopper: bool) -> None:
    assert is_hopper(code) is hopper
