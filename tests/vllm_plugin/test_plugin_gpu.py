"""The plugin on a GPU, without vLLM: gpu_check's runner over real kernel libraries.

Needs CUDA torch, a GPU and two libraries built by kvpatch from vLLM 0.10.2 (stock and
patched, sm_90a): ``python tests/vllm_plugin/test_plugin_gpu.py build DIR`` builds
them here (nvcc, libclang; no GPU) and ``KVPATCH_PLUGIN_GPU_LIBS=DIR`` points the test
at them; it skips otherwise.

Stubbed (no vLLM is installed on the GPU machine): ``_C`` is a stand-in namespace
with vLLM 0.10.2's schema text whose CUDA kernel is kvpatch's *stock* library behind a
plain :class:`~kvpatch.vllm_plugin.kernel.Override` (vLLM's own binary kernels are
not at hand); ``_custom_ops`` a wrapper giving the trailing arguments vLLM's
defaults; ``forward_decode`` a stand-in applying vLLM's v1/v2 rule. The plugin is the
real one on the CUDA key: bundle, checks, ctypes launches on the current stream,
CUDA graphs, ``get_kernel`` fallback.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import standin as S  # noqa: E402

pytestmark = pytest.mark.gpu
#: What the libraries hold: the plugin check's cases and every configuration vLLM 0.10.2's own
#: test_paged_attention runs (bf16, head sizes 32, 80, 128 and 256, blocks 16 and 32, auto and fp8).
CONFIGS = dict(
    dtypes=("fp16", "bf16"), head_sizes=(32, 80, 128, 256), block_sizes=(16, 32), kv_cache_dtypes=("auto", "fp8")
)
UNBUILT_HEAD = 64
SENTINEL = 7.0  # what the stand-in for vLLM's kernel writes for head size 64 (not built)


def build_libs(out: Path) -> None:
    """Build stock and patched (the default configuration) for sm_90a into ``out``."""
    import shutil

    from kvpatch.config import make_config
    from kvpatch.jit import build, make_spec, patched_variants
    from kvpatch.source.fetch import fetch_release
    from kvpatch.source.releases import HEADER

    tree = fetch_release("0.10.2")
    cfg = make_config()
    variants = patched_variants((tree / HEADER).read_text(encoding="utf-8"), str(tree / HEADER), {"patched": cfg})
    result = build(make_spec(tree, variants, "9.0a", **CONFIGS))
    out.mkdir(parents=True, exist_ok=True)
    from kvpatch.source.releases import header_digest

    info: dict = {"marker": cfg.marker(), "revision": header_digest((tree / HEADER).read_text(encoding="utf-8"))}
    for v in result.variants:
        shutil.copyfile(v.library, out / f"lib{v.name}.so")
        info[v.name] = {"prefix": v.prefix, "configs": list(v.configs), "file": f"lib{v.name}.so"}
    (out / "libs.json").write_text(json.dumps(info, indent=1))


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    libs = os.environ.get("KVPATCH_PLUGIN_GPU_LIBS")
    if not torch.cuda.is_available() or not libs:
        pytest.skip("needs a CUDA GPU and KVPATCH_PLUGIN_GPU_LIBS (see the module docstring)")
    from kvpatch import abi
    from kvpatch.gpu.dispatch import dispatched_kernel
    from kvpatch.gpu.plugin_inputs import custom_ops_call, forward_decode_call
    from kvpatch.vllm_plugin import KernelSet, Target, plugin, write_bundle
    from kvpatch.vllm_plugin.kernel import Override

    cuda_before = torch.cuda.is_initialized()  # an earlier test in this process may have started CUDA
    libs = Path(libs)
    info = json.loads((libs / "libs.json").read_text())
    ns = S.unique_namespace()
    stock = Override(abi.load(libs / info["stock"]["file"], info["stock"]["prefix"]), archs=("sm_90a",),
                     scale_by_value=False)  # fmt: skip

    def stock_kernel(kind):
        fn = stock.impl(kind)

        def kernel(*args):
            if (args[1] if kind == "v1" else args[4]).shape[2] == UNBUILT_HEAD:
                args[0].fill_(SENTINEL)
            else:
                fn(*args)

        return kernel

    lib = torch.library.Library(ns, "DEF")
    for op, text in S.TENSOR_SCALES.items():
        lib.define(text)
        lib.impl(op, stock_kernel(op[-2:]), "CUDA")
        # vLLM's kernel is registered from C++, which torch's Python side does not track: untrack
        # this stand-in too, or torch refuses the plugin's Python override of it
        getattr(torch.library, "_impls", set()).discard(f"{ns}/{op}/CUDA")
    bundle = tmp_path_factory.mktemp("bundle")
    write_bundle(libs / info["patched"]["file"], vllm_release="0.10.2", header_revision="815bd481",
                 marker=info["marker"], archs=("sm_90a",), prefix=info["patched"]["prefix"],
                 configs=info["patched"]["configs"], kernel_set=KernelSet(**CONFIGS),
                 schemas=S.TENSOR_SCALES, scale_by_value=False, directory=bundle)  # fmt: skip
    target = Target(namespace=ns, dispatch_key="CUDA", import_ops=lambda: None, vllm_version=lambda: "0.10.2",
                    bundle=bundle)  # fmt: skip
    decision = plugin.register(target)
    cuda_after_register = torch.cuda.is_initialized()
    reg = plugin.registration(target)
    raw = S.ops(ns)

    class ops:  # noqa: N801
        paged_attention_v1 = staticmethod(lambda *a: raw.paged_attention_v1(*a, 0, 0, 0, 64, 0))
        paged_attention_v2 = staticmethod(lambda *a: raw.paged_attention_v2(*a, 0, 0, 0, 64, 0))

    def forward_decode(query, key_cache, value_cache, block_tables, seq_lens, max_seq_len, *rest):
        names = ["query", "key_cache", "value_cache", "block_tables", "seq_lens", "max_seq_len", "kv_cache_dtype",
                 "num_kv_heads", "scale", "alibi_slopes", "k_scale", "v_scale"]  # fmt: skip
        inp = dict(zip(names, [query, key_cache, value_cache, block_tables, seq_lens, max_seq_len, *rest]))
        inp["block_size"] = value_cache.shape[3]
        return custom_ops_call(ops, dispatched_kernel(query.shape[0], query.shape[1], max_seq_len))(inp)

    @contextlib.contextmanager
    def switch(ours):
        (reg.resume if ours else reg.suspend)()
        try:
            yield
        finally:
            reg.resume()

    calls = {
        "custom_ops": lambda k: custom_ops_call(ops, k),
        "forward_decode": lambda k: forward_decode_call(forward_decode),
    }
    yield dict(decision=decision, cuda_before=cuda_before, cuda_after_register=cuda_after_register, ops=ops, calls=calls, switch=switch,
               configs=info["patched"]["configs"])  # fmt: skip
    plugin.reset()
    del lib


FRESH = "KVPATCH_TEST_FRESH_PROCESS"


def test_registers_without_initialising_cuda(gpu):
    assert gpu["decision"].registered, gpu["decision"].line()
    if not gpu["cuda_before"]:
        assert gpu["cuda_after_register"] is False
        return
    # CUDA was started in this process before the module ran (another GPU test did it): ask a
    # process of its own, where nothing ran before the registration
    assert not os.environ.get(FRESH), "CUDA initialised before the registration in a fresh process"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                           f"{Path(__file__).resolve()}::test_registers_without_initialising_cuda"],
                          env={**os.environ, FRESH: "1"}, cwd=root, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0 and re.search(r"^1 passed\b", done.stdout, re.M), (
        done.stdout[-3000:] + done.stderr[-2000:]
    )


def test_bit_identical_eager_and_in_cuda_graphs(gpu):
    from kvpatch.gpu.plugin_check import CheckReport, matrix, run_cases

    report = CheckReport(results=run_cases(matrix(gpu["configs"]), gpu["calls"], gpu["switch"]))
    assert report.ok, report.summary()


def test_unserved_configuration_reaches_the_previous_kernel(gpu):
    from kvpatch.gpu.plugin_check import Case
    from kvpatch.gpu.plugin_inputs import custom_ops_call, make_inputs

    if not hasattr(torch.library, "get_kernel"):
        pytest.skip("torch < 2.9: such calls raise")
    out = custom_ops_call(gpu["ops"], "v1")(make_inputs(Case("fp16", "auto", UNBUILT_HEAD, 16, False, "v1")))
    assert bool((out == SENTINEL).all())


def test_side_stream(gpu):
    from kvpatch.gpu.plugin_check import Case
    from kvpatch.gpu.plugin_inputs import custom_ops_call, make_inputs

    inp = make_inputs(Case("bf16", "fp8", 128, 16, True, "v2"))
    call = custom_ops_call(gpu["ops"], "v2")
    ref = call(inp)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = call(inp)
    stream.synchronize()
    assert torch.equal(ref, out)


def test_timing(gpu, capsys):
    from kvpatch.gpu.plugin_check import TIMED, time_kernels
    from kvpatch.gpu.plugin_inputs import custom_ops_call

    timings = time_kernels(TIMED, lambda k: custom_ops_call(gpu["ops"], k), gpu["switch"])
    with capsys.disabled():
        for t in timings:
            print(f"\n{t.shape}: stock {t.stock_us:.1f} us, patched {t.kvpatch_us:.1f} us ({t.speedup:.3f}x)")
    assert all(t.stock_us > 0 and t.kvpatch_us > 0 for t in timings)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "build":
        sys.exit("usage: python tests/vllm_plugin/test_plugin_gpu.py build DIR")
    build_libs(Path(sys.argv[2]))
