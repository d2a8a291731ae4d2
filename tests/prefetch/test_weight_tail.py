"""The in-kernel weight prefetch (PatchConfig ``weight_tail``, opt-in): the generated header
before -> after (a golden diff of its own), its marker and TOML round trips, that the default
generated code (header and launcher) is unchanged, the launcher's table setter, and (nvcc) a
build whose every attention kernel holds the tail's bulk prefetch while its floating-point ops
stay stock's, with the setter exported and checking its arguments."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import GOLDEN, STOCK, fixture_text, golden_text

from kvpatch.config import config_from_marker, make_config
from kvpatch.errors import UsageError
from kvpatch.patch.header import inspect, unpatch
from kvpatch.patch.plan import WEIGHT_TAIL_ROWS
from kvpatch.source.releases import HEADER
from kvpatch.source.workspace import unified_diff

TAIL_ONLY = {"fp16": "off", "bf16": "off", "fp32": "off", "rules": "none", "weight_tail": True}

pytestmark = pytest.mark.slow  # every test patches a header (libclang, seconds each) or builds


def _patch(text, path, **options):
    from kvpatch.patch import patch

    return patch(text, path, make_config(**options))


@pytest.fixture(scope="module")
def fixture_patched(header_path):
    """The stock fixture header patched with some options (each set of options patched once)."""
    done = {}

    def get(**options):
        key = tuple(sorted(options.items()))
        if key not in done:
            done[key] = _patch(fixture_text(STOCK), header_path, **options)
        return done[key]

    return get


def test_default_generated_code_is_unchanged(fixture_patched):
    patched = fixture_patched().patched
    assert patched == golden_text("default")  # the shipped golden, byte for byte
    assert "weight" not in patched and "weight" not in make_config().marker()
    assert "weight_tail" not in make_config().to_toml_dict()


def test_weight_tail_golden_diff(fixture_patched):
    """tests/fixtures/golden/weight-tail.diff: the fixture with every KV prefetch off and the
    weight tail on (regenerate with KVPATCH_REGEN_GOLDEN=1, then review the diff)."""
    stock = fixture_text(STOCK)
    result = fixture_patched(**TAIL_ONLY)
    diff = unified_diff(stock, result.patched, HEADER)
    golden = GOLDEN / "weight-tail.diff"
    if os.environ.get("KVPATCH_REGEN_GOLDEN") == "1":
        golden.write_text(diff, encoding="utf-8")
        pytest.skip("regenerated weight-tail.diff: review it with git diff")
    assert diff == golden.read_text(encoding="utf-8")


def test_weight_tail_adds_the_table_the_helper_and_one_call_after_the_value_loop(fixture_patched):
    before = fixture_patched().patched
    after = fixture_patched(weight_tail=True).patched
    # the table is visible to host code (outside the arch guard), the helper to Hopper device code only
    helper = after[after.index("// kvpatch:begin helper") : after.index("// kvpatch:end helper")]
    table_at, guard_end = (
        helper.index("static __constant__ kvpatch_weight_tail_table kvpatch_weight_tail_window;"),
        helper.rindex("#endif"),
    )
    assert helper.rfind("#if defined(__CUDA_ARCH__)", 0, table_at) < helper.rfind("#endif", 0, table_at)
    assert f"static constexpr int kvpatch_weight_tail_max_rows = {WEIGHT_TAIL_ROWS};" in helper
    fn = helper[helper.index("static __device__ __noinline__ void kvpatch_weight_tail(") : guard_end]
    assert "if (threadIdx.x != 0) return;" in fn and " / " not in fn.replace("// ", "")  # one thread, no division
    assert fn.count("cp.async.bulk.prefetch.L2.global") == 2 and "createpolicy.fractional.L2::evict_normal" in fn
    # the call: right after the value loop, with the key cache (the layer's own)
    region = re.search(r"\n  // kvpatch:begin weight-tail [^\n]*\n(.*?)\n  // kvpatch:end weight-tail", after, re.S)
    assert region and region.group(1) == ("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && __CUDA_ARCH__ < 1000 && !defined(USE_ROCM)\n"
                                          "  kvpatch_weight_tail(k_cache);\n#endif")  # fmt: skip
    value_loop_end = after.index("\n  // kvpatch:begin weight-tail")
    assert after[:value_loop_end].endswith("\n  }")  # the value loop's closing brace
    assert after[region.end() :].startswith("\n\n  out[(seq_idx * num_heads")  # the fixture's output write follows
    # with the tail's additions taken out, what is left is the default patch, marker word aside
    stripped = re.sub(r"\n  // kvpatch:begin weight-tail .*?// kvpatch:end weight-tail", "", after, flags=re.S)
    stripped = re.sub(r"\n// weight-tail: rows of.*?\n#endif(?=\n// kvpatch:end helper)", "", stripped, flags=re.S)
    assert stripped.replace(" weight-tail", "") == before


def test_weight_tail_marker_toml_and_revert(fixture_patched, header_path):
    for options in ({"weight_tail": True}, TAIL_ONLY):
        cfg = make_config(**options)
        assert cfg.marker().split(" bf16")[0].endswith("quantized=skip weight-tail")
        assert config_from_marker(cfg.marker()) == cfg
        assert cfg.to_toml_dict()["weight_tail"] is True and make_config(**cfg.to_toml_dict()) == cfg
        result = fixture_patched(**options)
        state = inspect(result.patched, header_path)
        assert state.intact and state.config == cfg and state.labels[-1] == "weight-tail"
        assert unpatch(result.patched, header_path)[0] == fixture_text(STOCK)
    with pytest.raises(UsageError, match="weight-tail"):
        make_config(preset="paper", weight_tail=True)
    with pytest.raises(UsageError, match="weight-tail"):
        make_config(weight_tail="yes")


# --------------------------------------------------------------------------- the launcher


def _sources(header: str, header_path: str, configs=None):
    from kvpatch.jit.plan import launcher_sources
    from kvpatch.jit.signatures import kernel_signatures
    from kvpatch.jit.spec import KernelConfig, Variant

    configs = configs or [KernelConfig("bf16", "auto", 64, 16)]
    return launcher_sources(Variant("v", header), kernel_signatures(header, header_path), configs)


@pytest.fixture(scope="module")
def release():
    """vLLM 0.10.2's tree from the release cache (the fixture header has no kernels to launch)."""
    from kvpatch.source.fetch import cache_root

    tree = cache_root() / "releases" / "v0.10.2"
    if not (tree / HEADER).is_file():
        pytest.skip("vLLM 0.10.2 is not in the release cache (kvpatch fetch 0.10.2)")
    return tree


