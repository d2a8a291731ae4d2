"""The schema gate on the real ``csrc/torch_bindings.cpp`` of five releases (fetched once,
cached): each release's own text passes, a mutated op is refused.

Stubbed: the installed ops are defined in a stand-in namespace from the text (there is
no built ``vllm._C`` here), with a CPU kernel for vLLM's; the launcher is
standin.FakeLauncher. The texts themselves are the releases'.
"""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

import standin as S  # noqa: E402

from kvpatch.vllm_plugin import plugin, schema_mismatch, schemas_from_bindings  # noqa: E402

pytestmark = pytest.mark.network

RELEASES = ("0.6.4", "0.8.5", "0.9.2", "0.10.0", "0.10.2")

#: (what, how the installed op's text is changed, what the refusal names)
MUTATIONS = [
    ("renamed", lambda s: s.replace("v_scale,", "value_scale,"), "'Tensor value_scale'|'float value_scale'"),
    ("retyped", lambda s: s.replace("int block_size", "float block_size"), "'float block_size'"),
    ("optional", lambda s: s.replace("Tensor? alibi_slopes", "Tensor alibi_slopes"), "'Tensor alibi_slopes'"),
    ("added", lambda s: s.replace(") -> ()", ", int extra_arg) -> ()"), "1 more argument.*'int extra_arg'"),
    ("dropped", lambda s: re.sub(r", int blocksparse_head_sliding_step\)", ")", s), "lacks argument"),
    ("returns", lambda s: s.replace("-> ()", "-> Tensor"), "returns"),
]


def _texts(vllm_release, version: str) -> dict[str, str]:
    tree = vllm_release(version)
    return schemas_from_bindings((tree / "csrc" / "torch_bindings.cpp").read_text(encoding="utf-8"))


@pytest.mark.parametrize("version", RELEASES)
def test_own_text_passes_and_matches_the_stand_in(vllm_release, version):
    texts = _texts(vllm_release, version)
    assert texts == (S.FLOAT_SCALES if version == "0.6.4" else S.TENSOR_SCALES)
    ns = S.unique_namespace()
    keep = S.define_ops(ns, texts)  # noqa: F841
    for op, text in texts.items():
        assert schema_mismatch(text, getattr(S.ops(ns), op).default._schema) is None


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("what, mutate, why", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_mutated_op_is_refused(vllm_release, tmp_path, version, what, mutate, why):
    texts = _texts(vllm_release, version)
    for op in texts:  # each op on its own
        live = dict(texts, **{op: mutate(texts[op])})
        assert live[op] != texts[op], what
        ns = S.unique_namespace()
        keep = S.define_ops(ns, live)  # noqa: F841
        assert re.search(why, schema_mismatch(texts[op], getattr(S.ops(ns), op).default._schema) or "")
        bundle = S.make_bundle(tmp_path / f"{op}-{what}", release=version, schemas=texts)
        launcher = S.FakeLauncher(S.SMALL_SET.labels(), scale_by_value=version == "0.6.4")
        d = plugin.register(S.make_target(ns, bundle, launcher, release=version))
        assert d.action == "refuse" and f"{ns}::{op} has another schema" in d.reason and not d.registered
        plugin.reset()


@pytest.mark.parametrize("version", ("0.6.4", "0.10.2"))
def test_a_bundle_of_one_form_on_the_other(vllm_release, tmp_path, version):
    """0.6.4's float scales against a later release's tensors, and back."""
    other = _texts(vllm_release, "0.10.2" if version == "0.6.4" else "0.6.4")
    ns = S.unique_namespace()
    keep = S.define_ops(ns, other)  # noqa: F841
    bundle = S.make_bundle(tmp_path / "b", release=version, schemas=_texts(vllm_release, version))
    d = plugin.register(S.make_target(ns, bundle, S.FakeLauncher(S.SMALL_SET.labels()), release=version))
    assert d.action == "refuse" and "k_scale" in d.reason
