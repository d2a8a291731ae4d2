"""What a serving benchmark runs, as data, checked before any engine starts.

A :class:`Workload` is one timed batch: ``batch`` requests of ``input_len`` prompt tokens,
each generating exactly ``output_len`` tokens. An :class:`Arm` is one way of starting the
engine: kvpatch's kernels, or vLLM's own (``KVPATCH_DISABLE=1``), the latter twice so that
two arms with identical code give the A/A reading; :func:`bundle_arm` adds one with another
plugin bundle's kernels. :class:`ServingOptions` is the whole run;
its :meth:`~ServingOptions.fingerprint` says whether saved engine runs belong to it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .. import dtypes as D
from ..config.model import ascii_digits, check_seconds
from ..errors import UsageError
from ..gpu.points import MAX_BATCH

#: Bounds a workload must stay within (a typo, not a wish, is what they catch); a batch's is the
#: kernel bench's.
MAX_TOKENS = 1 << 17
MAX_STARTS = 50
#: vLLM's default ``max_seq_len_to_capture``: its V0 engine captures decode graphs for sequences up
#: to this many tokens (or the engine's context, if shorter) and sizes every captured attention
#: launch for that many, whatever the batch's real lengths.
CAPTURE_LEN = 8192


@dataclass(frozen=True, order=True)
class Workload:
    input_len: int
    output_len: int
    batch: int

    @property
    def label(self) -> str:
        """``'512x512 B64'``: how tables and JSON name it."""
        return f"{self.input_len}x{self.output_len} B{self.batch}"

    @property
    def tokens(self) -> int:
        """The longest sequence the workload makes (prompt + generated)."""
        return self.input_len + self.output_len


def parse_workload(text: str) -> list[Workload]:
    """``'4096:256:8,32'`` (input:output:batches) -> one Workload per batch size."""
    parts = text.split(":")
    if len(parts) != 3:
        raise UsageError(f"workload {text!r}: write INPUT:OUTPUT:BATCHES, e.g. 4096:256:8,32")
    i, o = _int(parts[0], "input length", MAX_TOKENS), _int(parts[1], "output length", MAX_TOKENS)
    batches = [_int(b, "batch size", MAX_BATCH) for b in parts[2].split(",") if b.strip()]
    if not batches:
        raise UsageError(f"workload {text!r} names no batch size")
    return [Workload(i, o, b) for b in batches]


def make_workloads(input_len: int, output_len: int, batches: list[int], extra: list[str]) -> tuple[Workload, ...]:
    """The main rows (every batch size at ``input_len``/``output_len``) and the extra ones, in
    that order, each once."""
    rows = [Workload(_bound(input_len, "--input-len", MAX_TOKENS), _bound(output_len, "--output-len", MAX_TOKENS),
                     _bound(b, "--batch-sizes", MAX_BATCH)) for b in batches]  # fmt: skip
    for text in extra:
        rows.extend(parse_workload(text))
    if not rows:
        raise UsageError("no workload: give --batch-sizes (and --input-len/--output-len) or --workload")
    out: list[Workload] = []
    for w in rows:
        if w not in out:
            out.append(w)
    return tuple(out)


def _int(text: str, what: str, top: int) -> int:
    t = text.strip()
    if not ascii_digits(t) or len(t) > 9:
        raise UsageError(f"{what} {text!r} is not a whole number between 1 and {top}")
    return _bound(int(t), what, top)


def _bound(value: int, what: str, top: int) -> int:
    if not 1 <= value <= top:
        raise UsageError(f"{what} {value} is out of range: 1 to {top}")
    return value


@dataclass(frozen=True)
class Arm:
    """One engine set-up. ``kernels`` is what the plugin must say it ran: 'kvpatch' or 'vllm'.
    ``bundle``: another plugin bundle's folder, which this arm's engines load instead of the
    one the environment enables (:func:`bundle_arm`); ``bundle_id`` names its kernels."""

    name: str
    kernels: str
    bundle: str | None = None
    bundle_id: str = ""

    @property
    def env(self) -> dict[str, str]:
        """What the engine's environment adds: the plugin's kill switch for vLLM's arms, the
        bundle's folder for an arm of another bundle."""
        from ..vllm_plugin import ENV_DISABLE
        from ..vllm_plugin.bundle import ENV_DIR

        if self.kernels == "vllm":
            return {ENV_DISABLE: "1"}
        return {ENV_DIR: self.bundle} if self.bundle is not None else {}

    def identity(self) -> dict[str, str]:
        """What the fingerprint hashes: an arm of another bundle by its kernels, not its path."""
        out = {"name": self.name, "kernels": self.kernels}
        if self.bundle is not None:
            out["bundle"] = self.bundle_id
        return out


KVPATCH = Arm("kvpatch", "kvpatch")
VLLM = Arm("vllm", "vllm")
#: vLLM's kernels again: the A/A twin of :data:`VLLM`.
VLLM_TWIN = Arm("vllm-twin", "vllm")
ARMS = (KVPATCH, VLLM, VLLM_TWIN)
#: How many other bundles one run may time beside the enabled one (each adds an engine start a round).
MAX_BUNDLES = 3


