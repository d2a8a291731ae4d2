"""One engine start: the process ``kvpatch plugin bench`` runs per arm and round.

    python -m kvpatch.serving.worker SPEC.json RESULT.json

It starts vLLM's own engine (``vllm.LLM``; the parent sets ``VLLM_USE_V1=0``,
``VLLM_ATTENTION_BACKEND=XFORMERS`` and, for vLLM's arms, ``KVPATCH_DISABLE=1``), so the
plugin is loaded by vLLM's own plugin loader, exactly as in a user's server. Prompts are
token ids (no tokenizer), every request generates exactly its output length
(``ignore_eos``), greedy. For each workload: one short warm-up batch, then the timed batch,
driven through the engine's own ``add_request``/``step`` loop with every step timed on the
host clock (a step returns once its sampled tokens are on the host, so it includes the
GPU's work and vLLM's scheduling around it). It records what the plugin decided in this
process and the dispatcher's active kernel, writes RESULT.json, and exits.

:func:`step_stats` (pure) turns the step log into the numbers the report uses.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any, Sequence

from ..gpu.stats import median

#: Lines the parent relays as progress start with this.
PROGRESS = "kvpatch-serving: "


def step_stats(steps: Sequence[Sequence[float]], batch: int, output_len: int) -> dict[str, Any]:
    """From ``[(seconds, new tokens, first tokens), ...]`` per engine step: the decode step's
    median and mean time (the steps after every request has its first token, minus one at
    each end: the hand-over from prefill and the final, partial step), the time to the last
    first token, the whole batch's latency, and output tokens per second."""
    if not steps:
        raise ValueError("no engine step was recorded")
    total = sum(s[0] for s in steps)
    tokens = int(sum(s[1] for s in steps))
    last_first = max((i for i, s in enumerate(steps) if s[2] > 0), default=0)
    decode = [s[0] for s in steps[last_first + 2 : -1]]
    out: dict[str, Any] = {
        "steps": len(steps),
        "decode_steps": len(decode),
        "prefill_s": sum(s[0] for s in steps[: last_first + 1]),
        "latency_s": total,
        "tokens": tokens,
        "tokens_expected": batch * output_len,
        "tokens_per_s": tokens / total if total > 0 else 0.0,
    }
    if decode:
        out.update(decode_ms=1e3 * median(decode), decode_mean_ms=1e3 * sum(decode) / len(decode))
    return out


def _say(text: str) -> None:
    print(PROGRESS + text, flush=True)


