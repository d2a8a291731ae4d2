"""kvpatch.abi against the launcher template, and a real C library through the plugin.

The parameter tables must be the template's exported prototypes, name for name and
type for type. Then a C library generated from those tables (compiled here with the
host C compiler: there is no GPU to build or run the CUDA launchers for) records every
argument it receives; loaded by kvpatch.abi.load from an installed bundle, behind the
plugin on a stand-in ``_C`` (CPU key, as in test_plugin_register), it shows what the
ctypes prototypes deliver to C. Stubbed: the ops' namespace and vLLM's kernel
(standin.define_ops), the device operations (standin.CpuDevice).
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import standin as S  # noqa: E402

from kvpatch import abi  # noqa: E402
from kvpatch.vllm_plugin import plugin, write_bundle  # noqa: E402

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "build" / "launcher.cu.j2"


def _template_params(kind: str) -> list[tuple[str, str]]:
    text = TEMPLATE.read_text(encoding="utf-8")
    m = re.search(r"KVPATCH_API int \{\{ prefix \}\}_paged_attention_\{\{ kind \}\}\((.*?)\)\s*\{", text, re.DOTALL)
    assert m, "the launcher prototype is not in the template"
    body = re.sub(r'\{%-?\s*if kind == "v1"\s*%\}(.*?)\{%-?\s*else\s*%\}(.*?)\{%-?\s*endif\s*%\}',
                  lambda b: b.group(1 if kind == "v1" else 2), m.group(1), flags=re.DOTALL)  # fmt: skip
    out = []
    for part in (p.strip() for p in body.split(",")):
        typ, name = re.fullmatch(r"(.*?[\s*])(\w+)", part).groups()
        out.append((name, re.sub(r"\s+\*", "*", " ".join(typ.split()))))
    return out


def test_tables_are_the_templates_prototypes():
    assert _template_params("v1") == list(abi.V1_PARAMS)
    assert _template_params("v2") == list(abi.V2_PARAMS)
    text = TEMPLATE.read_text(encoding="utf-8")
    for proto in ("int {{ prefix }}_abi_version()", "int {{ prefix }}_scale_by_value()",
                  "const char* {{ prefix }}_configs()", "const char* {{ prefix }}_error_string(int code)"):  # fmt: skip
        assert f"KVPATCH_API {proto}" in text
    assert "kNotBuilt = -1" in text and abi.NOT_BUILT == -1
    # exported only beside the grouped form
    assert "{%- if grouped %}\n\n// The grouped form's launches so far" in text
    assert "KVPATCH_API long long {{ prefix }}_grouped_launches()" in text


def test_ctypes_of_each_c_type():
    assert abi.ctype("int") is ctypes.c_int and abi.ctype("float") is ctypes.c_float
    assert abi.ctype("const float*") is ctypes.c_void_p
    with pytest.raises(ValueError, match="double"):
        abi.ctype("double")


# --------------------------------------------------------------------------- a C stand-in library


def _c_source(prefix: str, version: int, configs: str, scale_by_value: int, grouped: bool = False) -> str:
    def launcher(kind: str, params) -> str:
        rec = []
        for name, typ in params:
            if typ == "float":
                rec.append(f"  f[n] = {name}; u[n++] = 0;")
            else:
                rec.append(f"  u[n] = (unsigned long long)(uintptr_t)({name}); f[n++] = 0;" if typ.endswith("*")
                           else f"  u[n] = (unsigned long long)(long long)({name}); f[n++] = 0;")  # fmt: skip
        args = ", ".join(f"{t} {n}" for n, t in params)
        return (f"API int {prefix}_paged_attention_{kind}({args}) {{\n  n = 0; kind = {1 if kind == 'v1' else 2};\n"
                + "\n".join(rec) + "\n"
                "  if (dtype == 2) for (int i = 0; i < num_seqs * num_heads * head_size; i++) ((float*)out)[i] = 2.0f;\n"
                "  return 0;\n}\n")  # fmt: skip

    return (
        "#include <stdint.h>\n#define API __attribute__((visibility(\"default\")))\n"
        "static unsigned long long u[64]; static double f[64]; static int n, kind;\n"
        "API int test_last(unsigned long long* uo, double* fo) { for (int i = 0; i < n; i++) { uo[i] = u[i]; "
        "fo[i] = f[i]; } return kind * 100 + n; }\n"
        f"API int {prefix}_abi_version(void) {{ return {version}; }}\n"
        f"API int {prefix}_scale_by_value(void) {{ return {scale_by_value}; }}\n"
        f'API const char* {prefix}_configs(void) {{ return "{configs}"; }}\n'
        f'API const char* {prefix}_error_string(int c) {{ return c == -1 ? "not built" : "an error"; }}\n'
        + launcher("v1", abi.V1_PARAMS) + launcher("v2", abi.V2_PARAMS)
        + (f"API long long {prefix}_grouped_launches(void) {{ return 5000000000LL + n; }}\n" if grouped else "")
    )  # fmt: skip


def _build(tmp_path: Path, prefix="kvp_test", version=abi.ABI_VERSION, scale_by_value=0, grouped=False) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on PATH")
    src = tmp_path / f"{prefix}.c"
    src.write_text(_c_source(prefix, version, ",".join(S.SMALL_SET.labels()), scale_by_value, grouped))
    so = tmp_path / f"lib{prefix}.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(so), str(src)], check=True, capture_output=True)
    return so


def _last(so_path: Path) -> tuple[int, list[int], list[float]]:
    lib = ctypes.CDLL(str(so_path))
    u, f = (ctypes.c_ulonglong * 64)(), (ctypes.c_double * 64)()
    code = lib.test_last(u, f)
    return code // 100, list(u[: code % 100]), list(f[: code % 100])


def test_load(tmp_path):
    lib = abi.load(_build(tmp_path), "kvp_test")
    assert lib.abi_version == abi.ABI_VERSION and not lib.scale_by_value
    assert lib.configs == tuple(S.SMALL_SET.labels()) and lib.error_string(-1) == "not built"
    with pytest.raises(abi.AbiError, match="has no kvp_other_abi_version: wrong prefix"):
        abi.load(lib.path, "kvp_other")
    with pytest.raises(abi.AbiError, match="cannot load"):
        abi.load(tmp_path / "absent.so", "kvp_test")
    with pytest.raises(abi.AbiError, match="has launcher ABI 2, this kvpatch expects 1"):
        (tmp_path / "v2").mkdir()
        abi.load(_build(tmp_path / "v2", version=2), "kvp_test")


def test_a_library_with_the_grouped_form_counts_its_launches_and_one_without_says_none(tmp_path):
    assert abi.load(_build(tmp_path), "kvp_test").grouped_launches is None
    (tmp_path / "g").mkdir()
    grouped = abi.load(_build(tmp_path / "g", grouped=True), "kvp_test")
    assert grouped.grouped_launches() == 5_000_000_000  # a long long, not truncated to int


def _installed(tmp_path: Path, so: Path, release="0.10.2", schemas=S.TENSOR_SCALES):
    ns = S.unique_namespace()
    keep = S.define_ops(ns, schemas)
    bundle = tmp_path / "bundle"
    write_bundle(so, vllm_release=release, header_revision="815bd481", marker="m", archs=("sm_90a",),
                 prefix="kvp_test", configs=S.SMALL_SET.labels(), kernel_set=S.SMALL_SET, schemas=schemas,
                 scale_by_value=schemas is S.FLOAT_SCALES, directory=bundle)  # fmt: skip
    target = S.make_target(ns, bundle, None, release=release)
    target = type(target)(**{**target.__dict__, "load_library": None})  # the real loader
    return ns, keep, bundle, target


@pytest.mark.parametrize("kind", ["v1", "v2"])
def test_c_library_receives_the_arguments(tmp_path, kind):
    ns, keep, bundle, target = _installed(tmp_path, _build(tmp_path))
    d = plugin.register(target)
    assert d.registered, d.line()
    args = S.make_args(kind, alibi=True, max_seq_len=700)
    getattr(S.ops(ns), f"paged_attention_{kind}")(*args)
    assert float(args[0].flatten()[0]) == S.OURS
    got_kind, u, f = _last(bundle / plugin.registration(target).override.launcher.path.name)
    params = abi.V1_PARAMS if kind == "v1" else abi.V2_PARAMS
    got = {name: (f[i] if typ == "float" else u[i]) for i, (name, typ) in enumerate(params)}
    outs = args[:1] if kind == "v1" else args[:4]
    query, key_cache, _value, nkv, scale, block_tables, seq_lens, bs, msl, alibi, _kv, ks, vs = args[len(outs) : -5]
    want = dict(zip([n for n, _ in params[: len(outs)]], [t.data_ptr() for t in outs]))
    want.update(query=query.data_ptr(), key_cache=key_cache.data_ptr(), value_cache=_value.data_ptr(),
                num_seqs=2, num_heads=4, head_size=32, num_kv_heads=nkv, scale=scale,
                block_tables=block_tables.data_ptr(), max_num_blocks_per_seq=block_tables.shape[1],
                seq_lens=seq_lens.data_ptr(), block_size=bs, max_seq_len=msl, alibi_slopes=alibi.data_ptr(),
                q_stride=query.stride(0), kv_block_stride=key_cache.stride(0), kv_head_stride=key_cache.stride(1),
                dtype=2, kv_cache_dtype=0, k_scale_ptr=ks.data_ptr(), v_scale_ptr=vs.data_ptr(), k_scale=1.0,
                v_scale=1.0, stream=1234)  # fmt: skip
    assert got_kind == (1 if kind == "v1" else 2) and got == want


def test_c_library_float_scales(tmp_path):
    ns, keep, bundle, target = _installed(tmp_path, _build(tmp_path, scale_by_value=1), release="0.6.4",
                                          schemas=S.FLOAT_SCALES)  # fmt: skip
    assert plugin.register(target).registered
    args = S.make_args("v1", float_scales=True)
    args[12:14] = [0.5, 0.25]
    S.ops(ns).paged_attention_v1(*args)
    _, u, f = _last(bundle / plugin.registration(target).override.launcher.path.name)
    names = [n for n, _ in abi.V1_PARAMS]
    assert f[names.index("k_scale")] == 0.5 and f[names.index("v_scale")] == 0.25
    assert u[names.index("k_scale_ptr")] == 0 and u[names.index("v_scale_ptr")] == 0


def test_bundle_with_another_abi_is_refused(tmp_path):
    ns, keep, bundle, target = _installed(tmp_path, _build(tmp_path, version=abi.ABI_VERSION + 1))
    d = plugin.register(target)
    assert d.action == "refuse" and f"has launcher ABI {abi.ABI_VERSION + 1}" in d.reason


# --------------------------------------------------------------------------- a library kvpatch built


@pytest.mark.nvcc
@pytest.mark.network
def test_a_built_library_behind_the_plugin(vllm_release, tmp_path):
    """vLLM 0.10.2's stock kernels built by kvpatch (fp16, auto, head 128, block 16, sm_90a),
    installed as a bundle and registered on the stand-in: the real launcher finds the
    configuration and then fails for want of a GPU, and the plugin reports the CUDA
    error in its words; a configuration not built never reaches it."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    from kvpatch.jit import Variant, build, make_spec
    from kvpatch.source.releases import HEADER
    from kvpatch.vllm_plugin import KernelSet

    tree = vllm_release("0.10.2")
    spec = make_spec(tree, [Variant("stock", (tree / HEADER).read_text(encoding="utf-8"), expect_prefetch=False)],
                     "9.0a", dtypes=("fp16",), head_sizes=(128,), block_sizes=(16,), kv_cache_dtypes=("auto",))  # fmt: skip
    (built,) = build(spec).variants
    ns = S.unique_namespace()
    keep = S.define_ops(ns, S.TENSOR_SCALES)  # noqa: F841
    write_bundle(built.library, vllm_release="0.10.2", header_revision="815bd481", marker="stock", archs=built.archs,
                 prefix=built.prefix, configs=built.configs, kernel_set=KernelSet(("fp16",), ("auto",), (128,), (16,)),
                 schemas=S.TENSOR_SCALES, scale_by_value=False, directory=tmp_path / "bundle")  # fmt: skip
    target = S.make_target(ns, tmp_path / "bundle", None)
    d = plugin.register(type(target)(**{**target.__dict__, "load_library": None, "get_kernel": False}))
    assert d.registered, d.line()
    assert plugin.registration(target).override.launcher.configs == ("fp16/auto/128/16",)
    args = S.make_args("v1", dtype=torch.float16, head_size=128)
    with pytest.raises(RuntimeError, match=r"kvpatch paged_attention_v1 failed for fp16/auto/128/16: .+ \(error \d+\)"):
        S.ops(ns).paged_attention_v1(*args)
    with pytest.raises(RuntimeError, match="fp16/auto/64/16 is not in the library"):
        S.ops(ns).paged_attention_v1(*S.make_args("v1", dtype=torch.float16, head_size=64))