def bundle_arm(text: str, cwd: Path, taken: Sequence[str] = ()) -> Arm:
    """``'grouped=./bundle-g4'`` (``--bundle NAME=DIR``) -> the arm that runs that bundle's
    kernels; UsageError in one line for a bad name, a name in ``taken``, or no readable bundle."""
    from ..fsutil import expand_home
    from ..vllm_plugin.bundle import BundleError, read_bundle

    name, sep, folder = text.partition("=")
    name = name.strip()
    if not sep or not folder.strip():
        raise UsageError(f"--bundle {text!r}: write NAME=DIR, e.g. grouped=./bundle-g4")
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,31}", name):
        raise UsageError(f"--bundle {text!r}: a name of lower-case letters, digits and '-' (at most 32)")
    if name in {a.name for a in ARMS} or name in taken:
        raise UsageError(f"--bundle {text!r}: the name {name!r} is taken")
    path = expand_home(folder.strip(), f"--bundle {text}")
    path = (path if path.is_absolute() else cwd / path).resolve()
    try:
        manifest = read_bundle(path, missing_ok=False)
    except BundleError as e:
        raise UsageError(f"--bundle {name}: {e}") from None
    assert manifest is not None
    digest = hashlib.sha256(f"{manifest.library_sha256}\n{manifest.marker}".encode()).hexdigest()[:16]
    return Arm(name, "kvpatch", bundle=str(path), bundle_id=digest)


def default_context(workloads: Sequence[Workload]) -> int:
    """The engine's context unless given: the longest workload's, rounded up to 256 tokens, and at
    least :data:`CAPTURE_LEN`."""
    longest = max(w.tokens for w in workloads)
    return max(-(-longest // 256) * 256, CAPTURE_LEN)


def engine_dtype(name: str) -> str:
    """kvpatch's dtype name (fp16, bf16) -> the torch name vLLM takes (float16, bfloat16)."""
    d = D.QUERY_DTYPES.get(name)
    if d is None or name == "fp32":
        raise UsageError(f"dtype {name!r}: choose fp16 or bf16")
    return d.torch


@dataclass(frozen=True)
class ServingOptions:
    """One serving benchmark. ``model`` is a directory holding the model's ``config.json``
    (and its weights unless ``dummy_weights``)."""

    model: str
    model_label: str
    dtype: str  # kvpatch's name: fp16 | bf16
    workloads: tuple[Workload, ...]
    starts: int = 4
    dummy_weights: bool = True
    seed: int = 0
    gpu_memory_utilization: float = 0.9
    engine_timeout_s: float = 1200.0
    warmup_tokens: int = 8
    arms: tuple[Arm, ...] = ARMS
    extra: dict[str, Any] = field(default_factory=dict)  # provenance only
    context: int | None = None  # --max-model-len (None: default_context)

    def __post_init__(self) -> None:
        engine_dtype(self.dtype)
        _bound(self.starts, "--starts", MAX_STARTS)
        if self.workloads and self.context is not None:
            _bound(self.context, "--max-model-len", MAX_TOKENS)
            longest = max(self.workloads, key=lambda w: w.tokens)
            if self.context < longest.tokens:
                raise UsageError(f"--max-model-len {self.context} is shorter than workload {longest.label} "
                                 f"({longest.tokens} tokens)")  # fmt: skip
        if not 0.1 <= self.gpu_memory_utilization <= 0.98:
            raise UsageError(f"--gpu-memory-utilization {self.gpu_memory_utilization}: choose 0.1 to 0.98")
        check_seconds(self.engine_timeout_s, "--engine-timeout")
        if not self.workloads:
            raise UsageError("no workload to run")

    @property
    def max_model_len(self) -> int:
        """The engine's context: ``--max-model-len``, else the longest workload's rounded up to 256
        tokens and at least :data:`CAPTURE_LEN`, so that the engine captures its decode graphs as
        it does for any model served with a context of 8192 or more (the paper's workload ran
        Llama-3.1-8B at vLLM's default context, 131072)."""
        return self.context if self.context is not None else default_context(self.workloads)

    @property
    def capture_len(self) -> int:
        """The longest sequence the engine's CUDA graphs serve, vLLM's default for this context:
        every captured v1/v2 launch is sized for it (shared memory, partitions)."""
        return min(self.max_model_len, CAPTURE_LEN)

    @property
    def capture_sizes(self) -> list[int]:
        """The batch sizes to capture CUDA graphs for: the workloads' (``cuda_graph_sizes``; vLLM
        0.10's V0 engine captures its own list up to ``max_num_seqs`` instead: 1, 2, 4 and the
        multiples of 8, so a batch size off that list is padded up to the next one there)."""
        return sorted({w.batch for w in self.workloads})

    def engine_spec(self) -> dict[str, Any]:
        """What an engine process needs (:mod:`kvpatch.serving.worker` reads it). The capture
        length is named only where it is shorter than the context: an engine that captures its
        whole context has the spec (and the fingerprint) it always had."""
        spec = {
            "model": self.model, "dtype": engine_dtype(self.dtype), "dummy_weights": self.dummy_weights,
            "seed": self.seed, "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_model_len": self.max_model_len, "capture_sizes": self.capture_sizes,
            "warmup_tokens": self.warmup_tokens, "workloads": [asdict(w) for w in self.workloads],
        }  # fmt: skip
        if self.capture_len != self.max_model_len:
            spec["max_seq_len_to_capture"] = self.capture_len
        return spec

    def fingerprint(self, model: str | None = None) -> str:
        """What makes two engine runs comparable: the spec and the arms (not the start count).
        A shipped shape counts by its name, not by where its ``config.json`` was written, so a
        ``--raw`` folder moved or renamed still resumes; ``model`` hashes that path instead (what
        a kvpatch before this hashed: :func:`kvpatch.serving.bench.fingerprints` still accepts it)."""
        identity = model if model is not None else self.extra.get("model_shape") or self.model
        data = {"spec": {**self.engine_spec(), "model": identity}, "arms": [a.identity() for a in self.arms]}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
