"""``kvpatch plugin bench``: vLLM serving with kvpatch's kernels against vLLM's own, in the
vLLM this environment has.

The data flow: options -> every check a user could fail (the options, the outputs, the
model, vLLM installed and V0-capable, the plugin enabled and passing its checks, a GPU)
before any engine starts -> the model (a directory, or a shipped shape written as a
``config.json`` with dummy weights) -> :func:`kvpatch.serving.run_bench` (engine starts in
alternation, each checked, kept in the raw folder) -> the report.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional, Sequence

from ..config.model import check_seconds
from ..errors import UsageError
from ..progress import QUIET, Progress

#: The most of a model directory's config.json read (a model's is a few kB).
CONFIG_LIMIT = 16 << 20


@dataclass
class ServingBenchOptions:
    model: str = "llama-3.1-8b"  # a shipped model shape, or a directory with config.json
    dtype: str = "bf16"
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8, 32, 64])
    input_len: int = 512
    output_len: int = 512
    workloads: list[str] = field(default_factory=list)  # extra rows, INPUT:OUTPUT:BATCHES
    bundles: list[str] = field(default_factory=list)  # more arms: NAME=DIR, another plugin bundle each
    starts: int = 4
    dummy_weights: bool = False  # a directory's own weights unless asked (a shape is always dummy)
    raw: Optional[Path] = None  # the folder of engine runs (None: a temporary one)
    budget_s: Optional[float] = None
    engine_timeout_s: float = 1200.0
    gpu_memory_utilization: float = 0.9
    max_model_len: Optional[int] = None  # the engine's context (None: 8192, the longest workload's if longer)
    json_path: Optional[str] = None
    cwd: Path = field(default_factory=Path.cwd)


def _model_source(o: ServingBenchOptions) -> tuple[Path | None, Any]:
    """(a model directory, None) or (None, a model shape): checked before anything starts."""
    from ..decode.models import MODELS
    from ..fsutil import expand_home

    if not o.model.strip():  # an unset shell variable: not the current directory
        raise UsageError(f"--model is empty: give a model directory or a model shape ({', '.join(MODELS)})")
    path = expand_home(o.model, f"--model {o.model}")
    path = path if path.is_absolute() else o.cwd / path
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"--model {o.model}: the directory has no config.json")
        return path.resolve(), None
    shape = MODELS.get(o.model.lower())
    if shape is None:
        raise UsageError(f"--model {o.model!r} is neither a directory nor a model shape kvpatch knows "
                         f"({', '.join(MODELS)})")  # fmt: skip
    return None, shape


def _context(o: ServingBenchOptions, workloads: Sequence[Any], path: Path | None, shape: Any) -> int | None:
    """The engine's context to give ServingOptions: ``--max-model-len``, checked against the
    model's positions (its ``max_position_embeddings``, which vLLM would refuse only after the
    engine had loaded); unset, the default, or the model's positions where the default exceeds
    them (a model of 4096 positions: 4096)."""
    from ..serving.options import default_context

    if shape is not None:
        limit = shape.max_position
    else:
        from ..fsutil.reading import parse_json, read_input

        text = read_input(path / "config.json", f"--model {o.model}: its config.json", limit=CONFIG_LIMIT)
        try:
            limit = parse_json(text).get("max_position_embeddings")
        except (ValueError, AttributeError):
            limit = None  # vLLM reads it and says what is wrong
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        return o.max_model_len
    longest = max(workloads, key=lambda w: w.tokens)
    if longest.tokens > limit:
        raise UsageError(f"workload {longest.label} needs {longest.tokens} tokens: the model has {limit} positions "
                         "(max_position_embeddings)")  # fmt: skip
    if o.max_model_len is not None and o.max_model_len > limit:
        raise UsageError(f"--max-model-len {o.max_model_len}: the model has {limit} positions "
                         "(max_position_embeddings)")  # fmt: skip
    if o.max_model_len is None and default_context(workloads) > limit:
        return limit
    return o.max_model_len


def _model(o: ServingBenchOptions, folder: Path, dtype_torch: str) -> tuple[str, str, bool, dict[str, Any]]:
    """(the model directory, its label, dummy weights?, provenance); a shape is written as its
    ``config.json`` into ``folder``."""
    from ..fsutil.files import write_if_different

    path, shape = _model_source(o)
    if path is not None:
        return str(path), path.name, o.dummy_weights, {"model_dir": str(path)}
    where = folder / f"model-{shape.name}-{dtype_torch}"
    where.mkdir(parents=True, exist_ok=True)
    write_if_different(where / "config.json", json.dumps(shape.hf_config(dtype_torch), indent=1) + "\n")
    return str(where), shape.name, True, {"model_shape": shape.name, "source": shape.source}


def _arms(o: ServingBenchOptions) -> tuple[Any, ...]:
    """kvpatch's arm, one arm per ``--bundle`` (checked: a free name, a readable bundle), then
    vLLM's two."""
    from ..serving.options import KVPATCH, MAX_BUNDLES, VLLM, VLLM_TWIN, bundle_arm

    if len(o.bundles) > MAX_BUNDLES:
        raise UsageError(f"--bundle given {len(o.bundles)} times: at most {MAX_BUNDLES} (each adds an engine start "
                         "a round)")  # fmt: skip
    others: list[Any] = []
    for text in o.bundles:
        others.append(bundle_arm(text, o.cwd, taken=[a.name for a in others]))
    return (KVPATCH, *others, VLLM, VLLM_TWIN)


