"""Serving with and without kvpatch's kernels: vLLM's own engine started again and again.

What ``kvpatch plugin bench`` runs, for a user who has vLLM (V0 engine, 0.6.4-0.10.x) and
the plugin enabled: engine processes started in alternation, kvpatch's kernels in one arm,
vLLM's own (``KVPATCH_DISABLE=1``) in two (the A/A pair), each engine timing vLLM's own
decode steps on token-id prompts.

* :mod:`.options`: workloads, arms and the run, checked before anything starts.
* :mod:`.schedule`: the order of engine starts.
* :mod:`.worker`: one engine process (imports vLLM; nothing else here does).
* :mod:`.engine`: running one, its log, and whether it counts.
* :mod:`.bench`: the run, kept in a folder and resumable; :mod:`.report`: the numbers.
"""

from .bench import run_bench
from .engine import Worker
from .options import ARMS, KVPATCH, VLLM, VLLM_TWIN, Arm, ServingOptions, Workload, make_workloads, parse_workload

__all__ = [
    "ARMS", "Arm", "KVPATCH", "ServingOptions", "VLLM", "VLLM_TWIN", "Worker", "Workload", "make_workloads",
    "parse_workload", "run_bench",
]  # fmt: skip
