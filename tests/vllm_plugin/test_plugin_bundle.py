"""The bundle on disk and the schema-text parser (pure: no torch kernel runs; torch is
needed only to import the package's test helpers and for ``parse_schema``)."""

from __future__ import annotations

import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")

import standin as S  # noqa: E402

from kvpatch.vllm_plugin import KernelSet, bundle_dir, missing_configs, read_bundle, remove_bundle  # noqa: E402
from kvpatch.vllm_plugin.bundle import MANIFEST, BundleError, file_digest  # noqa: E402
from kvpatch.vllm_plugin.schema import normalize_schema, schemas_from_bindings  # noqa: E402


def test_bundle_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("KVPATCH_PLUGIN_DIR")
    assert bundle_dir() == type(tmp_path)(sys.prefix) / "share" / "kvpatch" / "vllm-plugin"
    monkeypatch.setenv("KVPATCH_PLUGIN_DIR", str(tmp_path / "x"))
    assert bundle_dir() == tmp_path / "x" and not (tmp_path / "x").exists()


def test_a_relative_bundle_dir_is_the_folder_it_names_from_here(monkeypatch, tmp_path):
    """``KVPATCH_PLUGIN_DIR=bundle``: the folder below the current directory, as an absolute path
    (the serving benchmark's engines, started in another directory, get the same folder)."""
    from kvpatch.serving import ARMS, Worker
    from kvpatch.serving.engine import engine_env
    from kvpatch.serving.schedule import schedule

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVPATCH_PLUGIN_DIR", "bundle")
    assert bundle_dir() == tmp_path / "bundle"
    kvpatch_start = schedule(ARMS, 1)[0]
    assert engine_env(kvpatch_start, dict(os.environ), Worker())["KVPATCH_PLUGIN_DIR"] == str(tmp_path / "bundle")


def test_write_read_replace_remove(tmp_path):
    d = S.make_bundle(tmp_path / "b", library_bytes=b"first")
    m = read_bundle(d)
    assert m.library_bytes == 5 and (d / m.library).read_bytes() == b"first"
    assert file_digest(d / m.library) == (m.library_bytes, m.library_sha256)
    assert m.schemas == S.TENSOR_SCALES and m.archs == ("sm_90a",) and m.vllm_release == "0.10.2"
    assert m.header_revision == "815bd481" and m.marker == "test-marker" and m.abi_version == 1
    raw = json.loads((d / MANIFEST).read_text())
    assert raw["kernel_set"]["head_sizes"] == [32, 64] and raw["format"] == 1
    S.make_bundle(tmp_path / "b", library_bytes=b"second")  # replaces: the old library goes
    m2 = read_bundle(d)
    assert m2.library != m.library and not (d / m.library).exists()
    assert sorted(p.name for p in d.iterdir()) == sorted([MANIFEST, m2.library])
    (d / "user-notes.txt").write_text("kept")
    assert remove_bundle(d) and read_bundle(d) is None
    assert [p.name for p in d.iterdir()] == ["user-notes.txt"]
    assert not remove_bundle(tmp_path / "never")


def test_read_bundle_errors(tmp_path):
    assert read_bundle(tmp_path) is None
    with pytest.raises(BundleError, match="no bundle"):
        read_bundle(tmp_path, missing_ok=False)
    for text, why in [("[]", "not a JSON object"), ("{", "not JSON"), ('{"format": 2}', "format 2"),
                      ('{"format": 1}', "lacks 'kernel_set'"), ("[" * 5000 + "]" * 5000, "nested too deeply")]:  # fmt: skip
        (tmp_path / MANIFEST).write_text(text)
        with pytest.raises(BundleError, match=why) as e:
            read_bundle(tmp_path)
        assert "\n" not in str(e.value)
        assert read_bundle(tmp_path, damaged_ok=True) is None
    d = S.make_bundle(tmp_path / "b")
    raw = json.loads((d / MANIFEST).read_text())
    for key, value, why in [("library", "../evil.so", "not a plain file name"), ("library", "..", "not a plain file name"),
                            ("library", "lib\0.so", "not a plain file name"), ("format", True, "manifest format True"),
                            ("format", 1.0, "manifest format 1.0"), ("library_bytes", "5", "should be a int, not str"),
                            ("archs", "sm_90a", "should be a list"), ("schemas", {}, "no schema"), ("configs", [1], "not a list of strings")]:  # fmt: skip
        (d / MANIFEST).write_text(json.dumps({**raw, key: value}))
        with pytest.raises(BundleError, match=why):
            read_bundle(d)
    for key in ("dtypes", "kv_cache_dtypes", "head_sizes", "block_sizes"):  # an empty set is covered by any library
        (d / MANIFEST).write_text(json.dumps({**raw, "kernel_set": {**raw["kernel_set"], key: []}}))
        with pytest.raises(BundleError, match=f"'kernel_set' has no '{key}'"):
            read_bundle(d)


