"""The body of ``kvpatch plugin check``: vLLM's own kernel against the override, on a GPU.

With vLLM installed, a GPU and the plugin registered in this process, :func:`check`
runs every :class:`Case` of a matrix (dtype, kv-cache dtype, head size, block size,
ALiBi on/off, v1/v2; the v1 cases again sized for 8192 tokens, as vLLM's decode graphs are,
and captured before any eager call) through ``vllm._custom_ops`` and through
``PagedAttention.forward_decode``, eagerly and captured in a CUDA graph replayed with
changed inputs, once with vLLM's kernel (the override suspended) and once with the
override, and compares the outputs bit for bit (``torch.equal`` on the raw bits, so a
NaN equals the same NaN). It then times both kernels at a few decode shapes (calls
captured in CUDA graphs, each replay event-timed, the median). The result is a :class:`CheckReport`: the first
difference named, and the times side by side.

The runner takes its calls and its stock/override switch as arguments, so it also
runs on CPU against stand-ins (eagerly: graphs need CUDA). torch and vLLM are
imported inside the functions only.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Iterator

from ..errors import GpuCheckError, KvpatchError
from .plugin_inputs import Case, custom_ops_call, forward_decode_call, long_cases, make_inputs, matrix, outputs  # noqa: F401

PATHS = ("custom_ops", "forward_decode")


@dataclass(frozen=True)
class CaseResult:
    case: Case
    path: str  # 'custom_ops' | 'forward_decode'
    mode: str  # 'eager' | 'graph' | 'graph replayed'
    equal: bool
    difference: str = ""  # the first differing element, when not equal
    error: str = ""  # an exception instead of an output

    @property
    def label(self) -> str:
        return f"{self.case.label} via {self.path}, {self.mode}"


@dataclass(frozen=True)
class Timing:
    shape: str
    stock_us: float
    kvpatch_us: float

    @property
    def speedup(self) -> float:
        return self.stock_us / self.kvpatch_us if self.kvpatch_us else float("nan")


@dataclass
class CheckReport:
    results: list[CaseResult] = field(default_factory=list)
    timings: list[Timing] = field(default_factory=list)
    decision: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.equal and not r.error for r in self.results)

    @property
    def first_failure(self) -> CaseResult | None:
        return next((r for r in self.results if not r.equal or r.error), None)

    def summary(self) -> list[str]:
        n, bad = len(self.results), sum(1 for r in self.results if not r.equal or r.error)
        cases = len({r.case for r in self.results})
        lines = [f"{n - bad}/{n} outputs bit-identical to vLLM's kernel ({cases} cases)"]
        if (f := self.first_failure) is not None:
            lines.append(f"first difference: {f.label}: {f.error or f.difference}")
        lines += [f"{t.shape}: vLLM {t.stock_us:.1f} us, kvpatch {t.kvpatch_us:.1f} us ({t.speedup:.3f}x)"
                  for t in self.timings]  # fmt: skip
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "decision": self.decision,
                "results": [{**asdict(r), "label": r.label} for r in self.results],
                "timings": [{**asdict(t), "speedup": t.speedup} for t in self.timings]}  # fmt: skip


# --------------------------------------------------------------------------- comparing


def _bits(t: Any) -> Any:
    import torch

    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.contiguous().view(ints[t.element_size()])


def first_difference(stock: Any, ours: Any, name: str = "out") -> str | None:
    """None when the tensors are equal bit for bit, else the first differing element."""
    import torch

    if stock.shape != ours.shape or stock.dtype != ours.dtype:
        return f"{name}: vLLM's is {stock.dtype} {tuple(stock.shape)}, kvpatch's {ours.dtype} {tuple(ours.shape)}"
    a, b = _bits(stock), _bits(ours)
    if torch.equal(a, b):
        return None
    diff = a != b
    idx = tuple(int(i) for i in diff.nonzero()[0])
    where = ", ".join(map(str, idx))
    return (f"{name}[{where}]: vLLM {float(stock[idx]):.6g}, kvpatch {float(ours[idx]):.6g} "
            f"({int(diff.sum())} of {diff.numel()} elements differ)")  # fmt: skip


# --------------------------------------------------------------------------- running


def run_cases(cases: Iterable[Case], calls: dict[str, Callable[[str], Callable]], switch: Callable[[bool], Any], *,
              device: Any = "cuda", graphs: bool = True, scale_by_value: bool = False) -> list[CaseResult]:  # fmt: skip
    """Each case through each path in ``calls`` (path -> kernel -> call), with vLLM's
    kernel (``switch(False)``, a context manager) and with the override (``switch(True)``)."""
    results = []
    for i, case in enumerate(cases):
        for path, make in calls.items():
            got: dict[bool, Any] = {}
            for ours in (False, True):
                inp = make_inputs(case, device=device, scale_by_value=scale_by_value, seed=i)
                try:
                    with switch(ours):
                        got[ours] = outputs(make(case.kernel), inp, graphs, seed=10_000 + i, graph_first=case.long)
                except Exception as e:  # noqa: BLE001 - a result, so that the report names it
                    got[ours] = f"{'kvpatch' if ours else 'vLLM'}: {type(e).__name__}: {e}"
            if isinstance(got[False], str) or isinstance(got[True], str):
                err = "; ".join(x for x in got.values() if isinstance(x, str))
                results.append(CaseResult(case, path, "eager", False, error=err))
                continue
            for mode, stock in got[False].items():
                diff = first_difference(stock, got[True][mode])
                results.append(CaseResult(case, path, mode, diff is None, diff or ""))
    return results


def time_kernels(shapes: Iterable[tuple[str, Case, tuple[int, int, int, int]]], call: Callable[[str], Callable],
                 switch: Callable[[bool], Any], *, scale_by_value: bool = False, reps: int = 30,
                 per_graph: int = 10) -> list[Timing]:  # fmt: skip
    """``(label, case, (num_seqs, num_heads, num_kv_heads, max_seq_len))`` per shape: each
    kernel's GPU time per call, in us. ``per_graph`` calls are captured in one CUDA graph per
    kernel (so that host overhead, larger for a Python kernel, is not what is timed, and as
    vLLM runs decode); the two graphs' replays are timed interleaved on kvpatch's one timer
    (:func:`kvpatch.gpu.timing.time_interleaved`); the median of ``reps`` replays each."""
    import torch

    from .stats import median
    from .timing import Timer, time_interleaved

    out = []
    timer = Timer("cuda")
    for label, case, shape in shapes:
        graphs = {}
        inp = make_inputs(case, shape=shape, scale_by_value=scale_by_value)
        for ours in (False, True):
            fn = call(case.kernel)
            with switch(ours):
                fn(inp)
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for _ in range(per_graph):
                        fn(inp)
            graphs[ours] = g
        stock_us, ours_us = time_interleaved([graphs[False].replay, graphs[True].replay], reps=2 * reps, warmup=1,
                                             timer=timer)  # fmt: skip
        out.append(Timing(label, median(stock_us) / per_graph, median(ours_us) / per_graph))
        del graphs
    return out


#: The decode shapes timed by default: (label, case, (num_seqs, num_heads, num_kv_heads, max_seq_len)).
TIMED = [(f"{d} 128/16 {k} {s}x{L}", Case(d, "auto", 128, 16, False, k), (s, 32, 8, L))
         for d in ("fp16", "bf16") for k, s, L in (("v1", 64, 1024), ("v1", 128, 2048), ("v2", 8, 16384))]  # fmt: skip


def check(cases: list[Case] | None = None, *, graphs: bool = True, timed=TIMED, reps: int = 30) -> CheckReport:
    """``kvpatch plugin check``: register the plugin here (GpuCheckError if it refuses),
    compare every case, time the kernels."""
    import torch

    try:
        from vllm import _custom_ops as ops
        from vllm.attention.ops.paged_attn import PagedAttention
    except Exception as e:  # noqa: BLE001 - whatever vLLM's import raises is one line
        raise KvpatchError(f"cannot import vLLM's paged attention ({type(e).__name__}: {e})") from None

    from ..vllm_plugin import plugin

    if not torch.cuda.is_available():
        raise GpuCheckError("no CUDA GPU visible: kvpatch plugin check needs one")
    decision = plugin.register()
    reg = plugin.registration()
    if reg is None:
        raise GpuCheckError(decision.line())

    @contextlib.contextmanager
    def switch(ours: bool) -> Iterator[None]:
        (reg.resume if ours else reg.suspend)()
        try:
            yield
        finally:
            reg.resume()

    lib = reg.override.launcher
    if cases is None:
        cases = matrix(lib.configs)
        cases += long_cases(cases)
    calls = {"custom_ops": lambda k: custom_ops_call(ops, k),
             "forward_decode": lambda k: forward_decode_call(PagedAttention.forward_decode)}  # fmt: skip
    report = CheckReport(decision=decision.to_dict())
    report.results = run_cases(cases, calls, switch, graphs=graphs, scale_by_value=lib.scale_by_value)
    built = set(lib.configs)
    timed = [t for t in timed if f"{t[1].dtype}/auto/{t[1].head_size}/{t[1].block_size}" in built]
    report.timings = time_kernels(timed, lambda k: custom_ops_call(ops, k), switch,
                                  scale_by_value=lib.scale_by_value, reps=reps)  # fmt: skip
    return report
