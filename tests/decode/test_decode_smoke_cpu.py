"""The decode bench and the sweep end to end on the CPU: tiny model shapes, CPU tensors, CUDA
graphs replaced by the eager step, a fake attention library, a fake prefetch library and the
controller's fake stream API. What runs is the real code of kvpatch.decode (arms, windows,
forks, the guard, the zero-byte and in-kernel arms, the A/A twin, rounds, reports, the sweep's
stages and its text): a Python error there would otherwise first show on the GPU."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest

torch = pytest.importorskip("torch")

from kvpatch.decode import bench as BENCH  # noqa: E402
from kvpatch.decode import measure as MEASURE  # noqa: E402
from kvpatch.decode import models as MODELS  # noqa: E402
from kvpatch.decode.arms import default_arms  # noqa: E402
from kvpatch.decode.models import ModelShape  # noqa: E402
from kvpatch.decode.options import MiB, WeightPrefetch  # noqa: E402
from kvpatch.decode.windows import STEP_WINDOWS, TailPrefetch, Window  # noqa: E402
from kvpatch.prefetch import controller as CTL  # noqa: E402

TINY = {
    "llama-3.1-8b": ModelShape("llama-3.1-8b", 64, 4, 2, 16, 128, 1e-5, "tiny stand-in"),
    "llama-3.2-1b": ModelShape("llama-3.2-1b", 32, 4, 2, 8, 64, 1e-5, "tiny stand-in"),
}


class Stream:
    cuda_stream = 0

    def __init__(self, log=None, name="side"):
        self.log, self.name = log, name

    def wait_event(self, event):
        pass

    def wait_stream(self, other):
        pass


class Event:
    def record(self, stream=None):
        pass


class CpuAPI:
    """PrefetchController's stream/event adapter, on the CPU (streams and events do nothing)."""

    def normalize(self, device):
        return "cpu"

    def capability(self, device):
        return (9, 0)

    def new_stream(self, device, priority):
        return Stream()

    def new_event(self):
        return Event()

    def current_stream(self, device):
        return Stream(name="main")

    def handle(self, stream):
        return 0

    def make_table(self, ranges, device):
        return torch.tensor([list(r) for r in ranges], dtype=torch.int64).reshape(len(ranges), 2)

    @contextmanager
    def device_guard(self, device):
        yield


class PfLib:
    """The prefetch library: records launches (a prefetch changes no result)."""

    modes = ("prefetch", "demote")
    config = "chunk=4096,line=128,hint=evict_last,threads=32,demote"
    path = "fake-prefetch.so"

    def __init__(self):
        self.launches, self.runs = [], []

    def launch(self, table_ptr, rows, grid, stream, **options):
        assert rows > 0 and table_ptr
        self.launches.append((rows, grid, options.get("hint")))

    def run(self, table_ptr, rows, grid, stream, *, mode, **options):
        self.runs.append((mode, rows, grid))


class Attn:
    """An attention library: a deterministic function of q and the caches' first block."""

    def __init__(self, name):
        self.path, self.prefix = f"fake-{name}.so", f"kvpatch_{name}"
        self.configs = tuple(f"bf16/auto/{s.head_size}/16" for s in TINY.values())
        self.scale_by_value = False

    def _out(self, out, q, kc, vc):
        out.copy_((q.float() * 0.5 + vc[0, 0, 0, 0].float()).to(out.dtype))

    def v1(self, out, q, kc, vc, *rest):
        self._out(out, q, kc, vc)

    def v2(self, out, exp_sums, max_logits, tmp_out, q, kc, vc, *rest):
        self._out(out, q, kc, vc)


class Tail:
    def __init__(self):
        self.tables = []

    def set(self, rows, *, hint, chunk, stream):
        self.tables.append((list(rows), hint, chunk))

    def clear(self, stream=0):
        self.tables.append(([], None, None))


class Graph:
    """The eager step standing in for a captured graph."""

    def __init__(self, fn):
        self.fn = fn
        fn()

    def replay(self):
        self.fn()


