"""register() and decide() against a stand-in ``_C`` on CPU.

Stubbed (CPU torch has no CUDA, and there is no built ``vllm._C`` or kernel library
here): the ops are defined in a fresh namespace per test with vLLM's schema text
(standin.define_ops), vLLM's C++ kernel is a CPU kernel writing 1.0, the plugin
registers on the CPU dispatch key, the launcher library is standin.FakeLauncher
(records each launch, writes 2.0), the device operations are standin.CpuDevice,
and vLLM's version comes from the target. Everything else is the plugin's own code:
the bundle on disk, every check, torch.library registration, the dispatcher dump.
"""

from __future__ import annotations

import gc
import json
import logging

import pytest

torch = pytest.importorskip("torch")

import standin as S  # noqa: E402

from kvpatch.vllm_plugin import Target, plugin  # noqa: E402
from kvpatch.vllm_plugin.bundle import MANIFEST  # noqa: E402

#: torch >= 2.9: calls the library cannot serve go to the previous kernel.
HAS_GET_KERNEL = hasattr(torch.library, "get_kernel")
needs_get_kernel = pytest.mark.skipif(not HAS_GET_KERNEL, reason=f"torch {torch.__version__} has no "
                                      "torch.library.get_kernel (2.9+): such calls raise, tested separately")  # fmt: skip


@pytest.fixture
def env(tmp_path):
    """A stand-in namespace with vLLM's schemas, a bundle for 0.10.2, a fake launcher."""

    class Env:
        ns = S.unique_namespace()
        calls: list = []
        lib = S.define_ops(ns, S.TENSOR_SCALES, calls)
        bundle = S.make_bundle(tmp_path / "bundle")
        launcher = S.FakeLauncher(S.SMALL_SET.labels())
        device = S.CpuDevice()

        def target(self, **kw) -> Target:
            kw.setdefault("device", self.device)
            return S.make_target(self.ns, self.bundle, self.launcher, **kw)

        def call(self, kind="v1", **kw):
            args = S.make_args(kind, **kw)
            getattr(S.ops(self.ns), f"paged_attention_{kind}")(*args)
            return float(args[0].flatten()[0])

    return Env()


def _active(ns: str, key: str = "CPU") -> str | None:
    return plugin.active_kernel(f"{ns}::paged_attention_v1", key)[0]


def test_override_is_active_and_restored(env):
    assert env.call() == S.STOCK
    before = _active(env.ns)
    d = plugin.register(env.target())
    assert d.registers and d.registered, d.line()
    active, inactive = plugin.active_kernel(f"{env.ns}::paged_attention_v1", "CPU")
    assert active != before and inactive == [before]  # vLLM's kernel shadowed, not gone
    assert env.call("v1") == S.OURS and env.call("v2", max_seq_len=1000) == S.OURS
    assert [k for k, _ in env.launcher.calls] == ["v1", "v2"]
    assert plugin.unregister(env.target())  # _destroy(): vLLM's kernel is back
    assert _active(env.ns) == before and env.call() == S.STOCK


def test_registration_that_is_not_active_is_withdrawn(env, monkeypatch, caplog):
    """As if the dispatcher still ran vLLM's kernel after impl() (a registration superseded)."""
    real = plugin.active_kernel
    frozen = {op: real(f"{env.ns}::{op}", "CPU") for op in ("paged_attention_v1", "paged_attention_v2")}
    monkeypatch.setattr(plugin, "active_kernel", lambda qual, key: frozen[qual.split("::")[1]])
    caplog.set_level(logging.INFO, "kvpatch.vllm_plugin")
    d = plugin.register(env.target())
    assert d.action == "refuse" and "is not kvpatch's" in d.reason and not d.registered
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    monkeypatch.setattr(plugin, "active_kernel", real)
    assert plugin.registration(env.target()) is None and env.call() == S.STOCK  # withdrawn


def test_dropping_the_library_restores(env):
    reg_target = env.target()
    plugin.register(reg_target)
    reg = plugin.registration(reg_target)
    assert env.call() == S.OURS
    lib, reg.library = reg.library, None
    del lib  # no _destroy(): the Library's finalizer deregisters when it is collected
    gc.collect()
    assert env.call() == S.STOCK


