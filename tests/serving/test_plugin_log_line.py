"""Which kernels an engine ran is read from the plugin's own log line (one writer, one reader:
:meth:`Decision.line` and :func:`kernels_logged`)."""

from __future__ import annotations

from kvpatch.vllm_plugin import Decision, kernels_logged


def test_each_decision_line_reads_back_as_the_kernels_it_leaves_running():
    ran = Decision("register", "", release="0.10.2", marker="m", archs=("sm_90a",), registered=True)
    would = Decision("register", "", release="0.10.2", marker="m", archs=("sm_90a",), registered=False)
    off = Decision("off", "KVPATCH_DISABLE=1 is set")
    refused = Decision("refuse", "vLLM 0.9.2 is installed, the bundle is for 0.10.2", "run 'kvpatch plugin enable'")
    log = "\n".join([
        "INFO 12-03 10:00:00 [__init__.py:36] Available plugins for group vllm.general_plugins:",
        f"INFO 12-03 10:00:00 [kvpatch] {ran.line()}",
        f"WARNING 12-03 10:00:01 [kvpatch] {refused.line()}",
        f"INFO 12-03 10:00:01 [kvpatch] {off.line()}",
        would.line(),  # what 'kvpatch plugin status' prints: not a registration
        "kvpatch: something else",
    ])  # fmt: skip
    assert kernels_logged(log) == ["kvpatch", "vllm", "vllm"]
    assert (ran.kernels(), would.kernels(), off.kernels(), refused.kernels()) == ("kvpatch", "vllm", "vllm", "vllm")
    assert kernels_logged("no plugin here") == []
