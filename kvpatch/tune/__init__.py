"""``kvpatch tune``: sweep the template's settings on a GPU and keep the best per kernel.

Settings are chosen per *kernel*: one of the two kernels (v1, v2) of one instantiation
(query dtype, head size, block size, auto cache) of vLLM's template, named by its rule
selector (``fp16/128/16/auto/v2``); the two kernels of an instantiation compile from the
same loop but schedule it differently, and measure differently. The pieces, pure except
:func:`run_tune`:

* :func:`candidates` is the grid: every combination of ``issue``, ``scope`` and
  ``lookahead``, each a uniform configuration without rules (cache hint, size, align
  and placement stay the base's, so every kernel that calls the helper shares it).
* :func:`validation_failures` maps a validate report to, per candidate, the
  kernels where it was not bit-identical to stock.
* :func:`score` reduces a bench report to one :class:`Score` per candidate and
  kernel: the speedups over stock at the tuning points where vLLM dispatches that
  kernel (warm and cold), each point's verdict against its interval, and the
  geomean with its interval over rounds.
* :func:`choose` picks per kernel. A candidate *qualifies* when it is
  bit-identical there, its geomean interval lies above 1.00 and (policy ``strict``,
  the default) no point is slower than stock beyond noise -- where it ran its own code: a
  point where it ran stock's (the kernel off, its grouped form not taken) times stock
  against itself, the noise floor, and is counted apart --; the qualifying one with
  the best geomean wins, else the kernel is ``off`` (compiled as stock).
  Policy ``geomean`` drops the per-point condition. With an *incumbent* (a candidate, e.g.
  the configuration in use), a kernel where it qualifies keeps it unless a qualifying
  candidate beats it (:func:`versus`): at no tuning point slower than the incumbent
  beyond the rounds' spread, and faster in geomean (interval above 1.00).
* :func:`combine` writes the picks as one configuration: the base settings, a rule
  per tuned instantiation (or one per kernel where v1 and v2 differ), and ``off``
  for every instantiation it did not measure (the ``fallback``), since nothing says
  the prefetch helps there.

:func:`run_tune` validates every candidate (bit-identical to stock on each tuned
instantiation, ALiBi on and off, GQA and MHA, both kernels), benches them side by
side on the ``tuning`` point set (never the headline or held-out sets), and returns
a :class:`TuneReport` whose configuration ``kvpatch apply --config`` takes once
written with :func:`kvpatch.config.dump_config`, with the machine it was tuned on.

The modules: :mod:`.grid` (the candidates), :mod:`.choose` (score, choose, combine),
:mod:`.report` (:class:`TuneReport`), :mod:`.saved` (choosing again from saved
measurements, no GPU) and :mod:`.run` (the GPU run).
"""

from .choose import Pick, Score, Versus, choose, combine, score, validation_failures, versus
from .grid import (
    FALLBACKS,
    GRID,
    GRID_KEYS,
    POLICIES,
    candidate_configs,
    candidate_name,
    candidates,
    parse_grid,
    parse_grids,
    tuned_instantiations,
)  # fmt: skip
from .report import TuneReport
from .run import run_tune, tune_validate_matrix
from .saved import merge_tune_data, parse_exclusions, rechoose, saved_machine

__all__ = [
    "FALLBACKS", "GRID", "GRID_KEYS", "POLICIES", "Pick", "Score", "TuneReport", "candidate_configs",
    "candidate_name", "candidates", "choose", "combine", "merge_tune_data", "parse_exclusions", "parse_grid",
    "parse_grids", "rechoose", "run_tune", "saved_machine", "score", "tune_validate_matrix", "tuned_instantiations",
    "validation_failures", "Versus", "versus",
]  # fmt: skip