def test_arguments_reach_the_launcher(env):
    plugin.register(env.target())
    args = S.make_args("v1", alibi=True)
    S.ops(env.ns).paged_attention_v1(*args)
    ((kind, got),) = env.launcher.calls
    out, query, key_cache, value_cache = args[:4]
    assert kind == "v1" and got["out"] == out.data_ptr() and got["query"] == query.data_ptr()
    assert (got["num_seqs"], got["num_heads"], got["head_size"], got["num_kv_heads"]) == (2, 4, 32, 2)
    assert (got["q_stride"], got["kv_block_stride"], got["kv_head_stride"]) == (
        query.stride(0),
        key_cache.stride(0),
        key_cache.stride(1),
    )
    assert got["max_num_blocks_per_seq"] == args[6].shape[1] and got["block_size"] == 16
    assert got["alibi_slopes"] == args[10].data_ptr() and got["scale"] == 0.125
    assert (got["dtype"], got["kv_cache_dtype"]) == (2, 0)
    assert (got["k_scale_ptr"], got["v_scale_ptr"]) == (args[12].data_ptr(), args[13].data_ptr())
    assert got["stream"] == 1234  # the device's current stream, asked at each call


def test_float_scales_of_0_6_4(tmp_path):
    ns = S.unique_namespace()
    keep = S.define_ops(ns, S.FLOAT_SCALES)  # noqa: F841
    launcher = S.FakeLauncher(S.SMALL_SET.labels(), scale_by_value=True)
    bundle = S.make_bundle(tmp_path / "b", release="0.6.4", schemas=S.FLOAT_SCALES)
    d = plugin.register(S.make_target(ns, bundle, launcher, release="0.6.4"))
    assert d.registered, d.line()
    args = S.make_args("v2", float_scales=True, max_seq_len=700)
    args[15:17] = [0.5, 0.25]  # k_scale, v_scale
    S.ops(ns).paged_attention_v2(*args)
    got = launcher.calls[0][1]
    assert (got["k_scale_ptr"], got["v_scale_ptr"], got["k_scale"], got["v_scale"]) == (None, None, 0.5, 0.25)


def test_register_twice_is_a_no_op(env, caplog):
    caplog.set_level(logging.DEBUG, "kvpatch.vllm_plugin")
    first = plugin.register(env.target())
    n = len(caplog.records)
    assert n == 1 and caplog.records[0].levelno == logging.INFO
    assert plugin.register(env.target()) is first
    assert len(caplog.records) == n  # nothing new logged
    dump = torch._C._dispatch_dump(f"{env.ns}::paged_attention_v1")
    assert dump.count("CPU: ") == 1 and dump.count("CPU (inactive): ") == 1  # registered once
    assert env.call() == S.OURS


def test_before_the_ops_exist_is_a_clear_refusal(tmp_path):
    ns = S.unique_namespace()
    bundle = S.make_bundle(tmp_path / "b")
    d = plugin.register(S.make_target(ns, bundle, S.FakeLauncher(S.SMALL_SET.labels())))
    assert d.action == "refuse" and "is not defined" in d.reason and not d.registered
    keep = S.define_ops(ns, S.TENSOR_SCALES)  # noqa: F841 - vLLM's kernels arrive afterwards
    args = S.make_args("v1")
    S.ops(ns).paged_attention_v1(*args)
    assert float(args[0].flatten()[0]) == S.STOCK  # nothing of ours was left behind


def test_import_ops_runs_first(tmp_path):
    ns = S.unique_namespace()
    keep = []
    bundle = S.make_bundle(tmp_path / "b")
    target = S.make_target(ns, bundle, S.FakeLauncher(S.SMALL_SET.labels()),
                           import_ops=lambda: keep.append(S.define_ops(ns, S.TENSOR_SCALES)))  # fmt: skip
    assert plugin.register(target).registered


