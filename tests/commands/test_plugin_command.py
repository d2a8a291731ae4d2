"""``kvpatch plugin``: which release a tree holds, whether it fits the installed vLLM, and
the enable/disable/status round trip as a user types it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvpatch.commands import plugin as P
from kvpatch.commands.tree import tree_release
from kvpatch.errors import UsageError
from kvpatch.source.releases import HEADER
from kvpatch.source.workspace import State, Tree
from kvpatch.vllm_plugin import KernelSet, read_bundle, write_bundle

STOCK_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "attention_kernels.cuh"


def make_tree(root: Path) -> Path:
    """A vLLM-shaped tree holding the stock fixture header."""
    (root / HEADER).parent.mkdir(parents=True)
    (root / HEADER).write_bytes(STOCK_FIXTURE.read_bytes())
    return root


def _kvpatch(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "kvpatch", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)  # fmt: skip


# --------------------------------------------------------------------------- the tree's release


def test_a_tree_kvpatch_fetched_is_the_release_the_apply_recorded(tmp_path):
    tree = make_tree(tmp_path / "vllm")
    State(tree=str(tree), version="0.10.2", config={}, marker=None).save(tmp_path)
    assert tree_release(Tree(tree), tmp_path) == "0.10.2"


def test_an_sdist_tree_says_its_release_in_pkg_info(tmp_path):
    tree = make_tree(tmp_path / "vllm")
    (tree / "PKG-INFO").write_text("Metadata-Version: 2.4\nName: vllm\nVersion: 0.9.2\n\nVersion: 9.9\n")
    assert tree_release(Tree(tree), tmp_path) == "0.9.2"


def test_the_sdists_own_word_beats_a_hand_edited_record_of_the_apply(tmp_path):
    """A record edited to another release cannot make a bundle claim it (the kernels are the tree's)."""
    tree = make_tree(tmp_path / "vllm")
    (tree / "PKG-INFO").write_text("Metadata-Version: 2.4\nName: vllm\nVersion: 0.10.2\n")
    State(tree=str(tree), version="0.6.4", config={}, marker=None).save(tmp_path)
    assert tree_release(Tree(tree), tmp_path) == "0.10.2"


def test_a_release_that_contradicts_the_trees_is_refused_before_anything_is_built(tmp_path, monkeypatch):
    tree = make_tree(tmp_path / "vllm")
    (tree / "PKG-INFO").write_text("Metadata-Version: 2.4\nName: vllm\nVersion: 0.10.2\n")
    monkeypatch.setattr(P, "_full_build", lambda *a, **k: pytest.fail("built for a release the tree is not"))
    with pytest.raises(UsageError, match=r"--release 0\.9\.2 contradicts the tree, which holds vLLM 0\.10\.2"):
        P.enable(P.EnableOptions(tree=tree, cwd=tmp_path, release="0.9.2", directory=tmp_path / "b"))
    assert not (tmp_path / "b").exists()


def test_a_tree_that_says_nothing_has_no_release_and_enable_asks_for_one(tmp_path):
    tree = make_tree(tmp_path / "vllm")
    (tree / "PKG-INFO").write_text("Name: vllm\nVersion: not-a-number\n")
    assert tree_release(Tree(tree), tmp_path) is None
    with pytest.raises(UsageError, match="pass --release X"):
        P.enable(P.EnableOptions(tree=tree, cwd=tmp_path))


# --------------------------------------------------------------------------- the installed vLLM


def test_the_same_release_with_a_local_label_fits():
    assert P.check_match("0.10.2", "0.10.2+cu128") == []


def test_another_release_is_refused_with_the_apply_that_fits():
    with pytest.raises(
        UsageError, match=r"has vLLM 0\.9\.2 and the tree is vLLM 0\.10\.2: run 'kvpatch apply --vllm 0\.9\.2'"
    ):
        P.check_match("0.10.2", "0.9.2")


def test_without_vllm_the_bundle_waits_for_it():
    (line,) = P.check_match("0.10.2", None)
    assert "vLLM is not installed" in line and "0.10.2" in line


def test_a_release_without_the_v0_engine_is_said_to_be_one():
    (line,) = P.check_match("0.11.2", "0.11.2")
    assert "no V0 engine" in line


def test_a_mismatch_is_refused_before_anything_is_built(tmp_path, monkeypatch):
    tree = make_tree(tmp_path / "vllm")
    monkeypatch.setattr(P, "installed_vllm", lambda: "0.9.2")
    import kvpatch.jit as jit

    monkeypatch.setattr(jit, "build", lambda *a, **k: pytest.fail("built despite the mismatch"))
    with pytest.raises(UsageError, match="has vLLM 0.9.2"):
        P.enable(P.EnableOptions(tree=tree, cwd=tmp_path, release="0.10.2"))


def test_a_stock_tree_is_refused_one_line_exit_2(tmp_path):
    tree = make_tree(tmp_path / "vllm")
    (tree / "csrc" / "torch_bindings.cpp").write_text(
        'ops.def("paged_attention_v1(Tensor! out) -> ()");\nops.def("paged_attention_v2(Tensor! out) -> ()");\n'
    )
    r = _kvpatch(
        "plugin", "enable", "--tree", str(tree), "--release", "0.10.2", "--dir", str(tmp_path / "b"), cwd=tmp_path
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: kvpatch plugin enable: ") and "is stock: run 'kvpatch apply' first" in r.stderr
    assert r.stderr.count("\n") == 1 and not (tmp_path / "b").exists()


# --------------------------------------------------------------------------- status and disable


def _fake_bundle(where: Path, tmp_path: Path) -> None:
    lib = tmp_path / "libkvpatch_patched.so"
    lib.write_bytes(b"\x7fELF not really")
    ks = KernelSet(("fp16",), ("auto",), (128,), (16,))
    write_bundle(lib, vllm_release="0.10.2", header_revision="815bd481", marker="m", archs=("sm_90a",),
                 prefix="kvpatch_patched", configs=ks.labels(), kernel_set=ks,
                 schemas={"paged_attention_v1": "paged_attention_v1(Tensor! out) -> ()",
                          "paged_attention_v2": "paged_attention_v2(Tensor! out) -> ()"},
                 scale_by_value=False, directory=where)  # fmt: skip


def test_status_without_a_bundle_says_how_to_enable_and_exits_1(tmp_path):
    r = _kvpatch("plugin", "status", "--dir", str(tmp_path / "none"), cwd=tmp_path)
    assert r.returncode == 1
    assert "not enabled" in r.stdout and "kvpatch plugin enable" in r.stdout


def test_status_json_is_the_decision(tmp_path):
    r = _kvpatch("plugin", "status", "--dir", str(tmp_path / "none"), "--json", "-", cwd=tmp_path)
    d = json.loads(r.stdout)
    assert d["action"] == "off" and d["bundle"] == str(tmp_path / "none")


def test_status_switched_off_says_so(tmp_path):
    where = tmp_path / "bundle"
    _fake_bundle(where, tmp_path)
    r = _kvpatch("plugin", "status", "--dir", str(where), cwd=tmp_path, env={"KVPATCH_DISABLE": "1"})
    assert r.returncode == 1 and "KVPATCH_DISABLE=1 switches the plugin off" in r.stdout


def test_disable_removes_the_bundle_and_then_has_nothing_to_remove(tmp_path):
    where = tmp_path / "bundle"
    _fake_bundle(where, tmp_path)
    (where / "mine.txt").write_text("not kvpatch's")
    r = _kvpatch("plugin", "disable", "--dir", str(where), cwd=tmp_path)
    assert r.returncode == 0 and "removed the bundle" in r.stdout
    assert read_bundle(where) is None and [p.name for p in where.iterdir()] == ["mine.txt"]
    r = _kvpatch("plugin", "disable", "--dir", str(where), cwd=tmp_path)
    assert r.returncode == 0 and "nothing to remove" in r.stdout


def test_a_damaged_manifest_says_what_does_remove_it(tmp_path):
    """status's fix for a damaged manifest is what works: enable again, or delete the file (before,
    it said 'kvpatch plugin disable', which refuses a damaged manifest by design)."""
    where = tmp_path / "bundle"
    where.mkdir()
    (where / "bundle.json").write_text("{")
    r = _kvpatch("plugin", "status", "--dir", str(where), cwd=tmp_path)
    assert r.returncode == 1 and f"or delete {where / 'bundle.json'}" in r.stdout, r.stdout
    assert "plugin disable" not in r.stdout
    r = _kvpatch("plugin", "disable", "--dir", str(where), cwd=tmp_path)
    assert r.returncode == 1 and f"delete {where / 'bundle.json'} yourself" in r.stderr
    assert (where / "bundle.json").read_text() == "{"


def test_disable_of_a_dir_that_is_a_file_is_a_usage_error(tmp_path):
    (tmp_path / "file").write_text("x")
    r = _kvpatch("plugin", "disable", "--dir", str(tmp_path / "file"), cwd=tmp_path)
    assert (
        r.returncode == 2
        and r.stderr.startswith("error: kvpatch plugin disable: --dir ")
        and "not a directory" in r.stderr
    )


def test_check_without_vllm_is_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "installed_vllm", lambda: None)
    with pytest.raises(UsageError, match="vLLM is not installed"):
        P.check()


# --------------------------------------------------------------------------- enable, for real


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.network
def test_enable_installs_the_kernel_set_of_a_real_release(vllm_release, tmp_path, monkeypatch):
    """vLLM 0.10.2 applied with the defaults and enabled: the bundle covers every
    configuration the release instantiates, records its schemas, and its library loads
    with exactly those configurations. The release's set is narrowed to head 128 and block
    16 (every dtype and cache: 9 of its 243 configurations) so the build takes a minute or
    two, not ten; what 'the set' is comes from one reader, checked on the real file below."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    import kvpatch.jit as jit
    import kvpatch.jit.spec as spec
    from kvpatch.abi import load
    from kvpatch.commands.apply import ApplyOptions
    from kvpatch.commands.apply import run as apply

    src = vllm_release("0.10.2")
    tree = tmp_path / "vllm"
    shutil.copytree(src, tree, symlinks=True)
    heads, blocks = jit.vllm_kernel_set(tree)
    assert 128 in heads and 16 in blocks and len(heads) * len(blocks) * 9 == 243  # the release's real set
    narrowed = lambda root: ((128,), (16,))  # noqa: E731
    monkeypatch.setattr(jit, "vllm_kernel_set", narrowed)
    monkeypatch.setattr(spec, "vllm_kernel_set", narrowed)
    apply(ApplyOptions(tree=tree, cwd=tmp_path))
    monkeypatch.setattr(P, "installed_vllm", lambda: "0.10.2+cu128")
    # without a cached 'kvpatch build --all' enable compiles the set only when told to
    report = P.enable(P.EnableOptions(tree=tree, cwd=tmp_path, directory=tmp_path / "bundle", build=True))
    m = read_bundle(tmp_path / "bundle")
    assert m == report.manifest and m.vllm_release == "0.10.2" and m.header_revision == "815bd481"
    assert set(m.configs) >= set(m.kernel_set.labels()) and len(m.kernel_set.labels()) == 9
    assert "k_scale" in m.schemas["paged_attention_v1"]
    lib = load(tmp_path / "bundle" / m.library, m.prefix)
    assert set(lib.configs) == set(m.configs) and not lib.scale_by_value


@pytest.mark.nvcc
@pytest.mark.network
def test_enable_without_the_full_build_says_which_build_to_run(vllm_release, tmp_path, monkeypatch):
    """No build of the full set in the cache: refused in one line naming the command, and
    nothing is compiled or installed; a build of part of the set is named as such."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    from types import SimpleNamespace

    import kvpatch.jit as jit
    import kvpatch.jit.library as library
    from kvpatch.commands.apply import ApplyOptions
    from kvpatch.commands.apply import run as apply

    tree = tmp_path / "vllm"
    shutil.copytree(vllm_release("0.10.2"), tree, symlinks=True)
    apply(ApplyOptions(tree=tree, cwd=tmp_path))
    monkeypatch.setenv("KVPATCH_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(P, "installed_vllm", lambda: "0.10.2")
    monkeypatch.setattr(jit, "build", lambda *a, **k: pytest.fail("compiled without --build"))
    opts = P.EnableOptions(tree=tree, cwd=tmp_path, arch="8.0;9.0a", directory=tmp_path / "bundle")
    with pytest.raises(
        UsageError,
        match=r"not built for 8\.0;9\.0a; .*first run \(or pass --build\): kvpatch build --all --arch '8\.0;9\.0a' --tree /",
    ):
        P.enable(opts)
    partial = SimpleNamespace(configs=("bf16/auto/128/16", "fp16/auto/128/16"))
    monkeypatch.setattr(library, "load_cached", lambda p: (partial if len(p.configs) < 10 else None, ""))
    with pytest.raises(UsageError, match=r"holds 2 of vLLM's configurations \(kvpatch build without --all\)"):
        P.enable(opts)
    assert not (tmp_path / "bundle").exists()


def test_a_bundle_directory_that_cannot_be_one_is_refused_before_the_tree_is_read(tmp_path):
    a_file = tmp_path / "passwd"
    a_file.write_text("root:x:0:0\n")
    for where, why in [(a_file, "is not a directory"), (a_file / "sub", "is not a directory")]:
        with pytest.raises(UsageError, match=rf"--dir {re.escape(str(where))}: .*{why}"):
            P.enable(P.EnableOptions(tree=tmp_path / "no-tree", cwd=tmp_path, directory=where))
    assert a_file.read_text() == "root:x:0:0\n"


def test_a_bundle_directory_inside_what_kvpatch_keeps_is_refused_before_the_tree_is_read(tmp_path, monkeypatch):
    """Before: --dir passed where it was a writable folder, so a bundle could land in .kvpatch/, the
    tree's csrc/ or the release cache (bundle.json beside vLLM's sources). After: refused there as
    every other output is, one line; the environment's own bundle folder stays allowed."""
    monkeypatch.setenv("KVPATCH_CACHE", str(tmp_path / "cache"))
    tree = make_tree(tmp_path / "vllm")
    State(tree=str(tree), version="0.10.2", config={}, marker=None).save(tmp_path)
    (tmp_path / "cache" / "releases").mkdir(parents=True)
    for where, kept in [(tmp_path / ".kvpatch" / "x", "state directory"), (tree / "csrc", "the tree's sources"),
                        (tmp_path / "cache" / "releases" / "b", "release cache")]:  # fmt: skip
        with pytest.raises(UsageError, match=rf"^--dir .* is inside .*{kept}.*: kvpatch never writes there"):
            P.enable(P.EnableOptions(cwd=tmp_path, directory=where))
        assert not (where / "bundle.json").exists()
    # the default folder itself passes these checks (then the tree's release decides)
    monkeypatch.setenv("KVPATCH_PLUGIN_DIR", str(tmp_path / "env-bundle"))
    with pytest.raises(UsageError) as e:
        P.enable(P.EnableOptions(cwd=tmp_path))
    assert "never writes there" not in str(e.value)


def test_a_bundle_folder_under_a_file_or_of_blanks_is_a_usage_error(tmp_path):
    """Before: a folder under a file read as 'cannot read .../bundle.json' (exit 1, with a fix to
    delete a file that cannot be), an unset --dir skipped the check and a $KVPATCH_PLUGIN_DIR of
    blanks named a folder ' ' here. After: one line, exit 2, in status and disable alike."""
    (tmp_path / "file").write_text("x")
    for args, env, said in [
        (["--dir", str(tmp_path / "file" / "sub")], {}, f"--dir {tmp_path / 'file' / 'sub'}: {tmp_path / 'file'} is "),
        ([], {"KVPATCH_PLUGIN_DIR": str(tmp_path / "file")}, "$KVPATCH_PLUGIN_DIR "),
        ([], {"KVPATCH_PLUGIN_DIR": "  "}, "$KVPATCH_PLUGIN_DIR is '  ': set it to a folder, or unset it"),
    ]:
        for command in ("status", "disable"):
            r = _kvpatch("plugin", command, *args, cwd=tmp_path, env=env)
            assert r.returncode == 2 and r.stderr.startswith(f"error: kvpatch plugin {command}: {said}"), r.stderr
            assert len(r.stderr.splitlines()) == 1
    assert (tmp_path / "file").read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["file"]
