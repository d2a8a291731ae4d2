"""The GPU side of ``kvpatch tune``: validate every candidate, bench them on the tuning set, choose."""

from __future__ import annotations

from typing import Any, Iterable

from ..config import PatchConfig
from .choose import Score, choose, combine, score, validation_failures
from .grid import POLICIES, tuned_instantiations
from .report import TuneReport


def tune_validate_matrix(instantiations: Iterable[tuple[str, int, int]]) -> list:
    """Each tuned (dtype, head, block): v1 and v2, a short context (17) and one over three v2
    partitions (1500), auto cache; without ALiBi GQA 8/2 and MHA 4/4 with 3 sequences, with
    ALiBi (random slopes) GQA 32/8 and MHA 16/16 with 8 (:data:`kvpatch.gpu.validate.ALIBI_HEADS`)."""
    from ..gpu import validate as V

    out = []
    for dtype, head, block in sorted(set(instantiations)):
        one = dict(
            dtypes=(dtype,), kv_cache_dtypes=("auto",), head_sizes=(head,), block_sizes=(block,), contexts=(17, 1500)
        )
        out += V.validate_matrix(**one, alibi=(False,))
        out += V.validate_matrix(**one, alibi=(True,), heads=V.ALIBI_HEADS, num_seqs=V.ALIBI_NUM_SEQS)
    return out


def run_tune(libs: dict, configs: dict[str, PatchConfig], *, quick: bool, reps: int, rounds: int,
             policy: str = "strict", fallback: str = "off", progress=None, variant_info: dict | None = None,
             machine: Any = None, dtypes: Iterable[str] = (), only: Iterable[str] = (),
             incumbent: str | None = None) -> TuneReport:  # fmt: skip
    """Validate, bench on the tuning set and choose, on a GPU; ``libs`` holds 'stock' and
    one library per candidate (``quick``: batch 2/32 x context 512/12288 of the tuning set;
    ``dtypes``, ``only``: only the points of :func:`tuned_instantiations`; ``incumbent``: see :func:`choose`)."""
    from ..gpu import bench as Bn
    from ..gpu import points as P
    from ..gpu import validate as V

    points = P.point_set("tuning")
    if quick:
        points = [p for p in points if p.batch in (2, 32) and p.context in (512, 12288)]
    dtypes, only = list(dtypes), list(only)
    if dtypes or only:
        wanted = set(tuned_instantiations(dtypes, only))
        points = [p for p in points if (p.dtype, p.head_size, p.block_size) in wanted]
    matrix = tune_validate_matrix((p.dtype, p.head_size, p.block_size) for p in points)
    failures = validation_failures(V.run_validate(libs, matrix, seed=0))
    bench = Bn.run_bench(libs, points, reps=reps, rounds=rounds, kernels=("dispatched",), variant_info=variant_info,
                         point_set_name="tuning", progress=progress)  # fmt: skip
    data = bench.to_dict()
    return report_of(score(data, failures), configs, failures, data, policy=policy, fallback=fallback, machine=machine,
                     incumbent=incumbent)  # fmt: skip


def report_of(scores: list[Score], configs: dict[str, PatchConfig], failures: dict[str, set[str]], bench: dict, *,
            policy: str, fallback: str, machine: Any, exclusions: dict[str, set[str]] | None = None,
            incumbent: str | None = None) -> TuneReport:  # fmt: skip
    """Choose under ``policy`` (against ``incumbent``, if named), combine, and note what each other
    policy would have written."""
    picks = choose(scores, policy, incumbent)
    config = combine(picks, configs, fallback=fallback)
    alternatives = {p: combine(choose(scores, p, incumbent), configs, fallback=fallback).marker()
                    for p in POLICIES if p != policy}  # fmt: skip
    return TuneReport(config, picks, policy, failures, machine, alternatives, bench, exclusions=exclusions or {},
                      incumbent=incumbent)  # fmt: skip