@pytest.mark.parametrize("value, registers", [("1", False), ("yes", False), ("0", True), ("", True)])
def test_kill_switch(env, monkeypatch, value, registers):
    monkeypatch.setenv("KVPATCH_DISABLE", value)
    d = plugin.register(env.target())
    assert d.registered is registers
    assert env.call() == (S.OURS if registers else S.STOCK)
    if not registers:
        assert d.action == "off" and "KVPATCH_DISABLE" in d.reason


def test_not_enabled(env, tmp_path, caplog):
    caplog.set_level(logging.INFO, "kvpatch.vllm_plugin")
    d = plugin.register(S.make_target(env.ns, tmp_path / "nothing", env.launcher))
    assert d.action == "off" and "not enabled" in d.reason
    assert not caplog.records  # just installed, not enabled: silent below DEBUG
    assert env.call() == S.STOCK


def test_default_bundle_dir_comes_from_the_environment(env, monkeypatch):
    monkeypatch.setenv("KVPATCH_PLUGIN_DIR", str(env.bundle))
    t = env.target()
    assert plugin.decide(Target(**{**t.__dict__, "bundle": None})).registers


def _refusal(env, caplog, **kw) -> str:
    caplog.set_level(logging.INFO, "kvpatch.vllm_plugin")
    d = plugin.register(env.target(**kw))
    assert d.action == "refuse" and not d.registered
    assert [r.levelno for r in caplog.records] == [logging.WARNING]  # one warning line
    assert "\n" not in caplog.records[0].getMessage()
    assert env.call() == S.STOCK  # vLLM's kernel stays
    return d.reason + " | " + d.fix


def test_version_mismatch(env, caplog):
    why = _refusal(env, caplog, release="0.10.1.1")
    assert "for vLLM 0.10.2" in why and "0.10.1.1" in why


def test_version_local_label_is_ignored(env):
    assert plugin.register(env.target(release="0.10.2+cu128")).registered


def test_damaged_manifest(env, caplog):
    (env.bundle / MANIFEST).write_text('{"format": 1, "vllm_rel')
    assert "damaged manifest" in _refusal(env, caplog)


def test_manifest_missing_a_field(env, caplog):
    m = json.loads((env.bundle / MANIFEST).read_text())
    del m["library_sha256"]
    (env.bundle / MANIFEST).write_text(json.dumps(m))
    assert "lacks 'library_sha256'" in _refusal(env, caplog)


def _library(env):
    return env.bundle / json.loads((env.bundle / MANIFEST).read_text())["library"]


def test_sha256_mismatch(env, caplog):
    lib = _library(env)
    data = bytearray(lib.read_bytes())
    data[-1] ^= 1  # same size, other bytes
    lib.write_bytes(bytes(data))
    assert "sha256 differs" in _refusal(env, caplog)


def test_size_mismatch(env, caplog):
    with _library(env).open("ab") as f:
        f.write(b"x")
    assert "bytes, the manifest says" in _refusal(env, caplog)


def test_abi_mismatch_in_the_manifest(env, caplog):
    m = json.loads((env.bundle / MANIFEST).read_text())
    m["abi_version"] = 999
    (env.bundle / MANIFEST).write_text(json.dumps(m))
    assert "launcher ABI is 999" in _refusal(env, caplog)


def test_abi_mismatch_in_the_library(env, caplog):
    from kvpatch.abi import AbiError

    def load(path, prefix):
        raise AbiError(f"{path} has launcher ABI 7, this kvpatch expects 1: rebuild it")

    t = env.target()
    caplog.set_level(logging.INFO, "kvpatch.vllm_plugin")
    d = plugin.register(Target(**{**t.__dict__, "load_library": load}))
    assert d.action == "refuse" and "launcher ABI 7" in d.reason and env.call() == S.STOCK


def test_library_configs_must_match_the_manifest(env, caplog):
    env.launcher.configs = env.launcher.configs[:-1]
    assert "configurations are not the ones" in _refusal(env, caplog)


