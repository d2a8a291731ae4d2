"""The configuration's model: the settings, their allowed values, and :class:`PatchConfig`.

A :class:`PatchConfig` is one validated, immutable value that drives every template
(:mod:`.make` builds it from user input). :meth:`PatchConfig.marker` is its one-line form,
written into the generated code, which makes ``apply`` idempotent and lets a later
``apply`` or ``revert`` recognise its own work (:mod:`.marker` reads it back).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

from ..dtypes import QUERY_DTYPES, VLLM_BLOCK_SIZES, VLLM_HEAD_SIZES
from ..errors import UsageError
from .defaults import DEFAULT_OVERRIDES

CACHES = ("k", "v", "kv")
CACHE_HINTS = ("none", "evict_last", "evict_first", "evict_normal")
PRESETS = ("default", "paper")
PLACEMENTS = ("start", "end")
SCOPES = ("cta", "kv-head", "kv-head-rotate")
ISSUES = ("inline", "call", "split")
QUANTIZED = ("skip", "prefetch")
READS = ("lane", "warp")
#: The settings that take one of a fixed set of words.
CHOICES = {"caches": CACHES, "cache_hint": CACHE_HINTS, "placement": PLACEMENTS, "scope": SCOPES,
           "issue": ISSUES, "read": READS, "quantized": QUANTIZED}  # fmt: skip

#: Upper bounds, each named in the error that refuses a larger value.
#: ``cp.async.bulk.prefetch``'s size operand: ptxas accepts 0..1,048,560 on sm_90
#: (2^20 - 16; larger values fail only at the final assembly step).
MAX_SIZE = 1_048_560
#: The next block is ``block_idx + lookahead * NUM_WARPS``, computed in ``int``. A CTA has
#: at most 1024 threads, so NUM_WARPS <= 32 and lookahead * NUM_WARPS <= 2^15: with
#: block_idx below 2^31 - 2^15 (any real sequence: 2^31 blocks of >= 1 token) the sum
#: cannot overflow into a negative index that passes the ``< end`` guard. A lookahead
#: that large already points past the end of every sequence vLLM serves.
MAX_LOOKAHEAD = 1024
#: The address is rounded down with ``& ~(align - 1)``: above a 4 KiB page the rounding
#: moves the prefetch further from the tile than any tile is long, so it stops at 4096
#: (and, for a numeric size, at the size: a window shorter than the rounding can miss
#: the tile entirely).
MAX_ALIGN = 4096
#: ``num_queries_per_kv`` of any model is far below this.
MAX_MIN_GROUP = 1024
#: A launch of vLLM's kernels has num_heads x num_seqs x partitions CTAs: far below this.
MAX_MIN_CTAS = 1 << 24
#: MiB of KV cache (1 TiB): more than any GPU holds.
MAX_MIN_KV_MIB = 1 << 20
LIMITS = {
    "lookahead": MAX_LOOKAHEAD,
    "align": MAX_ALIGN,
    "size": MAX_SIZE,
    "min_group": MAX_MIN_GROUP,
    "min_ctas": MAX_MIN_CTAS,
    "min_kv_mib": MAX_MIN_KV_MIB,
}

#: What ``--preset paper`` fixes: the paper's 4096-byte, one-ahead prefetch.
PAPER = dict(
    lookahead=1,
    size=4096,
    align=16,
    cache_hint="none",
    placement="start",
    scope="cta",
    issue="inline",
    quantized="prefetch",
)

#: Query dtypes a configuration can give settings of their own (kvpatch.dtypes' names).
DTYPES = tuple(QUERY_DTYPES)
#: KV-cache kinds a rule can select: the query dtype's own (``auto``) or quantized (``fp8``).
RULE_KV = ("auto", "fp8")
#: Kernels a rule can select: paged_attention_v1 (PARTITION_SIZE 0) or v2 (partitioned).
RULE_KERNELS = ("v1", "v2")
#: Settings a rule may change (the others fix where the code goes), and ``off``: the
#: selected instantiations get no prefetch at all and compile exactly as stock.
OVERRIDABLE = ("lookahead", "size", "align", "cache_hint", "scope", "min_group", "min_ctas", "min_kv_mib", "issue",
               "read", "control", "off")  # fmt: skip


@dataclass(frozen=True)
class Selector:
    """Which kernels a rule applies to: ``dtype[/head[/block[/kv[/kernel]]]]``.

    Each part is a value or ``*``; ``bf16/80/32`` is bf16 queries, head size 80, block
    size 32, any KV cache, both kernels; ``*/*/32/fp8`` every fp8-cache kernel of block
    size 32; ``fp16/256/16/auto/v2`` only the v2 (partitioned) kernel of that
    instantiation. The generated code tests the parts with ``if constexpr`` on the
    kernel's own template parameters (the kernel by ``PARTITION_SIZE``, 0 in v1), so each
    kernel compiles only the settings that select it.
    """

    dtype: str | None = None
    head_size: int | None = None
    block_size: int | None = None
    kv_cache: str | None = None
    kernel: str | None = None

    @classmethod
    def parse(cls, text: str) -> Selector:
        parts = [p.strip() for p in str(text).strip().split("/")]
        if not 1 <= len(parts) <= 5 or any(not p for p in parts):
            raise UsageError(
                f"invalid selector {text!r}: use dtype[/head[/block[/kv[/kernel]]]], e.g. bf16/80/32 or */*/32"
            )
        parts += ["*"] * (5 - len(parts))
        dtype, head, block, kv, kernel = (None if p == "*" else p for p in parts)
        if dtype is not None and dtype not in DTYPES:
            raise UsageError(f"invalid selector {text!r}: dtype {dtype!r} is not one of {', '.join(DTYPES)}, *")
        sizes = []
        for what, value, known in (("head size", head, VLLM_HEAD_SIZES), ("block size", block, VLLM_BLOCK_SIZES)):
            if value is not None and not (ascii_digits(value) and len(value) <= 4 and 0 < int(value) <= 1024):
                raise UsageError(f"invalid selector {text!r}: {what} {value!r} is not a number (or *)")
            if value is not None and int(value) not in known:
                raise UsageError(f"invalid selector {text!r}: vLLM builds no kernel of {what} {int(value)} "
                                 f"(it builds {', '.join(map(str, known))})")  # fmt: skip
            sizes.append(None if value is None else int(value))
        if kv is not None and kv not in RULE_KV:
            raise UsageError(f"invalid selector {text!r}: kv-cache {kv!r} is not one of {', '.join(RULE_KV)}, *")
        if kernel is not None and kernel not in RULE_KERNELS:
            raise UsageError(f"invalid selector {text!r}: kernel {kernel!r} is not one of {', '.join(RULE_KERNELS)}, *")
        sel = cls(dtype, sizes[0], sizes[1], kv, kernel)
        if sel == cls():
            raise UsageError(f"invalid selector {text!r}: it selects everything; set the option itself instead")
        return sel

    def __str__(self) -> str:
        parts = [self.dtype or "*", *(str(x) if x is not None else "*" for x in (self.head_size, self.block_size)),
                 self.kv_cache or "*", self.kernel or "*"]  # fmt: skip
        while parts and parts[-1] == "*":
            parts.pop()
        return "/".join(parts)

    def intersect(self, other: Selector) -> Selector | None:
        """The kernels both select, as a selector (None: none)."""
        parts = []
        for a, b in zip(self._parts(), other._parts()):
            if a is not None and b is not None and a != b:
                return None
            parts.append(a if a is not None else b)
        return Selector(*parts)

    def _parts(self) -> tuple:
        return (self.dtype, self.head_size, self.block_size, self.kv_cache, self.kernel)

    @property
    def specificity(self) -> int:
        return sum(x is not None for x in (self.dtype, self.head_size, self.block_size, self.kv_cache, self.kernel))

    def matches(self, dtype: str, head_size: int, block_size: int, kv_cache: str = "auto",
                kernel: str | None = None) -> bool:  # fmt: skip
        """Whether it selects these kernels; with ``kernel`` None (both kernels), a selector
        naming one kernel does not match."""
        kv = "auto" if kv_cache == "auto" else "fp8"
        return all(want is None or want == have for want, have in
                   ((self.dtype, dtype), (self.head_size, head_size), (self.block_size, block_size), (self.kv_cache, kv),
                    (self.kernel, kernel)))  # fmt: skip


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
    #: query heads sharing a KV head (``kv-head``), so each tile is requested once, or
    #: (``kv-head-rotate``) those query heads' CTAs in turn, tile by tile: head h takes the
    #: tile of iteration i when ``(i + h) & (group - 1) == 0`` (one CTA per tile for a group
    #: of 2, 4, 8..., at least one otherwise), so no CTA runs the prefetch path every
    #: iteration (with ``kv-head`` one CTA of the group does, and a small launch waits for it).
    scope: str = "cta"
    #: Prefetch only where at least this many query heads share a KV head
    #: (``num_queries_per_kv >= N``, a runtime test); 1: always. MHA has 1, GQA 32/8 has 4.
    min_group: int = 1
    #: Prefetch only in launches of at least this many CTAs (``gridDim.x * y * z``: query
    #: heads x sequences x partitions, a runtime test); 1: always. A small launch reads
    #: little KV, which a back-to-back launch finds in L2 already.
    min_ctas: int = 1
    #: ``issue=call`` only: the call helper returns before the prefetch unless the launch's
    #: KV cache is estimated at >= this many MiB (0: always prefetch). The estimate is read
    #: from the grid: KV heads (``gridDim.x / num_queries_per_kv``) x sequences (``y``) x
    #: partitions (``z``) x one partition's tiles, K and V (v1: one partition of 512 tokens,
    #: a lower bound). The test is in the out-of-line helper, so the loop that calls it
    #: compiles as without it; a small launch, whose KV a back-to-back run finds in L2,
    #: then issues no prefetch.
    min_kv_mib: int = 0
    #: How the instruction is emitted: ``inline`` asm in the loop body, or a ``call`` to
    #: an out-of-line (``__noinline__``) device function holding the asm. Inline asm in
    #: a loop stops nvcc from unswitching that loop, which changes code generation
    #: (and the rounding of the ALiBi term in bf16/fp32); a call leaves it as stock.
    #: ``split``: inline asm, and the key loop runs as stock's copy, without the prefetch,
    #: whenever the head's ALiBi slope is not 0 (``if (slope != 0) <stock loop> else
    #: <patched loop>``), so each copy can compile as stock's unswitched loop does.
    issue: str = "call"
    #: Who reads the next block's number from the block table: ``lane`` 0, inside the guard
    #: (a branch only lane 0 takes: the warp waits for that load, and for the guard's tests,
    #: every iteration), or every lane of the ``warp``, before the guard, at an index clamped
    #: into the loop's range (the same address on every lane). With ``warp`` the guard's tests
    #: are joined by ``&`` and include the number read (``>= 0``, true of every block number),
    #: so the loop-invariant ones leave the loop and nvcc issues the load beside stock's own
    #: block-table load; only the prefetch itself depends on lane 0.
    read: str = "lane"
    #: Compile the prefetch in but never execute it (its guard reads a block number
    #: < 0): separates the prefetch's own effect from the code-generation change.
    control: bool = False
    #: Kernels whose KV cache is quantized (fp8: ``cache_t`` differs from ``scalar_t``)
    #: get no prefetch (``skip``: ``if constexpr`` leaves them exactly stock) or the
    #: same prefetch as the others (``prefetch``). Measured on an H200, fp8 caches ran
    #: 0.89-0.97x with the prefetch (docs/tuning.md).
    quantized: str = "skip"
    #: No prefetch at all (only meaningful in a rule: those instantiations compile as stock).
    off: bool = False
    #: Opt-in, for kvpatch's own launcher libraries: after the value loop, the kernel's
    #: tail prefetches the head of the next GEMM's weight into L2, each CTA its share, from a
    #: table keyed by the launch's key cache (the layer) that the library's
    #: ``<prefix>_set_weight_prefetch`` fills (``templates/inject/weight_tail.cuh.j2``).
    weight_tail: bool = False
    #: Rules, ``((selector, ((key, value), ...)), ...)``: the kernels a selector (a
    #: query dtype ``fp16``, or ``dtype/head/block[/kv]`` such as ``bf16/80/32``) picks use
    #: these settings instead of the base ones; the most specific matching rule wins.
    #: Chosen at compile time with ``if constexpr`` on the kernel's template parameters.
    overrides: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = DEFAULT_OVERRIDES

    @property
    def k(self) -> bool:
        return "k" in self.caches

    @property
    def v(self) -> bool:
        return "v" in self.caches

    def for_dtype(self, dtype: str) -> PatchConfig:
        """The settings of the rule whose selector is exactly ``dtype`` (else the base ones)."""
        return self.for_selector(dtype)

    def for_selector(self, selector: str) -> PatchConfig:
        """The settings of the rule with this selector text (else the base ones); no rules left."""
        return replace(self, **dict(dict(self.overrides).get(str(Selector.parse(selector)), ())), overrides=())

    def resolve(self, dtype: str, head_size: int, block_size: int, kv_cache: str = "auto",
                kernel: str | None = None) -> PatchConfig:  # fmt: skip
        """What one kernel gets: the first matching rule of :meth:`variants`, else the base
        (``kernel`` None: the rules that do not name a kernel)."""
        for selector, cfg in self.variants():
            if selector is None or Selector.parse(selector).matches(dtype, head_size, block_size, kv_cache, kernel):
                return cfg
        raise AssertionError("unreachable: the base settings match everything")

    def prefetches(self, dtype: str, head_size: int, block_size: int, kv_cache: str = "auto",
                   kernel: str | None = None) -> bool:  # fmt: skip
        """Whether the code generated for one kernel holds the prefetch: not where a rule
        turns it off, nor on a quantized cache under ``quantized=skip`` (there it is stock's)."""
        if kv_cache != "auto" and self.quantized != "prefetch":
            return False
        return not self.resolve(dtype, head_size, block_size, kv_cache, kernel).off

    def variants(self) -> list[tuple[str | None, PatchConfig]]:
        """``[(selector, settings), ..., (None, base settings)]``: what the template branches
        on, the most specific selectors first (an instantiation takes the first that matches)."""
        ordered = sorted(self.overrides, key=lambda item: -Selector.parse(item[0]).specificity)
        return [(sel, self.for_selector(sel)) for sel, _ in ordered] + [(None, replace(self, overrides=()))]

    def kernel_variants(self, head_sizes: Sequence[int] = VLLM_HEAD_SIZES, block_sizes: Sequence[int] = VLLM_BLOCK_SIZES,
                        ) -> list[tuple[tuple[str, int, int, str, str], str | None, PatchConfig]]:  # fmt: skip
        """For each kernel vLLM builds whose code the injection can change (fp8-cache kernels
        under ``quantized=skip`` compile as stock): (kernel, the selector of the
        :meth:`variants` entry it takes, those settings)."""
        variants = [(s, None if s is None else Selector.parse(s), c) for s, c in self.variants()]
        kinds = [kv for kv in RULE_KV if kv == "auto" or self.quantized == "prefetch"]
        return [(kernel, *next((s, c) for s, sel, c in variants if sel is None or sel.matches(*kernel)))
                for kernel in itertools.product(DTYPES, head_sizes, block_sizes, kinds, RULE_KERNELS)]  # fmt: skip

    def live_variants(self, head_sizes: Sequence[int] = VLLM_HEAD_SIZES,
                      block_sizes: Sequence[int] = VLLM_BLOCK_SIZES) -> list[tuple[str | None, PatchConfig]]:  # fmt: skip
        """The :meth:`variants` some kernel vLLM builds takes (the others are shadowed by more
        specific rules, or select only kernels that compile as stock), in the same order."""
        taken = {sel for _, sel, _ in self.kernel_variants(head_sizes, block_sizes)}
        return [(s, c) for s, c in self.variants() if s in taken]

    @property
    def uses_split(self) -> bool:
        return any(c.issue == "split" and not c.off for _, c in self.variants())

    @property
    def uses_call(self) -> bool:
        return any(c.issue == "call" and not c.off for _, c in self.variants())

    @property
    def branches_on_types(self) -> bool:
        """Whether the generated code picks by the kernel's types (needs ``kvpatch_is_same``)."""
        return bool(self.overrides) or self.quantized == "skip"

    def marker(self) -> str:
        """The configuration as written into the generated code's marker comments."""
        if self.preset == "paper":
            return f"preset=paper caches={self.caches}" + (" control" if self.control else "")
        text = self._marker_base()
        for selector, items in self.overrides:
            text += f" {selector}:" + ",".join("off" if k == "off" else f"{k}={_text(v)}" for k, v in items)
        return text

    def _marker_base(self) -> str:
        size = "auto" if self.size is None else str(self.size)
        parts = [
            f"lookahead={self.lookahead}",
            f"size={size}",
            f"align={self.align}",
            f"caches={self.caches}",
            f"hint={self.cache_hint}",
            f"placement={self.placement}",
            f"scope={self.scope}",
            *([f"min-group={self.min_group}"] if self.min_group != 1 else []),
            *([f"min-ctas={self.min_ctas}"] if self.min_ctas != 1 else []),
            *([f"min-kv-mib={self.min_kv_mib}"] if self.min_kv_mib else []),
            f"issue={self.issue}",
            *([f"read={self.read}"] if self.read != "lane" else []),
            f"quantized={self.quantized}",
        ]
        if self.control:
            parts.append("control")
        if self.weight_tail:
            parts.append("weight-tail")
        return " ".join(parts)

    def to_toml_dict(self) -> dict[str, Any]:
        """The configuration as a ``kvpatch.toml`` table (``size`` 'auto' for None).

        Complete: every dtype appears (a table of its settings, or ``"none"``), every rule,
        and ``inherit_rules = false``, so reading it back gives this configuration whatever
        kvpatch's default rules are then.
        """
        d = asdict(self)
        d["size"] = "auto" if self.size is None else self.size
        del d["overrides"], d["off"]
        if not self.weight_tail:  # opt-in: a table without it reads as before
            del d["weight_tail"]
        if self.preset == "paper":
            return d
        d["inherit_rules"] = False
        given = dict(self.overrides)
        for dtype in DTYPES:
            items = given.get(dtype)
            d[dtype] = {k: ("auto" if k == "size" and v is None else v) for k, v in items} if items else "none"
        rules = {sel: {k: ("auto" if k == "size" and v is None else v) for k, v in items}
                 for sel, items in self.overrides if sel not in DTYPES}  # fmt: skip
        d["rules"] = rules if rules else "none"
        return d


def _text(value: Any) -> str:
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def ascii_digits(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also takes '²' (which int() refuses) and '٣' (which
    it reads as 3)."""
    return text.isascii() and text.isdigit()
