"""The stages of ``kvpatch bench-decode-sweep`` (:mod:`.sweep` says what each is for and in
which order they run). Each writes its JSON into the run's folder and a summary into the
sweep's result; the later ones read what the earlier ones left there.

torch is imported inside functions only (through the benchmarks they call).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from ..fsutil.reading import parse_json
from .options import DEFAULT_WINDOWS, MiB, WeightPrefetch


class Stages:
    """The sweep's stages over one set of libraries, one output folder and one result dict."""

    def __init__(self, libs: Mapping[str, Any], out: Path, pf_lib: Any, dev: Any, *, note: Callable[[str], None],
                 until: Callable[[str], float], result: dict[str, Any], tail: Any, flush: Any = None) -> None:  # fmt: skip
        self.libs, self.out, self.pf_lib, self.dev, self.flush = libs, out, pf_lib, dev, flush
        self.note, self.until, self.result, self.tail = note, until, result, tail
        result.setdefault("summaries", {})

    def _write(self, name: str, data: Any) -> None:
        from ..fsutil import write_atomic

        write_atomic(self.out / name, json.dumps(data, indent=1, default=str) + "\n")

    def _bench(self, tag: str, arms: list, *, models=None, batches=None, contexts=None, rounds=None, guard: str = "auto",
               attention: bool = True, wpf: Any = None) -> Any:  # fmt: skip
        from .bench import run_bench_decode
        from .picks import BATCHES, CONTEXTS, DTYPE, LAYERS, MODELS, ROUNDS

        report = run_bench_decode(
            self.libs, models=models or MODELS, dtypes=[DTYPE], batches=batches or BATCHES, contexts=contexts or CONTEXTS,
            layers=LAYERS, rounds=rounds or ROUNDS, arms=arms, guard=guard, attention=attention, prefetch_library=self.pf_lib,
            # the report's configuration: the one its +wpf arms run (each arm's own is in its dict)
            weight_prefetch=wpf if wpf is not None else WeightPrefetch(windows=()),
            device=self.dev, deadline=self.until(tag), json_path=self.out / f"decode_{tag}.json", progress=self.note,
            flush=self.flush,
        )  # fmt: skip
        self.result["summaries"][tag] = report.summary()
        return report

    # ----------------------------------------------------------------------- stages

    def _controls(self, tag: str, wpf: WeightPrefetch) -> Any:
        """Stage 1's or 5's bench; if it fails with the in-kernel arms in it, once more without them
        (the side-stream arms are what the run is for; the failure is kept in the log)."""
        from .picks import control_arms

        try:
            return self._bench(tag, control_arms(list(self.libs), wpf, tail=self.tail), wpf=wpf)
        except Exception as e:  # noqa: BLE001
            if self.tail is None or time.perf_counter() > self.until(tag):
                raise
            self.note(f"{tag} failed with the in-kernel arms ({type(e).__name__}: {e}): again without them")
            self.result.setdefault("tail_dropped", {})[tag] = f"{type(e).__name__}: {e}"
            return self._bench(tag, control_arms(list(self.libs), wpf, tail=None), wpf=wpf)

    def lead(self) -> Any:
        wpf = WeightPrefetch(windows=DEFAULT_WINDOWS)
        self.result["lead"] = {"config": wpf.to_dict(), "tail": self.tail.to_dict() if self.tail else None}
        return self._controls("lead", wpf)

    def micro(self) -> Any:
        from .micro import run_micro_gemm
        from .picks import BATCHES, MICRO_SHAPES

        data = {}
        for hint in ("evict_normal", "evict_last"):
            if time.perf_counter() > self.until("micro"):
                break
            data[hint] = run_micro_gemm(self.pf_lib, shapes=MICRO_SHAPES, batches=BATCHES, cap_bytes=32 * MiB, trials=20,
                                        device=self.dev, hint=hint)  # fmt: skip
            for r in data[hint]["results"]:
                self.note(f"  micro {hint}: {r['gemm']} m={r['m']}: cold {r['cold_us']:.1f} prefetched "
                          f"{r['prefetched_us']:.1f} warm {r['warm_us']:.1f} us")  # fmt: skip
        self._write("micro.json", data)
        self.result["micro"] = data
        return data

    def kernels(self) -> Any:
        from .kernels import best_configs, run_window_kernels
        from .picks import BATCHES, DTYPE, KERNEL_CAPS_MIB, KERNEL_HINTS, KERNEL_ROUNDS, MODELS

        runs = []
        for model in MODELS:
            runs.append(run_window_kernels(self.libs, model=model, dtype=DTYPE, batches=BATCHES, caps_mib=KERNEL_CAPS_MIB,
                                           hints=KERNEL_HINTS, rounds=KERNEL_ROUNDS, prefetch_library=self.pf_lib, device=self.dev,
                                           deadline=self.until("kernels"), progress=self.note, flush=self.flush))  # fmt: skip
            self._write("kernels.json", runs)
        results = [r for run in runs for r in run["results"]]
        best = best_configs(results, min_net_us=-float("inf"))
        self.result["kernels"] = {"best": {f"{w}@{b}": v for (w, b), v in sorted(best.items())}}
        return runs

    def steps(self) -> Any:
        from .picks import STEP_ROUNDS, step_arms, step_windows

        best = _best_from(self.result.get("kernels", {}).get("best", {}))
        windows = step_windows(best)
        if not windows:  # no kernel stage: the default windows' caps, one hint each
            windows = {w.name: w for w in DEFAULT_WINDOWS}
        positive = [
            n for n, w in windows.items() if any(best.get((n, b), {}).get("net_us", 1.0) > 0 for b in (1, 4, 8))
        ]
        arms = step_arms(windows, positive)
        self.result["steps"] = {"windows": {n: w.to_dict() for n, w in windows.items()}, "together": positive}
        report = self._bench("steps", arms, rounds=STEP_ROUNDS, attention=False)
        self.result["steps"]["points"] = len(report.points)
        return report

    def final(self) -> Any:
        from .picks import best_single, pick_launch, pick_windows

        steps = _load(self.out / "decode_steps.json")
        windows = {n: _window(d) for n, d in (self.result.get("steps") or {}).get("windows", {}).items()}
        pick, why = (
            pick_windows(steps["points"], windows) if steps and windows else (None, {"reason": "no steps stage"})
        )
        if pick is None:
            single = best_single(steps["points"], windows) if steps and windows else None
            pick = single or WeightPrefetch(windows=DEFAULT_WINDOWS)
            why["fallback"] = (
                f"{'the best single window' if single else 'the default windows'}: {pick.label()} (no window passed)"
            )
        knobs = pick_launch(steps["points"]) if steps else {}
        if knobs:
            pick = pick.with_(**knobs)
            why["launch"] = f"{knobs}: all:small beat all in stage 4"
        self.result["picked"] = {"config": pick.to_dict(), "why": why}
        self.note(f"picked: {pick.label()}")
        return self._controls("final", pick)

    def guard_off(self) -> Any:
        """The lead configuration without the guard (what carries over), and the guard alone
        before stock (whether the demote itself moves what follows it)."""
        from ..gpu.timing import Timer
        from .arms import Arm
        from .measure import guard_check
        from .models import model_shape
        from .picks import DTYPE, LAYERS
        from .step import DecodeStep, DecodeWeights

        wpf = WeightPrefetch(windows=DEFAULT_WINDOWS)
        arms = [Arm("stock", "stock"), Arm("stock-aa", "stock"), Arm("stock+wpf", "stock", wpf)]
        report = self._bench(
            "guard_off", arms, models=["llama-3.1-8b"], batches=[1, 4], contexts=[1024], guard="off", wpf=wpf
        )
        if time.perf_counter() < self.until("guard_off"):
            weights = DecodeWeights(model_shape("llama-3.1-8b"), DTYPE, LAYERS, self.dev, seed=0)
            check = guard_check(
                DecodeStep(weights, 1, 1024, seed=2024), self.libs, self.pf_lib, self.dev, wpf, timer=Timer(self.dev)
            )
            self.result["guard_check"] = {k: v for k, v in check.items() if k != "raw"}
            self._write("guard_check.json", check)
            self.note(f"  guard alone before stock: plain / after the demote {check['ratio']['median']:.4f} "
                      f"[{check['ratio']['min']:.4f}..{check['ratio']['max']:.4f}] over {check['demoted_bytes'] / MiB:.0f} MiB")  # fmt: skip
        return report


def _best_from(saved: Mapping[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    out = {}
    for key, v in saved.items():
        window, _, batch = key.rpartition("@")
        out[(window, int(batch))] = dict(v)
    return out


def _window(d: Mapping[str, Any]) -> Any:
    from .windows import Window

    caps = d["caps"]
    return Window(d["name"], caps if isinstance(caps, int) else {int(b): c for b, c in caps.items()}, d.get("hint"))


def _load(path: Path) -> Any:
    try:
        return parse_json(path.read_bytes())
    except (OSError, ValueError):
        return None