def preflight() -> Any:
    """vLLM installed and V0-capable, the plugin enabled and every check of it passing: the
    plugin's :class:`~kvpatch.vllm_plugin.Decision`, or a one-line refusal."""
    from ..source.releases import release_tuple
    from .plugin import LAST_V0, installed_vllm, status

    version = installed_vllm()
    if version is None:
        raise UsageError(
            "'kvpatch plugin bench' starts vLLM's engine, and vLLM is not installed in this Python environment"
        )
    try:
        v0 = release_tuple(version)[:2] <= LAST_V0
    except ValueError:
        v0 = False
    if not v0:
        raise UsageError(f"vLLM {version} has no V0 engine, the only one that calls these kernels on CUDA "
                         "(releases 0.6.4 to 0.10.x)")  # fmt: skip
    decision = status()
    if not decision.registers:
        raise UsageError(f"the plugin would not run kvpatch's kernels here: {decision.reason}"
                         + (f"; {decision.fix}" if decision.fix else ""))  # fmt: skip
    return decision


def bench(o: ServingBenchOptions, *, progress: Progress = QUIET) -> dict[str, Any]:
    """Run the serving benchmark (see the module); the report."""
    from ..fsutil.outputs import check_output_folder, check_outputs
    from ..gpu.env import require_cuda
    from ..serving import ServingOptions, make_workloads, run_bench
    from ..serving.options import engine_dtype
    from .common import kept_paths

    dtype_torch = engine_dtype(o.dtype)
    workloads = make_workloads(o.input_len, o.output_len, o.batch_sizes, o.workloads)
    checked = ServingOptions(model="", model_label="", dtype=o.dtype, workloads=workloads, starts=o.starts,
                             gpu_memory_utilization=o.gpu_memory_utilization, engine_timeout_s=o.engine_timeout_s,
                             arms=_arms(o), context=_context(o, workloads, *_model_source(o)))  # fmt: skip
    if o.budget_s is not None:
        check_seconds(o.budget_s, "--budget")
    raw = o.raw if o.raw is None or o.raw.is_absolute() else o.cwd / o.raw
    if raw is not None and raw.exists() and not raw.is_dir():
        raise UsageError(f"--raw {raw}: not a directory")
    json_file = o.json_path if o.json_path not in (None, "-") else None
    bundles = {f"the --bundle {a.name} folder": a.bundle for a in checked.arms if a.bundle is not None}
    kept = {**kept_paths(o.cwd), **bundles}
    check_outputs(json=json_file, protected={**kept, "the --raw folder": raw})
    if raw is not None:  # its engine runs go where nothing kvpatch keeps lies
        check_output_folder("--raw", raw, protected=kept)
    preflight()
    require_cuda()
    temporary = raw is None
    folder = Path(tempfile.mkdtemp(prefix="kvpatch-serving-")) if raw is None else raw
    folder.mkdir(parents=True, exist_ok=True)
    model, label, dummy, provenance = _model(o, folder, dtype_torch)
    options = replace(checked, model=model, model_label=label, dummy_weights=dummy, extra=provenance)
    report = run_bench(options, folder, progress=progress, budget_s=o.budget_s)
    report["model_source"] = provenance
    if temporary and report["complete"]:
        shutil.rmtree(folder, ignore_errors=True)
        report["raw"] = None
    return report
