"""``kvpatch validate``: patched == stock bit for bit over a matrix of configurations (and
stock against a float64 reference), and/or vLLM's own kernel test, on the GPU.

The data flow: options -> the case matrix (:mod:`kvpatch.gpu.validate`) and every other
option checked -> the GPU checked -> the libraries (the tree's variants built for the
matrix's instantiations, vLLM's full set for ``--upstream``, or ``--lib`` as given) ->
each case's inputs, every library's output, compared -> the report (JSON if asked).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..config.model import check_seconds
from ..errors import GpuCheckError, UsageError
from ..fsutil import check_output_folder, check_outputs
from ..progress import QUIET, Progress
from .common import (
    Libraries,
    LibraryOptions,
    build_libraries,
    check_device,
    check_directory,
    check_kernel_sizes,
    check_sources,
    input_files,
    kept_paths,
    prebuilt,
    require_device,
    write_if,
)

if TYPE_CHECKING:
    from ..gpu.report import ValidateReport
    from ..gpu.upstream import UpstreamReport


@dataclass
class ValidateOptions(LibraryOptions):
    quick: bool = False
    full: bool = False
    paper: bool = False
    seed: int = 0
    dtypes: Optional[list[str]] = None
    kv_cache_dtypes: Optional[list[str]] = None
    head_sizes: Optional[list[int]] = None
    block_sizes: Optional[list[int]] = None
    kernels: Optional[list[str]] = None
    heads: Optional[list[tuple[int, int]]] = None
    alibi: Optional[list[bool]] = None
    contexts: Optional[list[int]] = None
    upstream: bool = False
    matrix: bool = True  # False: only --upstream
    upstream_dir: Optional[Path] = None
    upstream_shard: Optional[str] = None  # 'K/N': only that share of the test's cases
    upstream_timeout: Optional[float] = None  # seconds for the whole --upstream run (default: run_upstream's)
    workers: Optional[int] = None
    json_out: Optional[Path] = None
    device: str = "cuda"


@dataclass
class ValidateOutcome:
    report: Optional[ValidateReport] = None  # None with --upstream only
    upstream: Optional[UpstreamReport] = None

    @property
    def ok(self) -> bool:
        return (self.report is None or self.report.ok) and (self.upstream is None or self.upstream.ok)

    def why(self) -> str:
        """Why it failed, in one line (the command's error)."""
        r = self.report
        if r is None or r.ok:
            up = self.upstream
            cut = [run.name for run in up.runs if run.cut] if up is not None else []
            if cut and all(run.failed == 0 and run.errors == 0 for run in up.runs) and not any(up.differing.values()):
                return f"vLLM's own test stopped at the time limit before it finished ({', '.join(cut)}): not a pass"
            return "vLLM's own test failed or patched outputs differ from stock's (see the table)"
        if r.failures:
            return f"{len(r.failures)} mismatches; first: {r.failures[0]}"
        if r.strict and r.skipped:
            return f"{len(r.skipped)} configurations skipped (not built?); first: {r.skipped[0]}"
        return "nothing was validated: every configuration was skipped (not built?)"


def validate_cases(o: ValidateOptions) -> tuple[list, str, str]:
    """(cases, matrix name, sampling) for the options."""
    from ..gpu import validate as V

    if o.quick and o.full:
        raise UsageError("give --quick or --full, not both")
    if o.full:
        heads, blocks = V.vllm_sizes(o.tree)
        cases, name, sampling = V.full_matrix(head_sizes=heads, block_sizes=blocks), "full", V.FULL_SAMPLING
    elif o.quick:
        cases, name, sampling = (
            V.quick_matrix(),
            "quick",
            "fp16/bf16, head 128, block 16, GQA 8/2, contexts 17 and 1500",
        )
    else:
        cases, name, sampling = V.validate_matrix(), "default", "the full cross product of the default matrix"
    keep = {"dtype": o.dtypes, "kv_cache_dtype": o.kv_cache_dtypes, "head_size": o.head_sizes,
            "block_size": o.block_sizes, "kernel": o.kernels, "alibi": o.alibi, "context": o.contexts}  # fmt: skip
    if any(v is not None for v in (*keep.values(), o.heads)):
        if not (o.quick or o.full):  # the default matrix: options replace its axes
            kw = {k: v for k, v in (("dtypes", o.dtypes), ("kv_cache_dtypes", o.kv_cache_dtypes),
                                    ("head_sizes", o.head_sizes), ("block_sizes", o.block_sizes),
                                    ("kernels", o.kernels), ("heads", o.heads), ("alibi", o.alibi),
                                    ("contexts", o.contexts)) if v is not None}  # fmt: skip
            cases = V.validate_matrix(**kw)
            name, sampling = "custom", "the cross product of the given axes"
        else:  # quick / full: options filter it
            cases = [c for c in cases if all(v is None or getattr(c, k) in v for k, v in keep.items())
                     and (o.heads is None or (c.num_heads, c.num_kv_heads) in o.heads)]  # fmt: skip
            sampling += " (filtered by the given options)"
    if not cases:
        raise UsageError("the validate matrix is empty")
    return cases, name, sampling


def run(o: ValidateOptions, *, progress: Progress = QUIET) -> ValidateOutcome:
    """``kvpatch validate``: bit-identity over a matrix, and/or vLLM's own test (``upstream``)."""
    outcome = ValidateOutcome()
    check_device(o.device)
    check_kernel_sizes(o.head_sizes, o.block_sizes)
    for flag, value in (("--upstream-dir", o.upstream_dir), ("--workers", o.workers)):
        if value is not None and not o.upstream:
            raise UsageError(f"{flag} needs --upstream")
    if o.upstream_dir is not None:
        check_directory("--upstream-dir", o.upstream_dir)
    if o.paper and o.libs:
        raise UsageError("--paper builds the paper preset from the tree; --lib runs prebuilt libraries: give its "
                         "library as one more --lib")  # fmt: skip
    if not o.matrix and not o.upstream:
        raise UsageError("--no-matrix leaves nothing to do without --upstream")
    if o.workers is not None and o.workers < 1:
        raise UsageError(f"--workers must be >= 1, not {o.workers}")
    upstream_shard(o)
    if o.upstream_timeout is not None:
        if not o.upstream:
            raise UsageError("--upstream-timeout needs --upstream")
        check_seconds(o.upstream_timeout, "--upstream-timeout")
    cases, name, sampling = validate_cases(o)
    check_outputs(json=o.json_out, inputs=input_files(o),
                  protected={**kept_paths(o.cwd, o.tree), "the --upstream-dir folder": o.upstream_dir})  # fmt: skip
    if o.upstream_dir is not None:
        check_output_folder("--upstream-dir", o.upstream_dir, protected=kept_paths(o.cwd, o.tree))
    check_sources(o, tree_read=o.upstream or o.full)  # both read vLLM's files in the tree
    from .tree import resolve_source

    # the tree: to build from, and vLLM's own test's (even with --lib), before the GPU is looked for
    target = resolve_source(o.tree, o.cwd) if o.upstream or not o.libs else None
    require_device(o.device)
    if o.libs:
        libs = prebuilt(o.libs, o.variant_info)
    else:
        from .tree import variants_for  # the build side (git, libclang) only when building

        variants = variants_for(target, o.cwd, progress, paper=o.paper)
        if o.upstream:  # vLLM's test needs its own sizes: build vLLM's full set
            libs = build_libraries(o.tree, o.cwd, o.build_arch, variants, progress, all_kernels=True)
        else:
            libs = build_libraries(o.tree, o.cwd, o.build_arch, variants, progress,
                                   dtypes=sorted({c.dtype for c in cases}), head_sizes=sorted({c.head_size for c in cases}),
                                   block_sizes=sorted({c.block_size for c in cases}),
                                   kv_cache_dtypes=sorted({c.kv_cache_dtype for c in cases}))  # fmt: skip
    from ..gpu import validate as V
    from ..gpu.env import collect_env

    env: dict[str, Any] = {"libs": libs.info}
    try:
        env.update(collect_env(o.device))
    except Exception as e:  # noqa: BLE001 - the environment is informational
        env["env_error"] = str(e)

    def each(i: int, n: int, r: Any) -> None:
        if r.status == "fail" or i == n or i % 100 == 0:
            progress.say(f"[{i}/{n}] {r.status} {r.case.name}")

    if o.matrix:
        outcome.report = V.run_validate(libs.libs, cases, o.seed, device=o.device, progress=each, env=env,
                                        matrix_name=name, sampling=sampling, strict=o.full)  # fmt: skip
    if o.upstream:
        outcome.upstream = _upstream(o, target.root, libs, progress)
    if o.json_out is not None:
        from ..gpu.report import dumps

        d = outcome.report.to_dict() if outcome.report is not None else {"kind": "kvpatch-validate", "env": env}
        if outcome.upstream is not None:
            d["upstream"] = outcome.upstream.to_dict()
        write_if(o.json_out, dumps(d))
    return outcome


def upstream_shard(o: ValidateOptions) -> Optional[tuple[int, int]]:
    """``--upstream-shard K/N`` as (K, N); None without it. UsageError when malformed or without --upstream."""
    if o.upstream_shard is None:
        return None
    if not o.upstream:
        raise UsageError("--upstream-shard needs --upstream")
    from ..gpu.upstream import parse_shard

    return parse_shard(o.upstream_shard)


def _upstream(o: ValidateOptions, tree: Path, libs: Libraries, progress: Progress) -> Any:
    import tempfile

    from ..gpu.upstream import UpstreamError, run_upstream

    out = o.upstream_dir or Path(tempfile.mkdtemp(prefix="kvpatch-upstream-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        limit = {} if o.upstream_timeout is None else {"timeout": o.upstream_timeout}
        return run_upstream(tree, libs.specs, out, release=tree.name, workers=o.workers, progress=progress.say,
                            shard=upstream_shard(o), **limit)  # fmt: skip
    except UpstreamError as e:
        raise GpuCheckError(str(e)) from None
