"""The grid of candidate configurations ``kvpatch tune`` builds, and what it tunes."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Iterable, Sequence

from ..config import PatchConfig, Selector, config_from_marker, make_config
from ..config.model import SETTINGS
from ..config.settings import as_text
from ..errors import UsageError
from ..gpu import points as P

#: The settings tune may vary, from the table (each setting's ``tune``), in their order.
TUNED = tuple(sorted((s for s in SETTINGS if s.tune is not None), key=lambda s: s.tune.rank))
#: The default grid: (setting, values), of the tuned settings that name default values: issue x
#: scope x lookahead, 12 candidates.
GRID: tuple[tuple[str, tuple[Any, ...]], ...] = tuple((s.name, s.tune.values) for s in TUNED if s.tune.values)
#: Settings a grid may vary (``--grid``): the default grid's, the runtime gates, which the
#: default grid leaves at 1 (always prefetch), and ``read`` (default grid: lane).
GRID_KEYS = tuple(s.name for s in TUNED)
POLICIES = ("strict", "geomean")
#: What an instantiation tune did not measure gets.
FALLBACKS = ("off", "base")


def candidate_name(cfg: PatchConfig) -> str:
    """``inline_kvhead_la1``: the tuned settings of a configuration, each by its tag (``_mg2``,
    ``_ctas1024``, ``_kv64``: a runtime gate that is set; ``_warp``: read=warp), those not
    always named only where they differ from the default."""
    values = [(s, getattr(cfg, s.name)) for s in TUNED]
    return "_".join(
        s.tune.tag.format(as_text(v).replace("-", "")) for s, v in values if s.tune.always or v != s.default
    )


def parse_grid(text: str) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """``'issue=inline,call;min-group=2;min-ctas=1,1024'`` -> a grid: the default
    :data:`GRID` with the named settings' values replaced (or added, for the gates).
    Each value is checked as a configuration would check it (UsageError otherwise)."""
    grid = dict(GRID)
    seen = set()
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        key, sep, values = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in GRID_KEYS:
            raise UsageError(f"invalid --grid part {part!r}: use KEY=V1,V2 with KEY one of "
                             f"{', '.join(k.replace('_', '-') for k in GRID_KEYS)}")  # fmt: skip
        if key in seen:
            raise UsageError(f"--grid names {key.replace('_', '-')} twice")
        seen.add(key)
        vals: list[Any] = []
        for v in (x.strip() for x in values.split(",")):
            checked = getattr(make_config(**{key: v}, inherit_rules=False), key)  # the configuration's own validation
            if checked in vals:
                raise UsageError(f"--grid gives {key.replace('_', '-')}={v} twice")
            vals.append(checked)
        grid[key] = tuple(vals)
    if not seen:
        raise UsageError("--grid is empty: give KEY=V1,V2;... (e.g. 'min-group=1,2')")
    return tuple((k, grid[k]) for k in GRID_KEYS if k in grid)


def parse_grids(texts: Sequence[str]) -> list[tuple[tuple[str, tuple[Any, ...]], ...]]:
    """Repeated ``--grid`` texts -> the grids whose candidates' union is built; none: [GRID]."""
    return [parse_grid(t) for t in texts] if texts else [GRID]


def candidates(base: PatchConfig | None = None, grids=(GRID,)) -> dict[str, PatchConfig]:
    """``name -> uniform configuration`` (no rules) for every combination of each grid,
    the union over ``grids`` (``min-kv-mib`` only with ``issue=call``, the one form it applies to)."""
    base = replace(base if base is not None else make_config(), overrides=())
    out: dict[str, PatchConfig] = {}
    for g in grids:
        keys = [k for k, _ in g]
        for values in itertools.product(*(v for _, v in g)):
            cfg = replace(base, **dict(zip(keys, values)))
            if cfg.min_kv_mib and cfg.issue != "call":
                continue
            out[candidate_name(cfg)] = cfg
    return out


def tuned_instantiations(dtypes: Iterable[str] = (), only: Iterable[str] = ()) -> list[tuple[str, int, int]]:
    """The tuned (dtype, head, block)s, of ``dtypes`` only (if any) and picked by a selector of
    ``only`` (``dtype[/head[/block]]``; if any). UsageError for a selector that is invalid,
    names a KV cache or kernel (tune measures both kernels, auto cache), or picks none."""
    sels = []
    for text in only:
        sel = Selector.parse(text)
        if sel.kv_cache is not None or sel.kernel is not None:
            raise UsageError(
                f"invalid --only {text!r}: give dtype[/head[/block]] (tune measures v1 and v2, auto cache)"
            )
        sels.append(sel)
    out = [(d, h, b) for d in P.TUNING_DTYPES for h in P.TUNING_HEAD_SIZES for b in P.TUNING_BLOCK_SIZES
           if (not dtypes or d in dtypes) and (not sels or any(s.matches(d, h, b) for s in sels))]  # fmt: skip
    if not out:
        raise UsageError("--only/--dtype pick no tuned instantiation (tune measures "
                         f"{'/'.join(P.TUNING_DTYPES)} x head {'/'.join(map(str, P.TUNING_HEAD_SIZES))} x block "
                         f"{'/'.join(map(str, P.TUNING_BLOCK_SIZES))})")  # fmt: skip
    return out


def candidate_configs(variant_info: dict[str, dict], baseline: str = "stock") -> dict[str, PatchConfig]:
    """``{name: configuration}`` of every library but ``baseline``, from its marker
    (:func:`kvpatch.config.config_from_marker`); a UsageError naming the library whose marker is
    none, or the baseline where no library has its name (a renamed ``bench.baseline``)."""
    if baseline not in variant_info:
        raise UsageError(f"the baseline {baseline!r} is none of the libraries ({', '.join(map(repr, variant_info))})")
    out = {}
    for name, info in variant_info.items():
        if name != baseline:
            try:
                out[name] = config_from_marker(str(info.get("marker", "")))
            except UsageError as e:
                raise UsageError(f"no configuration for {name!r} ({e})") from None
    return out