def test_partial_build_is_refused(tmp_path, caplog):
    from kvpatch.vllm_plugin import KernelSet
    from kvpatch.vllm_plugin.bundle import BundleError

    with pytest.raises(BundleError, match="1 of the release's 4 configurations are not built"):
        S.make_bundle(tmp_path / "b", configs=S.SMALL_SET.labels()[:3])
    bigger = KernelSet(("fp32", "fp16"), ("auto",), (32, 64, 128), (16,))
    ns = S.unique_namespace()
    keep = S.define_ops(ns, S.TENSOR_SCALES)  # noqa: F841
    bundle = S.make_bundle(tmp_path / "c")
    m = json.loads((bundle / MANIFEST).read_text())
    m["kernel_set"]["head_sizes"] = list(bigger.head_sizes)  # a manifest edited by hand
    (bundle / MANIFEST).write_text(json.dumps(m))
    d = plugin.register(S.make_target(ns, bundle, S.FakeLauncher(S.SMALL_SET.labels())))
    assert d.action == "refuse" and "2 of the release's 6 configurations are not built" in d.reason


def test_schema_mismatch_is_refused(env, caplog, tmp_path):
    ns = S.unique_namespace()
    keep = S.define_ops(ns, S.FLOAT_SCALES)  # noqa: F841 - the installed ops take floats
    t = S.make_target(ns, env.bundle, env.launcher)  # the bundle records Tensor scales
    caplog.set_level(logging.INFO, "kvpatch.vllm_plugin")
    d = plugin.register(t)
    assert d.action == "refuse" and "argument 12 is 'float k_scale'" in d.reason


# --------------------------------------------------------------------------- calls it cannot serve


@pytest.mark.parametrize("case, kw, why", [
    ("blocksparse", {"vert_stride": 4}, "blocksparse"),
    ("config", {"head_size": 128}, "fp32/auto/128/16 is not in the library"),
    ("dtype", {"dtype": torch.float64}, "query dtype torch.float64"),
    ("kv dtype", {"kv": "int8"}, "kv_cache_dtype 'int8'"),
])  # fmt: skip
@needs_get_kernel
def test_unserved_calls_go_to_the_previous_kernel(env, case, kw, why, caplog):
    caplog.set_level(logging.INFO, "kvpatch.vllm_plugin")
    plugin.register(env.target())
    assert env.call("v1", **kw) == S.STOCK and env.call("v2", **kw) == S.STOCK
    assert not env.launcher.calls
    assert any(why in r.getMessage() for r in caplog.records)
    assert env.call("v1") == S.OURS  # served calls still are


@pytest.mark.parametrize("kw, why", [({"vert_stride": 4}, "blocksparse"), ({"head_size": 128}, "not in the library")])
def test_unserved_calls_raise_without_get_kernel(env, kw, why):
    d = plugin.register(env.target(get_kernel=False))  # as on torch < 2.9
    assert d.registered and d.fallback == "error" and "RuntimeError" in d.unserved
    with pytest.raises(RuntimeError, match=f"cannot serve this paged_attention_v1 call: .*{why}.*KVPATCH_DISABLE=1"):
        env.call("v1", **kw)
    assert env.call("v1") == S.OURS


def test_gpu_arch_not_built_for(env):
    env.device.cap = (8, 0)
    plugin.register(env.target(get_kernel=False))
    with pytest.raises(RuntimeError, match="sm_80; the bundle is built for sm_90a"):
        env.call()
    with pytest.raises(RuntimeError, match="sm_80"):
        env.call()
    assert env.device.asked == [-1]  # asked once per device, then cached
    if HAS_GET_KERNEL:
        plugin.reset()
        plugin.register(env.target())
        assert env.call() == S.STOCK


def test_layout_the_launcher_cannot_take(env):
    plugin.register(env.target(get_kernel=False))
    args = S.make_args("v1")
    args[0] = torch.zeros(4, 2, 32).transpose(0, 1)  # a non-contiguous out
    with pytest.raises(RuntimeError, match="an output buffer is not contiguous"):
        S.ops(env.ns).paged_attention_v1(*args)
    assert not env.launcher.calls
    if HAS_GET_KERNEL:
        plugin.reset()
        plugin.register(env.target())
        S.ops(env.ns).paged_attention_v1(*args)
        assert float(args[0].flatten()[0]) == S.STOCK and not env.launcher.calls