def engine_wanted(spec: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The engine arguments for the spec (vLLM's names); ``overrides``: the config's rope
    settings, passed on as ``hf_overrides``."""
    return {
        "model": spec["model"], "tokenizer": spec["model"], "skip_tokenizer_init": True, "dtype": spec["dtype"],
        "seed": spec["seed"], "gpu_memory_utilization": spec["gpu_memory_utilization"],
        "max_model_len": spec["max_model_len"], "max_num_seqs": max(spec["capture_sizes"]),
        "max_num_batched_tokens": max(spec["max_model_len"], 8192), "enable_chunked_prefill": False,
        "enforce_eager": False, "cuda_graph_sizes": spec["capture_sizes"],
        "max_seq_len_to_capture": spec.get("max_seq_len_to_capture", spec["max_model_len"]),
        "hf_overrides": overrides or None, "load_format": "dummy" if spec["dummy_weights"] else "auto",
        "disable_log_stats": True, "enable_prefix_caching": False,
    }  # fmt: skip


def _engine(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """vLLM's LLM for the spec, and what was passed (the arguments this release lacks are
    left out and named)."""
    import dataclasses

    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in dataclasses.fields(EngineArgs)}
    with open(os.path.join(spec["model"], "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    overrides = {k: config[k] for k in ("rope_theta", "rope_scaling") if k in config}
    wanted = engine_wanted(spec, overrides)
    args = {k: v for k, v in wanted.items() if k in known and v is not None}
    dropped = sorted(k for k, v in wanted.items() if k not in known and v is not None)
    return LLM(**args), {"engine_args": args, "not_in_this_release": dropped}


def _plugin_state() -> dict[str, Any]:
    """What the plugin decided in this process, and the dispatcher's active kernel."""
    try:
        from kvpatch.vllm_plugin import plugin

        t = plugin.default_target()
        active, inactive = plugin.active_kernel(f"{t.namespace}::paged_attention_v1", t.dispatch_key)
        decision = plugin.decide()
        reg = plugin.registration()
        count = getattr(reg.override.launcher, "grouped_launches", None) if reg is not None else None
        return {"registered": reg is not None, "action": decision.action, "line": decision.line(),
                "active": active, "inactive": inactive, "bundle": decision.bundle,
                # the grouped form's launches in this engine (CUDA graphs: the captures, not the replays)
                "grouped_launches": int(count()) if callable(count) else None}  # fmt: skip
    except Exception as e:  # noqa: BLE001 - recorded; the parent refuses the run
        return {"registered": None, "error": f"{type(e).__name__}: {e}"}


def _batch(engine: Any, params: Any, prompts: list[list[int]], tag: str) -> list[tuple[float, int, int]]:
    counts: dict[str, int] = {}
    for i, ids in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": ids}, params)
    steps = []
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t0
        new = first = 0
        for o in outs:
            n = len(o.outputs[0].token_ids) if o.outputs else 0
            prev = counts.get(o.request_id, 0)
            new += max(0, n - prev)
            first += prev == 0 and n > 0
            counts[o.request_id] = max(prev, n)
        steps.append((dt, new, first))
    return steps


def _prompts(rng: random.Random, batch: int, length: int, vocab: int) -> list[list[int]]:
    return [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(batch)]


def run(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams

    t0 = time.perf_counter()
    _say("starting the engine")
    llm, passed = _engine(spec)
    start_s = time.perf_counter() - t0
    _say(f"engine up in {start_s:.0f} s")
    engine = llm.llm_engine
    vocab = int(llm.llm_engine.model_config.get_vocab_size())
    result: dict[str, Any] = {"engine_start_s": start_s, "plugin": _plugin_state(), **passed, "workloads": []}
    for k, w in enumerate(spec["workloads"]):
        rng = random.Random(f"{spec['seed']}:{w['input_len']}:{w['output_len']}:{w['batch']}")
        warm = SamplingParams(max_tokens=spec["warmup_tokens"], ignore_eos=True, temperature=0.0, detokenize=False)
        _batch(engine, warm, _prompts(rng, w["batch"], w["input_len"], vocab), f"w{k}")
        params = SamplingParams(max_tokens=w["output_len"], ignore_eos=True, temperature=0.0, detokenize=False)
        steps = _batch(engine, params, _prompts(rng, w["batch"], w["input_len"], vocab), f"t{k}")
        stats = step_stats(steps, w["batch"], w["output_len"])
        result["workloads"].append({**w, **stats, "step_s": [round(s[0], 7) for s in steps]})
        _say(f"{w['input_len']}x{w['output_len']} B{w['batch']}: {stats.get('decode_ms', float('nan')):.2f} ms/step")
    result["plugin_after"] = _plugin_state()
    return result


def _environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import vllm

        env["vllm"] = getattr(vllm, "__version__", "")
    except Exception as e:  # noqa: BLE001
        env["vllm"] = f"unimportable: {e}"
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    env.update({k: os.environ.get(k, "") for k in ("VLLM_USE_V1", "VLLM_ATTENTION_BACKEND", "KVPATCH_DISABLE")})
    return env


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m kvpatch.serving.worker SPEC.json RESULT.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        spec = json.load(f)
    result = run(spec)
    result["environment"] = _environment()
    tmp = argv[1] + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(tmp, argv[1])
    _say("done")
    sys.stdout.flush()
    sys.stderr.flush()
    # vLLM's engine can hang in its own teardown (distributed state, worker threads); the
    # result is written, so leave without it.
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