def test_the_launcher_exports_the_setter_only_for_a_weight_tail_header(release):
    from kvpatch.jit.spec import KernelConfig
    from kvpatch.templating import templates_dir

    header_path = str(release / HEADER)
    stock = (release / HEADER).read_text()
    configs = [KernelConfig("bf16", "auto", h, b) for h in (64, 80, 96, 112, 128) for b in (8, 16)]  # two shards
    plain = _sources(stock, header_path, configs)
    tail = _sources(_patch(stock, header_path, **TAIL_ONLY).patched, header_path, configs)
    assert len(plain) == len(tail) == 2
    assert not any("weight" in s for s in plain)
    for i, s in enumerate(tail):
        assert (
            f"int shard{i}_set_weight_prefetch(const vllm::kvpatch_weight_tail_table& t, cudaStream_t stream) {{" in s
        )
        assert "cudaMemcpyToSymbolAsync(vllm::kvpatch_weight_tail_window, &t, sizeof(t), 0," in s
    api = tail[0][tail[0].index("KVPATCH_API int kvpatch_v_set_weight_prefetch(") :]
    assert "shard0_set_weight_prefetch(t, " in api and "shard1_set_weight_prefetch(t, " in api
    assert "count > vllm::kvpatch_weight_tail_max_rows" in api and "chunk % 16 != 0" in api
    assert "KVPATCH_API int kvpatch_v_weight_tail_max_rows()" in tail[0] and "KVPATCH_API int" not in tail[1]
    # the template's additions are all under `if weight_tail`: without them it renders the same
    text = (templates_dir() / "build" / "launcher.cu.j2").read_text()
    assert text.count("{%- if weight_tail %}") == 3


