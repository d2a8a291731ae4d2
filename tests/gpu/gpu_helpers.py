"""What the kvpatch.gpu tests share: CPU stand-ins for kernel libraries, the CLI run in this
process, a synthetic bench report, and a subprocess prelude in which libclang and git cannot
be imported (as on the GPU machine)."""

from __future__ import annotations

import math

import pytest

from kvpatch.gpu import bench_report as Br
from kvpatch.gpu import dispatch as Dp
from kvpatch.gpu import inputs as I
from kvpatch.gpu import launch as Ln
from kvpatch.gpu import points as P
from kvpatch.gpu import reference as R
from kvpatch.gpu import validate as V

try:
    import torch
except ImportError:  # pragma: no cover - the CI venv may have no torch
    torch = None

needs_torch = pytest.mark.skipif(
    torch is None,
    reason="torch is not installed (the CPU build is enough: pip install torch --index-url https://download.pytorch.org/whl/cpu)",
)


class FakeKernels:
    """Computes attention with the reference (rounded to the query dtype) and writes
    vLLM's output buffers; ``fault`` breaks it on purpose."""

    def __init__(self, fault: str | None = None, configs=None, says_configs: bool = True):
        self.fault = fault
        if says_configs:
            self.configs = configs if configs is not None else tuple(
                Ln.config_label(d, kv, h, b) for d in I.DTYPES for kv in I.KV_CACHE_DTYPES
                for h in (16, 32, 64, 128) for b in (8, 16, 32))  # fmt: skip
        self.says_configs = says_configs
        self.calls = 0

    def _compute(self, out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
                 block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale, v_scale):  # fmt: skip
        self.calls += 1
        if not self.says_configs and query.dtype == torch.float32:
            raise RuntimeError("failed for fp32/...: not built")
        inp = I.AttentionInputs(
            query=query, key_cache=key_cache, value_cache=value_cache, block_tables=block_tables,
            seq_lens=seq_lens, seq_lens_list=seq_lens.tolist(), num_kv_heads=num_kv_heads, scale=scale,
            block_size=block_size, max_seq_len=max_seq_len, alibi_slopes=alibi_slopes,
            kv_cache_dtype=kv_cache_dtype, k_scale=k_scale, v_scale=v_scale,
            k_scale_value=float(k_scale[0]), v_scale_value=float(v_scale[0]))  # fmt: skip
        res = R.reference_attention(inp).to(out.dtype)
        if self.fault == "unwritten":
            res[-1, -1, -1] = float("nan")
        elif self.fault == "offbyone":
            res.view(-1)[0] = torch.nextafter(res.view(-1)[0], torch.tensor(math.inf, dtype=res.dtype))
        elif self.fault == "crash":
            raise RuntimeError("illegal memory access")
        out.copy_(res)
        return res

    def v1(self, out, *args):
        self._compute(out, *args)

    def v2(self, out, exp_sums, max_logits, tmp_out, *args):
        res = self._compute(out, *args)
        seq_lens = args[6]
        for i, L in enumerate(seq_lens.tolist()):
            p = Dp.num_partitions(L)
            exp_sums[i, :, :p] = 1.0 + (self.fault == "scratch")
            max_logits[i, :, :p] = 0.5
            tmp_out[i, :, :p] = res[i][:, None, :]


class GroupedKernels(FakeKernels):
    """A stand-in with a grouped form: it counts a launch as grouped where the group of query
    heads per KV head is a multiple of 4 and there is no ALiBi (as the launcher's fallbacks)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.launches = 0

    def grouped_launches(self):
        return self.launches

    def _compute(self, out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, *rest):
        alibi_slopes = rest[3]  # after seq_lens, block_size, max_seq_len
        self.launches += int((query.shape[1] // num_kv_heads) % 4 == 0 and alibi_slopes is None)
        return super()._compute(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, *rest)


def tiny_matrix():
    """16 validate cases: fp16/fp32 x auto/fp8 x v1/v2, head 32, block 16, GQA 4/2, ALiBi,
    contexts 17 and 530 (two v2 partitions)."""
    return V.validate_matrix(dtypes=("fp16", "fp32"), kv_cache_dtypes=("auto", "fp8"), head_sizes=(32,),
                             block_sizes=(16,), kernels=("v1", "v2"), heads=((4, 2),), alibi=(True,),
                             contexts=(17, 530))  # fmt: skip


def run_cli(*args: str) -> int:
    """kvpatch's CLI in this process (so monkeypatches apply); the exit code it would give."""
    from kvpatch import cli
    from kvpatch.errors import KvpatchError

    try:
        cli.app(list(args), standalone_mode=False)
    except KvpatchError as e:
        return e.exit_code
    return 0


def synthetic_report() -> Br.BenchReport:
    """Three variants at three points, both kernels, warm and cold: 'fast' takes half of
    stock's time, 'slow' 1.25x (stock's first round spread 0.9x..1.1x)."""
    names = ["stock", "fast", "slow"]
    pts = [P.BenchPoint("fp16", 1, 1024), P.BenchPoint("fp16", 64, 1024), P.BenchPoint("bf16", 1, 1024)]
    raw = {}
    for p in pts:
        for k in ("v1", "v2"):
            for m in ("warm", "cold"):
                base = 100.0 if k == "v1" else 50.0
                raw[(p, k, m)] = {
                    "stock": [[base, base * 1.1, base * 0.9], [base] * 3],
                    "fast": [[base / 2] * 3, [base / 2] * 3],
                    "slow": [[base * 1.25] * 3, [base * 1.25] * 3],
                }
    results = Br.finish_results(raw, names, copy_bytes_per_s=4e12)
    return Br.BenchReport(baseline="stock", variants=names, results=results,
                          copy_bandwidth={"bytes_per_s": 4e12}, settings={"reps": 3}, env={"gpu": {"name": "fake"}})  # fmt: skip


def has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


#: The start of a subprocess script in which importing clang or git fails, as on the H200
#: (no libclang there): what the GPU-side commands must work without.
WITHOUT_CLANG_AND_GIT = """import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("clang", "git"):
            raise ImportError(f"blocked: {name}")
sys.meta_path.insert(0, Block())
"""