def test_write_refuses_missing_schemas(tmp_path):
    with pytest.raises(BundleError, match="no schema recorded for paged_attention_v2"):
        S.make_bundle(tmp_path / "b", schemas={"paged_attention_v1": S.TENSOR_SCALES["paged_attention_v1"]})


def test_missing_configs():
    full = KernelSet()
    assert len(full.labels()) == 3 * 3 * 9 * 3
    assert missing_configs(full, full.labels()) == []
    assert missing_configs(full, full.labels()[1:]) == ["fp16/auto/32/8"]


# --------------------------------------------------------------------------- schema texts


BINDINGS = r"""
TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  // Attention ops
  ops.def(
      "paged_attention_v1("
      "    Tensor! out, Tensor query, Tensor key_cache,"  // a comment between literals
      "    Tensor value_cache, int num_kv_heads, float scale) -> ()");
  ops.impl("paged_attention_v1", torch::kCUDA, &paged_attention_v1);
  ops.def(R"(paged_attention_v2(Tensor! out,
      /* not a comment inside a raw string */ Tensor query) -> ())");
  ops.def("other(Tensor a) -> ()");
}
"""


def test_schemas_from_bindings():
    got = schemas_from_bindings(BINDINGS)
    assert got["paged_attention_v1"] == ("paged_attention_v1(Tensor! out, Tensor query, Tensor key_cache, "
                                         "Tensor value_cache, int num_kv_heads, float scale) -> ()")  # fmt: skip
    assert got["paged_attention_v2"] == ("paged_attention_v2(Tensor! out, /* not a comment inside a raw string */ "
                                         "Tensor query) -> ()")  # fmt: skip
    torch._C.parse_schema(got["paged_attention_v1"])


def test_schemas_from_bindings_errors():
    with pytest.raises(ValueError, match="paged_attention_v2"):
        schemas_from_bindings('ops.def("paged_attention_v1(Tensor a) -> ()");')
    twice = 'ops.def("paged_attention_v1(Tensor a) -> ()"); ops.def("paged_attention_v1(Tensor b) -> ()");'
    with pytest.raises(ValueError, match="defined 2 times"):
        schemas_from_bindings(twice, ops=("paged_attention_v1",))


def test_normalize_schema():
    assert normalize_schema("f(\n   Tensor a,\n    int b\n) -> ()") == "f(Tensor a, int b) -> ()"


def test_the_bundle_is_readable_by_other_users(tmp_path):
    """vLLM may run as another user than the one who enabled the plugin: the files get the
    umask's default permissions, not mkstemp's 0600."""
    import os
    import stat

    from kvpatch.vllm_plugin import OPS, write_bundle

    old = os.umask(0o022)
    try:
        lib = tmp_path / "libx.so"
        lib.write_bytes(b"x")
        ks = KernelSet(("fp16",), ("auto",), (128,), (16,))
        write_bundle(lib, vllm_release="0.10.2", header_revision="r", marker="m", archs=("sm_90a",), prefix="p",
                     configs=ks.labels(), kernel_set=ks, schemas={op: f"{op}(Tensor! out) -> ()" for op in OPS},
                     scale_by_value=False, directory=tmp_path / "b")  # fmt: skip
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "b").iterdir()}
    assert set(modes.values()) == {0o644}, modes