@pytest.fixture(scope="module")
def tail_build(release, tmp_path_factory):
    """stock and the tail variant of a cached vLLM release, bf16/64/16, sm_90a and sm_80."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    from kvpatch import jit as B
    from kvpatch.decode.prepare import decode_variants

    tree = release

    stock, _, tail = decode_variants((tree / HEADER).read_text(), str(tree / HEADER))
    spec = B.make_spec(
        tree, [stock, tail], "9.0a;8.0", dtypes=["bf16"], head_sizes=[64], block_sizes=[16], kv_cache_dtypes=["auto"]
    )
    return B.build(spec, cache=tmp_path_factory.mktemp("tail-cache"))  # check=True: the SASS check passes


@pytest.mark.nvcc
def test_tail_build_prefetches_in_every_hopper_kernel_and_keeps_stocks_math(tail_build):
    stock, tail = tail_build.variants
    kernels = {(k.arch, k.kernel): k for k in tail.kernels}
    base = {(k.arch, k.kernel): k for k in stock.kernels}
    for kind in ("v1", "v2"):
        assert kernels[("sm_90a", kind)].has_prefetch and not kernels[("sm_80", kind)].has_prefetch
    assert not kernels[("sm_90a", "reduce")].has_prefetch
    for key, k in kernels.items():
        assert k.fp_ops == base[key].fp_ops, key  # the tail's bulk prefetches only: no FP op added
        # the call may move ptxas' allocation by a register (the tail+zero arm times what that costs)
        assert abs(k.registers - base[key].registers) <= 2 and k.spill_stores == 0
    sass = tail.read_sass()
    v2 = sass[sass.index("paged_attention_v2_kernel") :]
    assert "CALL.REL" in v2[: v2.index("Function :") if "Function :" in v2 else len(v2)]


@pytest.mark.nvcc
def test_the_tail_library_exports_its_setter_and_checks_its_rows(tail_build, tmp_path):
    import ctypes

    from kvpatch.prefetch.tail import WeightTail, second_copy

    tail = tail_build.variants[1]
    wt = WeightTail(tail.library, tail.prefix)
    assert wt.max_rows == WEIGHT_TAIL_ROWS
    raw = wt._set
    rows = (ctypes.c_longlong * 3)(0x1000, 0x2000, 4096)
    assert raw(rows, WEIGHT_TAIL_ROWS + 1, 1, 4096, None) == 1  # too many rows: invalid, before any CUDA call
    assert raw(rows, 1, 4, 4096, None) == 1 and raw(rows, 1, 1, 24, None) == 1  # hint, chunk
    bad = (ctypes.c_longlong * 3)(0x1000, 0x2008, 4096)
    assert raw(bad, 1, 1, 4096, None) == 1  # an address off the 16-byte grid
    with pytest.raises(UsageError, match="multiples of 16"):
        wt.set([(0x1000, 0x2008, 4096)])
    with pytest.raises(UsageError, match="rows"):
        wt.set([(0x1000, 0x2000, 16)] * (WEIGHT_TAIL_ROWS + 1))
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    if not gpu:  # valid rows reach cudaMemcpyToSymbolAsync, which has no device here: a clean error
        with pytest.raises(RuntimeError, match="set_weight_prefetch failed"):
            wt.set([(0x1000, 0x2000, 4096)], hint="evict_last", chunk=8192)
    copy = second_copy(tail.library, tmp_path)
    assert copy.read_bytes() == Path(tail.library).read_bytes() and copy != Path(tail.library)
    with pytest.raises(Exception, match="not a weight-tail build"):
        WeightTail(tail_build.variants[0].library, tail_build.variants[0].prefix)


def test_a_second_copy_into_a_folder_that_is_not_there_is_refused(tmp_path):
    """``second_copy(lib, 'nodir/')``: the trailing '/' says a folder; before, a file named
    ``nodir`` was written."""
    from kvpatch.prefetch.tail import second_copy

    lib = tmp_path / "libtail.so"
    lib.write_bytes(b"\x7fELF")
    with pytest.raises(UsageError, match="no folder"):
        second_copy(lib, f"{tmp_path / 'nodir'}/")
    assert not (tmp_path / "nodir").exists()
    assert second_copy(lib, tmp_path / "copy.so").read_bytes() == b"\x7fELF"
