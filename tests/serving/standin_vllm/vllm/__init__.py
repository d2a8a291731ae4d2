"""A stand-in for vLLM's engine, for the serving tests only (no vLLM, no GPU here).

``LLM(...)`` does what vLLM's plugin loader does for kvpatch: it calls kvpatch's real
``register()``, on a stand-in op namespace with a stand-in bundle (``tests/vllm_plugin/
standin.py``), so the real decision and the real log line come out, and ``KVPATCH_DISABLE``
works as in vLLM. Its engine has V0's ``add_request``/``step``/``has_unfinished_requests``:
a first step prefills every request (one token each), then each step adds one token to every
running request and sleeps ``STANDIN_STEP_MS`` (``STANDIN_STEP_MS_KVPATCH`` while kvpatch's
kernels are registered). With ``KVPATCH_PLUGIN_DIR`` set the plugin loads the bundle there (a
stand-in bundle the test wrote), and a ``standin-step-ms`` file in it sets its step time. ``STANDIN_FAIL``: 'crash' raises at start, 'short' stops a request
early, 'hang' sleeps forever; ``STANDIN_STARTS`` names a file each start appends a line to.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__version__ = "0.10.2"


@dataclass
class SamplingParams:
    max_tokens: int = 16
    ignore_eos: bool = False
    temperature: float = 1.0
    detokenize: bool = True


@dataclass
class _Completion:
    token_ids: list = field(default_factory=list)


@dataclass
class RequestOutput:
    request_id: str
    outputs: list
    finished: bool


class _ModelConfig:
    def get_vocab_size(self) -> int:
        return 32000


class _Engine:
    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.model_config = _ModelConfig()
        self.waiting: dict[str, int] = {}
        self.running: dict[str, list] = {}

    def add_request(self, request_id, prompt, params) -> None:
        assert len(prompt["prompt_token_ids"]) > 0 and params.ignore_eos and not params.detokenize
        self.waiting[request_id] = params.max_tokens

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> list:
        short = os.environ.get("STANDIN_FAIL") == "short"
        outs = []
        if self.waiting:
            for rid, n in self.waiting.items():
                self.running[rid] = [n, [1]]
            self.waiting = {}
            time.sleep(self.step_s * 3)
        else:
            time.sleep(self.step_s)
            for v in self.running.values():
                v[1].append(1)
        for rid, (n, toks) in list(self.running.items()):
            done = len(toks) >= (n // 2 if short else n)
            outs.append(RequestOutput(rid, [_Completion(list(toks))], done))
            if done:
                del self.running[rid]
        return outs


class LLM:
    def __init__(self, **kwargs) -> None:
        import standin  # tests/vllm_plugin/standin.py

        from kvpatch.vllm_plugin import plugin

        if os.environ.get("STANDIN_FAIL") == "crash":
            raise RuntimeError("stand-in engine failed to start")
        if os.environ.get("STANDIN_STARTS"):
            with open(os.environ["STANDIN_STARTS"], "a") as f:
                f.write(
                    f"{os.environ.get('KVPATCH_DISABLE', '')}|{os.environ.get('VLLM_USE_V1')}|"
                    f"{os.environ.get('VLLM_ATTENTION_BACKEND')}|{kwargs['cuda_graph_sizes']}|{os.getpid()}\n"
                )
        if os.environ.get("STANDIN_FAIL") == "hang":
            time.sleep(3600)
        self.kwargs = kwargs
        ns = standin.unique_namespace()
        self._lib = standin.define_ops(ns, standin.TENSOR_SCALES)
        where = os.environ.get("KVPATCH_PLUGIN_DIR")
        bundle = Path(where) if where else standin.make_bundle(Path(tempfile.mkdtemp()) / "bundle")
        plugin.set_default_target(standin.make_target(ns, bundle, standin.FakeLauncher(standin.SMALL_SET.labels())))
        plugin.register()  # what vLLM's load_general_plugins() does with kvpatch's entry point
        ours = plugin.registration() is not None
        ms = float(os.environ.get("STANDIN_STEP_MS_KVPATCH" if ours else "STANDIN_STEP_MS", "2"))
        if ours and where and (bundle / "standin-step-ms").is_file():
            ms = float((bundle / "standin-step-ms").read_text())
        self.llm_engine = _Engine(ms / 1e3)