def test_remove_touches_only_what_a_valid_manifest_names(tmp_path):
    """No manifest: nothing is removed, even files named like kvpatch's libraries; a damaged
    manifest, or one naming a path, is refused with everything left in place."""
    d = tmp_path / "not-a-bundle"
    d.mkdir()
    keep = {"libtorch_cuda-0123456789ab.so": b"x", ".partial.tmp": b"y", "model.so": b"z"}
    for name, data in keep.items():
        (d / name).write_bytes(data)
    assert not remove_bundle(d)
    assert sorted(p.name for p in d.iterdir()) == sorted(keep)
    (d / MANIFEST).write_text("{")
    with pytest.raises(BundleError, match="damaged manifest") as e:
        remove_bundle(d)
    assert (
        f"nothing removed (only what a valid manifest names is): 'kvpatch plugin enable' replaces it, or delete {d / MANIFEST} yourself"
        in str(e.value)
    )
    assert sorted(p.name for p in d.iterdir()) == sorted([*keep, MANIFEST])
    b = S.make_bundle(tmp_path / "b")
    raw = json.loads((b / MANIFEST).read_text())
    raw["library"] = "../not-a-bundle/model.so"
    (b / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(BundleError, match="not a plain file name"):
        remove_bundle(b)
    (b / "model.so").write_bytes(b"a user's file")
    raw["library"] = "model.so"
    (b / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(BundleError, match="'model.so', not a library kvpatch writes: nothing removed"):
        remove_bundle(b)
    assert (d / "model.so").exists() and (b / "model.so").exists() and (b / MANIFEST).exists()


def test_a_manifest_that_is_a_fifo_or_a_device_is_refused_without_blocking(tmp_path):
    import os

    d = tmp_path / "b"
    d.mkdir()
    os.mkfifo(d / MANIFEST)  # nothing ever writes it: a plain open() would block forever
    with pytest.raises(BundleError, match="cannot read"):
        read_bundle(d)
    assert read_bundle(d, damaged_ok=True) is None
    e = tmp_path / "e"
    e.mkdir()
    (e / MANIFEST).symlink_to("/dev/zero")
    with pytest.raises(BundleError, match="cannot read"):
        read_bundle(e)


@pytest.mark.parametrize("named", ["notes.txt", "model.safetensors", MANIFEST])
def test_enabling_again_removes_only_a_library_kvpatch_wrote(tmp_path, named):
    """Before: a new bundle removed whatever file the old manifest named as its library: a
    hand-edited 'notes.txt' went, and 'bundle.json' took the new manifest with it (enable said
    it had succeeded and left no bundle). After: only a name kvpatch gives its libraries."""
    d = S.make_bundle(tmp_path / "b", library_bytes=b"first")
    (d / "notes.txt").write_text("mine")
    (d / "model.safetensors").write_bytes(b"weights")
    raw = json.loads((d / MANIFEST).read_text())
    raw["library"] = named
    (d / MANIFEST).write_text(json.dumps(raw))
    S.make_bundle(tmp_path / "b", library_bytes=b"second")
    assert (d / "notes.txt").read_text() == "mine" and (d / "model.safetensors").read_bytes() == b"weights"
    assert read_bundle(d).library_bytes == 6  # the new manifest is there


def test_remove_bundle_in_a_folder_it_may_not_list_still_removes_the_bundle(tmp_path):
    """Before: the manifest and library were unlinked, then listing the folder for leftovers raised
    (a folder writable but not readable): an error after the bundle was gone. After: True."""
    import os

    if os.geteuid() == 0:
        pytest.skip("root lists every folder")
    where = tmp_path / "bundle"
    S.make_bundle(where)
    where.chmod(0o333)
    try:
        assert remove_bundle(where) is True
    finally:
        where.chmod(0o755)
    assert read_bundle(where, missing_ok=True) is None


def _bundle_from_elsewhere(where, tmp_path):
    """A bundle in ``where`` whose source library lies outside ``where``'s parent (S.make_bundle puts it beside)."""
    (tmp_path / "src").mkdir(exist_ok=True)
    S.make_bundle(tmp_path / "src" / "b")
    where.mkdir(parents=True)
    for f in (tmp_path / "src" / "b").iterdir():
        (where / f.name).write_bytes(f.read_bytes())


def test_disabling_the_default_bundle_leaves_no_empty_share_folder(tmp_path, monkeypatch):
    """Before: enable then disable left an empty <prefix>/share/kvpatch/. After: the environment's
    share/ is as it was; a share/kvpatch/ holding anything else stays."""
    import sys

    monkeypatch.delenv("KVPATCH_PLUGIN_DIR", raising=False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "env"))
    where = bundle_dir()
    assert where == tmp_path / "env" / "share" / "kvpatch" / "vllm-plugin"
    _bundle_from_elsewhere(where, tmp_path)
    assert remove_bundle(where) is True
    assert sorted(p.name for p in (tmp_path / "env" / "share").iterdir()) == []
    _bundle_from_elsewhere(where, tmp_path)
    (where.parent / "other").write_text("x")
    assert remove_bundle(where) is True and sorted(p.name for p in where.parent.iterdir()) == ["other"]
