"""One engine start, from the parent's side: the worker process, its log, and the checks
that make its numbers count.

The worker runs in its own process group with the arm's environment; everything it prints
goes to ``<slot>.log`` beside its raw result ``<slot>.json``. A run counts only when the
worker finished, every request generated its full output, and the plugin's own log line
(never the arm's name) says the arm's kernels ran, agreeing with what the worker saw in
its dispatcher. An interrupt, SIGTERM or a timeout stops the whole group.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..fsutil.files import write_atomic
from ..jit.library import kill_group
from ..progress import QUIET, Progress
from ..vllm_plugin import ENV_DISABLE, kernels_logged
from ..vllm_plugin.bundle import ENV_DIR
from .options import ServingOptions
from .schedule import Slot
from .worker import PROGRESS

#: The engine's environment: vLLM's V0 engine with the XFORMERS backend, the only path that
#: calls the paged-attention ops on CUDA; a host address so vLLM does not probe the network.
ENGINE_ENV = {"VLLM_USE_V1": "0", "VLLM_ATTENTION_BACKEND": "XFORMERS", "PYTHONUNBUFFERED": "1"}
ENGINE_ENV_DEFAULTS = {"VLLM_HOST_IP": "127.0.0.1"}


@dataclass(frozen=True)
class Worker:
    """How an engine process is started (tests start a stand-in engine the same way)."""

    python: str = sys.executable
    module: str = "kvpatch.serving.worker"
    extra_env: tuple[tuple[str, str], ...] = ()


def engine_env(slot: Slot, base: dict[str, str], worker: Worker) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k != ENV_DISABLE}
    for k, v in ENGINE_ENV_DEFAULTS.items():
        env.setdefault(k, v)
    env.update(ENGINE_ENV)
    env.update(dict(worker.extra_env))
    env.update(slot.arm.env)
    where = env.get(ENV_DIR)
    if where and not os.path.isabs(where):  # engines run in the --raw folder: the bundle this process means
        env[ENV_DIR] = os.path.abspath(where)
    return env


def problems(record: dict[str, Any]) -> list[str]:
    """Why a finished engine run does not count (empty: it does)."""
    out = []
    expected = record["arm"]["kernels"]
    logged = record.get("kernels_logged") or []
    if not logged:
        out.append("the plugin logged no decision (is kvpatch installed where vLLM runs?)")
    elif set(logged) != {expected}:
        out.append(f"the plugin's log says {'/'.join(sorted(set(logged)))} kernels ran, the arm needs {expected}'s")
    result = record.get("result") or {}
    plugin = result.get("plugin") or {}
    if plugin.get("registered") is not (expected == "kvpatch"):
        out.append(f"the engine process saw the override registered={plugin.get('registered')} "
                   f"({plugin.get('error') or plugin.get('line', '')})")  # fmt: skip
    bundle = record["arm"].get("bundle")
    if bundle is not None and not _same_folder(plugin.get("bundle"), bundle):
        out.append(f"the plugin loaded the bundle at {plugin.get('bundle')}, the arm needs {bundle}'s")
    for w in result.get("workloads", []):
        if w.get("tokens") != w.get("tokens_expected"):
            out.append(f"{w['input_len']}x{w['output_len']} B{w['batch']} generated {w.get('tokens')} tokens "
                       f"of {w.get('tokens_expected')}")  # fmt: skip
        if "decode_ms" not in w:
            out.append(f"{w['input_len']}x{w['output_len']} B{w['batch']} has no decode step to time")
    return out


def run_slot(slot: Slot, options: ServingOptions, folder: Path, *, worker: Worker = Worker(),
             progress: Progress = QUIET, clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:  # fmt: skip
    """Start one engine for ``slot``; its raw record (also written to ``folder/<slot>.json``
    when it counts). ``record['problems']`` lists why it does not."""
    spec_path, log_path, result_path = (folder / f"{slot.name}{ext}" for ext in (".spec.json", ".log", ".result.json"))
    write_atomic(spec_path, json.dumps(options.engine_spec(), indent=1) + "\n")
    result_path.unlink(missing_ok=True)
    env = engine_env(slot, dict(os.environ), worker)
    argv = [worker.python, "-m", worker.module, str(spec_path), str(result_path)]
    t0 = clock()
    with open(log_path, "w", encoding="utf-8", errors="replace") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                errors="replace", start_new_session=True, cwd=folder)  # fmt: skip
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=_pump, args=(proc, log, lines), daemon=True)
        reader.start()
        timed_out = False
        try:
            while True:
                try:
                    line = lines.get(timeout=0.5)
                except queue.Empty:
                    line = ""
                if line is None:
                    break
                if line.startswith(PROGRESS):
                    progress.say(f"{slot.name}: {line[len(PROGRESS) :].strip()}")
                if clock() - t0 > options.engine_timeout_s:
                    timed_out = True
                    break
        finally:
            if proc.poll() is None:
                kill_group(proc)
            proc.wait()
            reader.join(timeout=5)
    seconds = clock() - t0
    text = log_path.read_text(encoding="utf-8", errors="replace")
    record: dict[str, Any] = {
        "fingerprint": options.fingerprint(), "slot": slot.name, "round": slot.round, "index": slot.index,
        "arm": {"name": slot.arm.name, "kernels": slot.arm.kernels,
                **({"bundle": slot.arm.bundle} if slot.arm.bundle is not None else {})}, "seconds": seconds,
        "returncode": proc.returncode, "kernels_logged": kernels_logged(text), "result": None,
    }  # fmt: skip
    if timed_out:
        record["problems"] = [f"the engine ran past --engine-timeout ({options.engine_timeout_s:.0f} s)"]
    elif proc.returncode != 0 or not result_path.exists():
        record["problems"] = [f"the engine process failed (exit {proc.returncode}): {_last_error(text)}"]
    else:
        record["result"] = json.loads(result_path.read_text(encoding="utf-8"))
        record["problems"] = problems(record)
    if not record["problems"]:
        write_atomic(folder / f"{slot.name}.json", json.dumps(record) + "\n")
    result_path.unlink(missing_ok=True)
    return record


def _same_folder(a: Any, b: str) -> bool:
    try:
        return isinstance(a, str) and bool(a) and os.path.samefile(a, b)
    except OSError:
        return False


def _pump(proc: subprocess.Popen, log: Any, lines: queue.Queue) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        log.flush()
        lines.put(line)
    lines.put(None)


def _last_error(log: str) -> str:
    """The log's last line that looks like an error, else its last line."""
    rows = [r.strip() for r in log.splitlines() if r.strip()]
    for r in reversed(rows):
        if "Error" in r or "error:" in r:
            return r[:300]
    return rows[-1][:300] if rows else "no output"