def test_launcher_error_is_raised(env):
    env.launcher.rc = 700
    plugin.register(env.target())
    with pytest.raises(RuntimeError, match="kvpatch paged_attention_v1 failed for fp32/auto/32/16: fake error 700"):
        env.call()


def test_decide_matches_register_and_registers_nothing(env):
    d = plugin.decide(env.target())
    assert d.registers and not d.registered and d.fallback == ("get_kernel" if HAS_GET_KERNEL else "error")
    assert "would run" in d.line() and env.call() == S.STOCK
    assert plugin.register(env.target()).registered
    assert plugin.decide(env.target()).registered  # after register(): its decision


def test_engine_notes(env, monkeypatch):
    from kvpatch.vllm_plugin.checks import engine_notes

    assert engine_notes("0.10.2", {}) == ("vLLM calls them only with VLLM_USE_V1=0 VLLM_ATTENTION_BACKEND=XFORMERS",)
    assert engine_notes("0.6.4", {}) == ("vLLM calls them only with VLLM_ATTENTION_BACKEND=XFORMERS",)  # V0 only
    assert engine_notes("0.10.2", {"VLLM_USE_V1": "0", "VLLM_ATTENTION_BACKEND": "XFORMERS"}) == ()
    monkeypatch.setenv("VLLM_USE_V1", "0")
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND", raising=False)
    line = plugin.register(env.target()).line()
    assert line.endswith("switches back [vLLM calls them only with VLLM_ATTENTION_BACKEND=XFORMERS]")


def test_refusal_line_is_one_line(env):
    def boom():
        raise ImportError("libcudart.so.12: cannot open shared object file\n  (and more)")

    d = plugin.register(env.target(import_ops=boom))
    assert d.action == "refuse" and "\n" not in d.line() and "libcudart.so.12" in d.line()


def test_decide_probes_gpus_on_request(env):
    d = plugin.decide(env.target(), probe_gpu=True)
    if not torch.cuda.is_available():
        assert d.gpus == ("no CUDA GPU visible",)
    assert plugin.decide(env.target()).gpus == ()


@pytest.fixture
def without_vllm(monkeypatch):
    """vLLM's installed metadata, as the default reader reads it, says it is not installed."""
    import importlib.metadata

    real = importlib.metadata.version

    def version(name):
        if name == "vllm":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)


def test_without_vllm_installed_the_reason_is_vllm_not_torch(tmp_path, without_vllm):
    """With vLLM's reader left to the default (its installed metadata), a missing vLLM is the
    reason given, before torch or vLLM's kernels are looked at."""
    bundle = S.make_bundle(tmp_path / "bundle")
    d = plugin.decide(Target(bundle=bundle, import_ops=lambda: pytest.fail("vLLM's kernels were imported")))
    assert d.action == "refuse" and d.reason == "vLLM is not installed in this environment"
    assert d.fix == "install vLLM 0.10.2, the bundle's release"


def test_a_damaged_bundle_is_said_before_a_missing_vllm(tmp_path, without_vllm):
    """Before: with vLLM missing, a bundle whose library was removed (or made a directory) was
    reported only as 'vLLM is not installed', a fix that would not make it load; a directory read
    as a library of 4096 bytes. After: the library's file is checked right after the manifest,
    before anything of the environment; an empty 'archs' is a damaged manifest."""
    bundle = S.make_bundle(tmp_path / "bundle")
    library = bundle / json.loads((bundle / MANIFEST).read_text())["library"]
    library.unlink()
    d = plugin.decide(Target(bundle=bundle))
    assert d.action == "refuse" and d.reason.startswith(f"cannot read the bundle's library {library}"), d.reason
    library.mkdir()
    d = plugin.decide(Target(bundle=bundle))
    assert d.reason == f"the bundle's library {library} is a directory, not the library the manifest names"
    library.rmdir()
    bundle = S.make_bundle(tmp_path / "bundle")
    m = json.loads((bundle / MANIFEST).read_text())
    (bundle / MANIFEST).write_text(json.dumps({**m, "archs": []}))
    d = plugin.decide(Target(bundle=bundle))
    assert d.action == "refuse" and "the manifest's 'archs' is empty" in d.reason, d.reason