class Flush:
    def __init__(self, device, l2_bytes, nbytes=None):
        self.calls = 0

    def __call__(self):
        self.calls += 1


@pytest.fixture
def cpu(monkeypatch):
    """Every CUDA-only call of the decode bench made harmless on the CPU."""
    for name, shape in TINY.items():
        monkeypatch.setitem(MODELS.MODELS, name, shape)
    pf = PfLib()
    tails = {"tail": Tail()}
    monkeypatch.setattr(BENCH, "cuda_device", lambda device: torch.device("cpu"))
    monkeypatch.setattr(BENCH, "prefetch_library_for", lambda lib, dev: pf)
    monkeypatch.setattr(BENCH, "weight_tails", lambda libs: {k: v for k, v in tails.items() if k in libs})
    monkeypatch.setattr(MEASURE, "capture", lambda fn, device: Graph(fn))
    monkeypatch.setattr(CTL, "TorchCudaAPI", CpuAPI)
    import kvpatch.gpu.flush as FL

    monkeypatch.setattr(FL, "L2Flush", Flush)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: Stream(name="main"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a, **k: (1 << 40, 1 << 40))
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: type("P", (), {"clock_rate": 1_000_000})(), raising=False)
    libs = {"stock": Attn("stock"), "patched": Attn("patched"), "tail": Attn("tail"), "tail0": Attn("tail0")}
    return libs, pf, tails


def test_bench_decode_runs_every_control_on_the_cpu(cpu, tmp_path):
    libs, pf, tails = cpu
    wpf = WeightPrefetch()  # the default windows, the library's evict_last: the guard is on
    tail = TailPrefetch({8: 32 * MiB}, "evict_normal")
    report = BENCH.run_bench_decode(libs, models=["llama-3.1-8b"], dtypes=["bf16"], batches=[1, 8], contexts=[64],
                                    layers=3, rounds=2, cycles=1, weight_prefetch=wpf, tail=tail,
                                    json_path=tmp_path / "d.json")  # fmt: skip
    names = [a.name for a in default_arms(libs, wpf, tail=tail)]
    assert report.variants == names == ["stock", "stock-aa", "patched", "stock+zero", "stock+wpf", "tail", "tail+zero", "patched+wpf"]
    assert len(report.points) == 2 and report.summary()["all_identical"]
    p = report.points[0]
    assert p["guard"]["on"] and p["guard"]["hinted_arms"] == ["patched+wpf", "stock+wpf"] and p["guard"]["demoted_bytes"] > 0
    assert p["aa"] is not None and set(p["variants"]) == set(names)
    assert p["variants"]["stock+wpf"]["speedup_vs_zero"] is not None and p["variants"]["patched+wpf"]["speedup_vs_library"]
    # 3 layers: oproj->gateup and gateup->down in each, down->qkv in the first two
    assert p["variants"]["stock+wpf"]["forks"] == p["variants"]["stock+zero"]["forks"] == 8
    assert p["variants"]["stock+zero"]["prefetch_bytes"] == 0 < p["variants"]["stock+wpf"]["prefetch_bytes"]
    assert any(r[0] == "prefetch" and r[1] == 0 for r in pf.runs)  # the zero-byte arm: no rows
    assert any(r[0] == "demote" and r[1] > 0 for r in pf.runs)  # the guard
    assert all(rows for rows, hint, _ in tails["tail"].tables if hint) and len(tails["tail"].tables[0][0]) == 3
    for r in p["raw"]:  # every sample is kept, with the order it ran in
        assert set(r["samples_us"]) == set(r["order"]) and all(len(v) == len(r["order"]) * r["cycles"] for v in r["samples_us"].values())
    assert p["carryover"]["hinted_arms"] == ["patched+wpf", "stock+wpf"] and "stock" in p["carryover"]
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["summary"]["aa"]["of"] == 2 and data["guard"] == "auto"
    from kvpatch.render import decode_text

    text = decode_text(data)
    assert "A/A twin" in text and "stock+zero x" in text and "in-kernel" in text and "bit-identical" in text


