"""The bodies of ``kvpatch validate`` and ``bench`` (``tune``: :mod:`kvpatch.gpu.tune_command`):
options in, one report out.

Each command's options are a dataclass; :func:`run_validate_command` and
:func:`run_bench_command` (and ``run_tune_command``) do the work (build the
variants, or load prebuilt libraries given as ``NAME=path.so:prefix``; run; write the
JSON / plot) and return the report for the CLI to render. With libraries given,
nothing is built: they are loaded as given and ``stock`` (else the first) is the
baseline; their configurations come from ``variant_info`` (a JSON file beside them).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..errors import GpuCheckError, UsageError
from ..fsutil import check_outputs, write_atomic
from . import launch as L
from .defaults import DEFAULT_REPS, DEFAULT_ROUNDS, DEFAULT_WARMUP
from .report import STOCK_MARKER

MARKER_PREFIX = "// kvpatch:begin "


def marker_of(header: str) -> str:
    """The configuration a header was patched with (its first ``// kvpatch:begin`` line), or ``stock``."""
    for line in header.splitlines():
        s = line.strip()
        if s.startswith(MARKER_PREFIX):
            return s[len(MARKER_PREFIX):].split(" ", 1)[1] if " " in s[len(MARKER_PREFIX):] else ""
    return "stock"


def parse_heads(text: str) -> list[tuple[int, int]]:
    """``'32/8,8/1'`` -> ``[(32, 8), (8, 1)]``."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        q, sep, kv = part.partition("/")
        try:
            out.append((int(q), int(kv)))
        except ValueError:
            raise UsageError(f"invalid heads {part!r}: use QUERY/KV, e.g. 32/8") from None
        if not sep:
            raise UsageError(f"invalid heads {part!r}: use QUERY/KV, e.g. 32/8")
        q_heads, kv_heads = out[-1]
        if q_heads < 1 or kv_heads < 1 or q_heads % kv_heads:
            raise UsageError(f"invalid heads {part!r}: KV heads >= 1 and query heads a positive multiple of them")
    return out


def parse_bools(text: str) -> list[bool]:
    m = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}
    try:
        return [m[x.strip().lower()] for x in text.split(",") if x.strip()]
    except KeyError as e:
        raise UsageError(f"invalid on/off list {text!r}: {e}") from None


def load_variant_info(path: Optional[Path]) -> dict[str, Any]:
    """``{name: marker-or-dict}`` from a JSON file (``scripts/gpu_prepare.py`` writes ``variants.json``)."""
    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read --variant-info {path}: {e}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--variant-info {path}: expected a JSON object of name -> configuration")
    return {str(k): (v if isinstance(v, dict) else {"marker": v}) for k, v in data.items()}


@dataclass
class Libraries:
    """What a command runs on: loaded libraries and each one's provenance."""

    libs: dict[str, Any]
    info: dict[str, dict[str, Any]]
    specs: list[L.LibSpec]


def prebuilt(lib_specs: Sequence[str], variant_info: Optional[Path] = None,
             loader: Optional[Callable[[list[L.LibSpec]], dict[str, Any]]] = None) -> Libraries:  # fmt: skip
    """Libraries given on the command line, loaded as given (by ``loader``, default :func:`launch.load_libs`)."""
    specs = parse_libs(lib_specs)
    extra = load_variant_info(variant_info)
    info = {s.name: {**L.lib_info(s.path, s.prefix), **extra.get(s.name, {})} for s in specs}
    for name, i in info.items():
        i.setdefault("marker", STOCK_MARKER if name == "stock" else "unknown (no --variant-info)")
    try:
        libs = (loader or L.load_libs)(specs)
    except (RuntimeError, OSError) as e:
        raise UsageError(str(e)) from None
    return Libraries(libs, info, specs)


def built(result: Any, variants: Sequence[Any], spec: Any = None) -> Libraries:
    """Libraries of a :func:`kvpatch.build.build` result, with each variant's marker and compile flags."""
    flags: dict[str, Any] = {}
    if spec is not None:
        try:
            from .. import build as B

            flags = {p.variant.name: list(p.compile_flags) for p in B.plan(spec)}
        except Exception as e:  # noqa: BLE001 - provenance only; say why it is missing
            flags = {v.name: f"unavailable: {e}" for v in variants}
    markers = {v.name: marker_of(v.header) for v in variants}
    specs = [L.LibSpec(v.name, str(v.library), v.prefix) for v in result.variants]
    info = {s.name: {**L.lib_info(s.path, s.prefix), "marker": markers.get(s.name, "?"),
                     "compile_flags": flags.get(s.name)} for s in specs}  # fmt: skip
    return Libraries(L.load_libs(specs), info, specs)


def _build(tree: Optional[Path], cwd: Path, arch: str, variants: list, console: Any, **kernel_options: Any) -> Libraries:
    from .. import api
    from .. import build as B

    target = api.resolve_tree(tree, cwd)
    spec = B.make_spec(target.root, variants, arch, **kernel_options)
    result = B.build(spec, console=console)
    return built(result, variants, spec)


def parse_libs(lib_specs: Sequence[str]) -> list[L.LibSpec]:
    """``--lib`` values parsed (UsageError, one line): checked before the GPU is."""
    try:
        return L.parse_lib_specs(lib_specs)
    except ValueError as e:
        raise UsageError(str(e)) from None


def require_device(device: str) -> None:
    """A CUDA GPU when the command runs on ``cuda`` (the tests run on ``cpu``): checked
    before anything is built or loaded."""
    if str(device).startswith("cuda"):
        from .env import require_cuda

        require_cuda()


def write_if(path: Optional[Path], text: str) -> None:
    """Write ``text`` to ``path`` atomically; nothing when ``path`` is None."""
    if path is not None:
        write_atomic(path, text)


# --------------------------------------------------------------------------- validate


@dataclass
class LibraryOptions:
    """What validate, bench and tune share: the tree to build from (or prebuilt ``libs``,
    NAME=f.so:PREFIX, with their configurations in ``variant_info``), the working
    directory and the arch."""

    tree: Optional[Path] = None
    cwd: Path = field(default_factory=Path.cwd)
    arch: str = "9.0a"
    libs: list[str] = field(default_factory=list)
    variant_info: Optional[Path] = None


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
    report: Any = None  # ValidateReport, or None with --upstream only
    upstream: Any = None  # UpstreamReport

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
    from . import validate as V

    if o.quick and o.full:
        raise UsageError("give --quick or --full, not both")
    if o.full:
        heads, blocks = V.vllm_sizes(o.tree)
        cases, name, sampling = V.full_matrix(head_sizes=heads, block_sizes=blocks), "full", V.FULL_SAMPLING
    elif o.quick:
        cases, name, sampling = V.quick_matrix(), "quick", "fp16/bf16, head 128, block 16, GQA 8/2, contexts 17 and 1500"
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
            try:
                cases = V.validate_matrix(**kw)
            except ValueError as e:
                raise UsageError(str(e)) from None
            name, sampling = "custom", "the cross product of the given axes"
        else:  # quick / full: options filter it
            cases = [c for c in cases if all(v is None or getattr(c, k) in v for k, v in keep.items())
                     and (o.heads is None or (c.num_heads, c.num_kv_heads) in o.heads)]  # fmt: skip
            sampling += " (filtered by the given options)"
    if not cases:
        raise UsageError("the validate matrix is empty")
    return cases, name, sampling


def run_validate_command(o: ValidateOptions, *, console: Any = None, progress: Any = None) -> ValidateOutcome:
    """``kvpatch validate``: bit-identity over a matrix, and/or vLLM's own test (``upstream``)."""
    outcome = ValidateOutcome()
    if not o.matrix and not o.upstream:
        raise UsageError("--no-matrix leaves nothing to do without --upstream")
    if o.workers is not None and o.workers < 1:
        raise UsageError(f"--workers must be >= 1, not {o.workers}")
    upstream_shard(o)
    if o.upstream_timeout is not None:
        if not o.upstream:
            raise UsageError("--upstream-timeout needs --upstream")
        if not (o.upstream_timeout > 0 and math.isfinite(o.upstream_timeout)):
            raise UsageError(f"--upstream-timeout must be > 0 seconds, not {o.upstream_timeout:g}")
    cases, name, sampling = validate_cases(o)
    check_outputs(json=o.json_out)
    parse_libs(o.libs)
    require_device(o.device)
    if o.libs:
        libs = prebuilt(o.libs, o.variant_info)
    else:
        from .. import api  # the build side (git, libclang) only when building

        target = api.resolve_tree(o.tree, o.cwd)
        variants = api.variants_for(target, o.cwd, paper=o.paper)
        if o.upstream:  # vLLM's test needs its own sizes: build vLLM's full set
            libs = _build(o.tree, o.cwd, o.arch, variants, console, all_kernels=True)
        else:
            libs = _build(o.tree, o.cwd, o.arch, variants, console,
                          dtypes=sorted({c.dtype for c in cases}), head_sizes=sorted({c.head_size for c in cases}),
                          block_sizes=sorted({c.block_size for c in cases}),
                          kv_cache_dtypes=sorted({c.kv_cache_dtype for c in cases}))  # fmt: skip
    from . import validate as V
    from .env import collect_env

    env: dict[str, Any] = {"libs": libs.info}
    try:
        env.update(collect_env(o.device))
    except Exception as e:  # noqa: BLE001 - the environment is informational
        env["env_error"] = str(e)
    def each(i: int, n: int, r: Any) -> None:
        if progress is not None and (r.status == "fail" or i == n or i % 100 == 0):
            progress(f"[{i}/{n}] {r.status} {r.case.name}")

    if o.matrix:
        outcome.report = V.run_validate(libs.libs, cases, o.seed, device=o.device, progress=each, env=env,
                                        matrix_name=name, sampling=sampling, strict=o.full)  # fmt: skip
    if o.upstream:
        outcome.upstream = _upstream(o, libs, progress)
    if o.json_out is not None:
        from .report import dumps

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
    from .upstream import parse_shard

    try:
        return parse_shard(o.upstream_shard)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _upstream(o: ValidateOptions, libs: Libraries, progress: Any) -> Any:
    import tempfile

    from .upstream import UpstreamError, run_upstream

    if o.tree is not None:
        tree = Path(o.tree)
    else:
        from .. import api

        tree = api.resolve_tree(None, o.cwd).root
    out = o.upstream_dir or Path(tempfile.mkdtemp(prefix="kvpatch-upstream-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        limit = {} if o.upstream_timeout is None else {"timeout": o.upstream_timeout}
        return run_upstream(tree, libs.specs, out, release=tree.name, workers=o.workers, progress=progress,
                            shard=upstream_shard(o), **limit)  # fmt: skip
    except UpstreamError as e:
        raise GpuCheckError(str(e)) from None


# --------------------------------------------------------------------------- bench


@dataclass
class BenchOptions(LibraryOptions):
    variants: dict[str, Any] = field(default_factory=dict)  # extra NAME -> PatchConfig (when building)
    paper: bool = True
    control: bool = False
    point_set: Optional[str] = None
    quick: bool = False
    dtypes: Optional[list[str]] = None
    batches: Optional[list[int]] = None
    contexts: Optional[list[int]] = None
    heads: Optional[list[tuple[int, int]]] = None
    head_sizes: Optional[list[int]] = None
    block_sizes: Optional[list[int]] = None
    kv_cache_dtypes: Optional[list[str]] = None
    seed: Optional[int] = None
    kernels: list[str] = field(default_factory=lambda: ["v1", "v2"])
    reps: int = DEFAULT_REPS
    rounds: int = DEFAULT_ROUNDS
    warmup: int = DEFAULT_WARMUP
    warm: bool = True
    cold: bool = True
    check: bool = True
    aa: bool = False
    json_out: Optional[Path] = None
    plot: Optional[Path] = None
    device: str = "cuda"


def bench_points(o: BenchOptions) -> tuple[list, str]:
    """(points, set name) for the options: a named set (filtered by shape options), or
    the cross product of the shape options around the tuning shape; default: headline."""
    from . import points as P

    shape_given = any(v is not None for v in (o.dtypes, o.batches, o.contexts, o.heads, o.head_sizes,
                                              o.block_sizes, o.kv_cache_dtypes))  # fmt: skip
    try:
        if o.quick and o.point_set is None and not shape_given:
            pts, name = P.quick_points(), "quick"
        elif o.point_set is not None or not shape_given:
            name = o.point_set or "headline"
            pts = P.point_set(name, dtypes=o.dtypes or ("fp16", "bf16"))
            keep = {"batch": o.batches, "context": o.contexts, "head_size": o.head_sizes,
                    "block_size": o.block_sizes, "kv_cache_dtype": o.kv_cache_dtypes}  # fmt: skip
            pts = [p for p in pts if all(v is None or getattr(p, k) in v for k, v in keep.items())
                   and (o.heads is None or (p.num_heads, p.num_kv_heads) in o.heads)]  # fmt: skip
        else:
            name = "custom"
            pts = []
            for (qh, kvh) in o.heads or [P.HEADLINE_HEADS]:
                for hs in o.head_sizes or [P.HEADLINE_HEAD_SIZE]:
                    for bs in o.block_sizes or [P.HEADLINE_BLOCK_SIZE]:
                        for kv in o.kv_cache_dtypes or ["auto"]:
                            pts += P.make_points(dtypes=o.dtypes or ("fp16", "bf16"),
                                                 batches=o.batches or P.DEFAULT_BATCHES,
                                                 contexts=o.contexts or P.DEFAULT_CONTEXTS, num_heads=qh,
                                                 num_kv_heads=kvh, head_size=hs, block_size=bs, kv_cache_dtype=kv,
                                                 seed=o.seed or 0)  # fmt: skip
    except ValueError as e:
        raise UsageError(str(e)) from None
    if o.seed is not None and name != "custom":
        pts = [replace(p, seed=o.seed) for p in pts]
    if not pts:
        raise UsageError("no bench points: the options select none")
    return pts, name


def run_bench_command(o: BenchOptions, *, console: Any = None, progress: Any = None) -> Any:
    """``kvpatch bench``: returns the :class:`~kvpatch.gpu.report.BenchReport` (JSON/plot written)."""
    points, name = bench_points(o)
    from .bench import check_bench_options, run_bench

    try:
        check_bench_options(reps=o.reps, warmup=o.warmup, rounds=o.rounds, warm=o.warm, cold=o.cold,
                            kernels=o.kernels)  # fmt: skip
    except ValueError as e:
        raise UsageError(str(e)) from None
    check_outputs(json=o.json_out, plot=o.plot)
    parse_libs(o.libs)
    require_device(o.device)
    if o.libs:
        libs = prebuilt(o.libs, o.variant_info)
    else:
        from .. import api  # the build side (git, libclang) only when building

        target = api.resolve_tree(o.tree, o.cwd)
        variants = api.variants_for(target, o.cwd, paper=o.paper, control=o.control, extra=o.variants)
        libs = _build(o.tree, o.cwd, o.arch, variants, console,
                      dtypes=sorted({p.dtype for p in points}), head_sizes=sorted({p.head_size for p in points}),
                      block_sizes=sorted({p.block_size for p in points}),
                      kv_cache_dtypes=sorted({p.kv_cache_dtype for p in points}))  # fmt: skip
    try:
        report = run_bench(libs.libs, points, reps=o.reps, warmup=o.warmup, rounds=o.rounds, warm=o.warm,
                           cold=o.cold, kernels=o.kernels, device=o.device, variant_info=libs.info,
                           point_set_name=name, check_outputs=o.check, progress=progress, aa=o.aa)  # fmt: skip
    except ValueError as e:
        raise UsageError(str(e)) from None
    write_if(o.json_out, report.to_json())
    if o.plot is not None:
        from .plot import plot_bench

        plot_bench(report, o.plot)
    return report
