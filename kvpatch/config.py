"""The patch configuration: one validated, immutable value that drives every template.

Every way a configuration reaches kvpatch (CLI options, ``--preset``, a
``kvpatch.toml`` given with ``--config``) ends in :func:`make_config`, so the rules
live in one place. :meth:`PatchConfig.marker` is the one-line form written into the
generated code, which makes ``apply`` idempotent and lets a later ``apply`` or
``revert`` recognise its own work.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from .errors import UsageError

CACHES = ("k", "v", "kv")
CACHE_HINTS = ("none", "evict_last", "evict_first", "evict_normal")
PRESETS = ("default", "paper")
PLACEMENTS = ("start", "end")
SCOPES = ("cta", "kv-head")
ISSUES = ("inline", "call")

#: What ``--preset paper`` fixes: the paper's 4096-byte, one-ahead prefetch.
PAPER = dict(lookahead=1, size=4096, align=16, cache_hint="none", placement="start", scope="cta", issue="inline")


@dataclass(frozen=True)
class PatchConfig:
    """What the injected prefetch does. Field docs are the README's option docs."""

    #: ``default`` (kvpatch's guarded, index-checked prefetch) or ``paper`` (the
    #: paper's exact mechanism: 4096 bytes, lookahead 1, "next block 0 means none").
    preset: str = "default"
    #: Prefetch the block this warp processes ``lookahead`` iterations from now:
    #: ``block_idx + lookahead * NUM_WARPS``, skipped past the loop's end.
    lookahead: int = 1
    #: Bytes per prefetch; ``None`` = one block's K (or V) tile of this head,
    #: ``BLOCK_SIZE * HEAD_SIZE * sizeof(cache_t)``, a constant of each instantiation.
    size: int | None = None
    #: The address is rounded down to this power of two (>= 16).
    align: int = 16
    #: Which loops get a prefetch: the key loop, the value loop, or both.
    caches: str = "kv"
    #: L2 eviction priority of the prefetched lines (``.L2::cache_hint`` + ``createpolicy``).
    cache_hint: str = "none"
    #: Where in the loop body the prefetch is issued: right after the block number
    #: is read (``start``) or after the block's work (``end``).
    placement: str = "start"
    #: Which CTAs prefetch: every CTA (``cta``) or, under GQA, only the first of the
    #: query heads sharing a KV head (``kv-head``), so each tile is requested once.
    scope: str = "cta"
    #: How the instruction is emitted: ``inline`` asm in the loop body, or a ``call`` to
    #: an out-of-line (``__noinline__``) device function holding the asm. Inline asm in
    #: a loop stops nvcc from unswitching that loop, which changes code generation
    #: (and the rounding of the ALiBi term in bf16/fp32); a call leaves it as stock.
    issue: str = "inline"
    #: Compile the prefetch in but never execute it (its guard reads a block number
    #: < 0): separates the prefetch's own effect from the code-generation change.
    control: bool = False

    @property
    def k(self) -> bool:
        return "k" in self.caches

    @property
    def v(self) -> bool:
        return "v" in self.caches

    def marker(self) -> str:
        """The configuration as written into the generated code's marker comments."""
        if self.preset == "paper":
            return f"preset=paper caches={self.caches}" + (" control" if self.control else "")
        size = "auto" if self.size is None else str(self.size)
        parts = [
            f"lookahead={self.lookahead}",
            f"size={size}",
            f"align={self.align}",
            f"caches={self.caches}",
            f"hint={self.cache_hint}",
            f"placement={self.placement}",
            f"scope={self.scope}",
            f"issue={self.issue}",
        ]
        if self.control:
            parts.append("control")
        return " ".join(parts)

    def to_toml_dict(self) -> dict[str, Any]:
        """The configuration as a ``kvpatch.toml`` table (``size`` 'auto' for None)."""
        d = asdict(self)
        d["size"] = "auto" if self.size is None else self.size
        return d