def test_without_evict_last_there_is_no_guard_and_guard_off_is_honoured(cpu):
    libs, pf, _ = cpu
    normal = WeightPrefetch(windows=(Window("gateup->down", 8 * MiB, "evict_normal"),))
    report = BENCH.run_bench_decode(libs, models=["llama-3.2-1b"], dtypes=["bf16"], batches=[4], contexts=[32], layers=2,
                                    rounds=2, cycles=1, weight_prefetch=normal, attention=False)  # fmt: skip
    assert not report.points[0]["guard"]["on"] and report.points[0]["carryover"] is None
    assert not any(r[0] == "demote" for r in pf.runs)
    last = WeightPrefetch(windows=(Window("gateup->down", 8 * MiB, "evict_last"),))
    report = BENCH.run_bench_decode(libs, models=["llama-3.2-1b"], dtypes=["bf16"], batches=[4], contexts=[32], layers=2,
                                    rounds=2, cycles=1, weight_prefetch=last, guard="off", attention=False)  # fmt: skip
    assert not report.points[0]["guard"]["on"] and report.points[0]["carryover"] is not None


def test_the_sweep_runs_its_stages_in_order_and_picks(cpu, tmp_path, monkeypatch):
    libs, pf, _ = cpu
    from kvpatch.decode import picks as PK
    from kvpatch.decode import sweep as SW

    monkeypatch.setattr(PK, "BATCHES", (1, 4))
    monkeypatch.setattr(PK, "CONTEXTS", (32,))
    monkeypatch.setattr(PK, "LAYERS", 2)
    monkeypatch.setattr(PK, "ROUNDS", 2)
    monkeypatch.setattr(PK, "STEP_ROUNDS", 2)
    monkeypatch.setattr(PK, "KERNEL_CAPS_MIB", (1,))
    monkeypatch.setattr(PK, "KERNEL_HINTS", ("evict_normal", "evict_last"))
    monkeypatch.setattr(PK, "MICRO_SHAPES", (("tiny", 64, 32),))
    result = SW.run_sweep(libs, tmp_path, budget_s=1e6, prefetch_library=pf)
    assert result["errors"] == {}, result["errors"]
    assert [line.split("] ")[1] for line in result["log"] if line.endswith(": start")] == [
        "lead: start", "micro: start", "kernels: start", "steps: start", "final: start", "guard_off: start"]
    for name in ("sweep.json", "decode_lead.json", "micro.json", "kernels.json", "decode_steps.json", "decode_final.json",
                 "decode_guard_off.json"):
        assert (tmp_path / name).is_file(), name
    assert result["picked"]["config"]["label"] and result["guard_check"]["demoted_bytes"] > 0
    steps = json.loads((tmp_path / "decode_steps.json").read_text())
    assert {f"w:{n}" for n in result["steps"]["windows"]} <= set(steps["variants"])
    kernels = json.loads((tmp_path / "kernels.json").read_text())
    assert {r["window"] for run in kernels for r in run["results"]} == set(STEP_WINDOWS)
    from kvpatch.render import sweep_text

    reports = {k: json.loads((tmp_path / f"decode_{k}.json").read_text()) for k in ("final", "lead", "steps", "guard_off")}
    text = sweep_text(result, reports=reports, kernels=kernels)
    assert "picked weight prefetch" in text and "per window, kernel by kernel" in text and "guard off" in text


def test_a_stage_past_its_share_is_skipped(cpu, tmp_path):
    libs, pf, _ = cpu
    from kvpatch.decode import sweep as SW

    result = SW.run_sweep(libs, tmp_path, budget_s=1e-9, prefetch_library=pf, stages=["lead", "micro"])
    assert result["skipped_stages"] == ["lead", "micro"] and not (tmp_path / "decode_lead.json").exists()