def _parse_size(value: Any) -> int | None:
    if value is None or value == "auto":
        return None
    if isinstance(value, bool):
        raise UsageError(f"invalid size {value!r}: use 'auto' or a number of bytes")
    if not (isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit())):
        raise UsageError(f"invalid size {value!r}: use 'auto' or a number of bytes")
    size = int(value)
    if size <= 0 or size % 16:
        raise UsageError(f"invalid size {size}: must be a positive multiple of 16 bytes")
    return size


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise UsageError(f"invalid {name} {value!r}: choose one of {', '.join(allowed)}")
    return value


def _int(name: str, value: Any) -> int:
    """An int, or a string of one; floats (2.5, and 2.0 too) and bools are refused."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    raise UsageError(f"invalid {name} {value!r}: expected an integer")


def make_config(**options: Any) -> PatchConfig:
    """Validate options (``None`` = not given) into a :class:`PatchConfig`.

    ``preset='paper'`` fixes lookahead, size, placement and scope to the paper's
    values; giving any of those explicitly alongside it is an error rather than a
    silent override.
    """
    known = {f.name for f in fields(PatchConfig)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(f"unknown configuration key(s): {', '.join(unknown)}")
    given = {k: v for k, v in options.items() if v is not None}
    preset = _choice("preset", given.get("preset", "default"), PRESETS)
    cfg = PatchConfig()
    if "lookahead" in given:
        la = _int("lookahead", given["lookahead"])
        if la < 1:
            raise UsageError(f"invalid lookahead {la}: must be >= 1")
        cfg = replace(cfg, lookahead=la)
    if "size" in given:
        cfg = replace(cfg, size=_parse_size(given["size"]))
    if "align" in given:
        al = _int("align", given["align"])
        if al < 16 or al & (al - 1):
            raise UsageError(f"invalid align {al}: must be a power of two >= 16")
        cfg = replace(cfg, align=al)
    if "caches" in given:
        cfg = replace(cfg, caches=_choice("caches", given["caches"], CACHES))
    if "cache_hint" in given:
        cfg = replace(cfg, cache_hint=_choice("cache-hint", given["cache_hint"], CACHE_HINTS))
    if "placement" in given:
        cfg = replace(cfg, placement=_choice("placement", given["placement"], PLACEMENTS))
    if "scope" in given:
        cfg = replace(cfg, scope=_choice("scope", given["scope"], SCOPES))
    if "issue" in given:
        cfg = replace(cfg, issue=_choice("issue", given["issue"], ISSUES))
    if "control" in given:
        if not isinstance(given["control"], bool):
            raise UsageError(f"invalid control {given['control']!r}: expected true or false")
        cfg = replace(cfg, control=given["control"])
    if preset == "paper":
        clash = sorted(k for k, fixed in PAPER.items() if k in given and getattr(cfg, k) != fixed)
        if clash:
            raise UsageError(f"--preset paper fixes {', '.join(clash)}; drop those options")
        cfg = replace(cfg, preset="paper", **PAPER)
    return cfg


def load_config_file(path: Path) -> dict[str, Any]:
    """Read a ``kvpatch.toml``: keys at top level or under ``[kvpatch]``; '-' or '_'."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"invalid TOML in {path}: {e}") from None
    table = data.get("kvpatch", data)
    if not isinstance(table, dict):
        raise UsageError(f"invalid config file {path}: [kvpatch] must be a table")
    return {str(k).replace("-", "_"): v for k, v in table.items()}


def dump_config(cfg: PatchConfig) -> str:
    """``kvpatch.toml`` text that :func:`load_config_file` reads back to ``cfg``."""
    lines = ["[kvpatch]"]
    for key, value in cfg.to_toml_dict().items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int):
            text = str(value)
        else:
            text = f'"{value}"'
        lines.append(f"{key.replace('_', '-')} = {text}")
    return "\n".join(lines) + "\n"
