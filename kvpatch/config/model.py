"""The configuration's model: the table of settings, their allowed values, and :class:`PatchConfig`.

A :class:`PatchConfig` is one validated, immutable value that drives every template
(:mod:`.make` builds it from user input). Its fields declared with
:func:`~.settings.setting` are the one table of settings (:data:`SETTINGS`): each says its
default, its words or bounds, its command-line help, its marker word, whether a rule may set
it, whether ``kvpatch tune`` may vary it and what ``--preset paper`` fixes; the value checks,
the marker, ``kvpatch.toml``, the options of ``apply`` and ``config``, the rules and the tune
grid all read it. :meth:`PatchConfig.marker` is its one-line form, written into the generated
code, which makes ``apply`` idempotent and lets a later ``apply`` or ``revert`` recognise its
own work (:mod:`.marker` reads it back).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

from ..dtypes import VLLM_BLOCK_SIZES, VLLM_HEAD_SIZES
from .defaults import DEFAULT_OVERRIDES
from .selector import DTYPES, RULE_KERNELS, RULE_KV, Selector
from .settings import FREE, Tune, as_text, marker_words, setting, table
from .settings import ascii_digits as ascii_digits  # read from here by kvpatch.serving
from .settings import check_seconds as check_seconds  # read from here by the commands and kvpatch.serving
from .settings import decimal_number as decimal_number  # read from here by the CLI
from .settings import whole_number as whole_number  # read from here by the CLI and kvpatch.decode

CACHES = ("k", "v", "kv")
CACHE_HINTS = ("none", "evict_last", "evict_first", "evict_normal")
PRESETS = ("default", "paper")
PLACEMENTS = ("start", "end")
SCOPES = ("cta", "kv-head", "kv-head-rotate")
ISSUES = ("inline", "call", "split")
QUANTIZED = ("skip", "prefetch")
READS = ("lane", "warp")
LOGITS = ("shared", "global", "auto")
V_LOADS = ("at-use", "ahead")
K_LOADS = ("at-use", "ahead", "shared")

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
#: CTAs an SM holds at once (sm_90: 32): a launch bound beyond it cannot be met.
MAX_CTAS_PER_SM = 32
#: MiB of KV cache (1 TiB): more than any GPU holds.
MAX_MIN_KV_MIB = 1 << 20


@dataclass(frozen=True)
class PatchConfig:
    """What the injected prefetch does. Field docs are the README's option docs; each setting's
    ``setting(default, help, ...)`` is its entry in the table (:class:`~.settings.Setting`). A new
    setting is a field here and its use in ``templates/inject/`` (and, if it constrains another
    setting, a check in :func:`~.make.make_config`)."""

    #: ``default`` (kvpatch's guarded, index-checked prefetch) or ``paper`` (the
    #: paper's exact mechanism: 4096 bytes, lookahead 1, "next block 0 means none").
    preset: str = "default"
    #: Prefetch the block this warp processes ``lookahead`` iterations from now:
    #: ``block_idx + lookahead * NUM_WARPS``, skipped past the loop's end.
    lookahead: int = setting(1, "Prefetch block_idx + N*NUM_WARPS (default 1).", low=1, high=MAX_LOOKAHEAD,
                             why="block_idx + lookahead * NUM_WARPS must stay within int", marked=True, rule=True,
                             tune=Tune(2, "la{}", (1, 2), always=True), paper=1)  # fmt: skip
    #: Bytes per prefetch; ``None`` = one block's K (or V) tile of this head,
    #: ``BLOCK_SIZE * HEAD_SIZE * sizeof(cache_t)``, a constant of each instantiation.
    size: int | None = setting(None, "auto (one K/V tile: BLOCK_SIZE*HEAD_SIZE*sizeof(cache_t)) or bytes, a multiple of 16.",
                               metavar="BYTES", auto=True, low=16, high=MAX_SIZE, multiple=16, unit="bytes",
                               why="cp.async.bulk.prefetch's limit", marked=True, rule=True, paper=4096)  # fmt: skip
    #: The address is rounded down to this power of two (>= 16).
    align: int = setting(16, "Round the address down to this power of two >= 16 (default 16).", metavar="BYTES",
                         low=16, high=MAX_ALIGN, power_of_two=True, why="the address is rounded down to it",
                         marked=True, rule=True, paper=16)  # fmt: skip
    #: Which loops get a prefetch: the key loop, the value loop, or both.
    caches: str = setting("kv", "Which loops prefetch (default kv).", choices=CACHES, marked=True, paper=FREE)
    #: L2 eviction priority of the prefetched lines (``.L2::cache_hint`` + ``createpolicy``).
    cache_hint: str = setting("none", "none, evict_last, evict_first or evict_normal.", metavar="HINT",
                              choices=CACHE_HINTS, marker="hint", marked=True, rule=True, paper="none")  # fmt: skip
    #: Where in the loop body the prefetch is issued: right after the block number
    #: is read (``start``) or after the block's work (``end``).
    placement: str = setting("start", "After the block number is read, or after the block's work.", choices=PLACEMENTS,
                             marked=True, paper="start")  # fmt: skip
    #: Which CTAs prefetch: every CTA (``cta``) or, under GQA, only the first of the
    #: query heads sharing a KV head (``kv-head``), so each tile is requested once, or
    #: (``kv-head-rotate``) those query heads' CTAs in turn, tile by tile: head h takes the
    #: tile of iteration i when ``(i + h) & (group - 1) == 0`` (one CTA per tile for a group
    #: of 2, 4, 8..., at least one otherwise), so no CTA runs the prefetch path every
    #: iteration (with ``kv-head`` one CTA of the group does, and a small launch waits for it).
    scope: str = setting("cta", "cta (every CTA prefetches), kv-head (one CTA per KV head under GQA) or kv-head-rotate "
                         "(the KV head's CTAs take turns, block by block).", metavar="SCOPE", choices=SCOPES,
                         marked=True, rule=True, tune=Tune(1, values=("cta", "kv-head"), always=True), paper="cta")  # fmt: skip
    #: Prefetch only where at least this many query heads share a KV head
    #: (``num_queries_per_kv >= N``, a runtime test); 1: always. MHA has 1, GQA 32/8 has 4.
    min_group: int = setting(1, "Prefetch only where >= N query heads share a KV head (a runtime test; 1 = always; "
                             "MHA has 1).", low=1, high=MAX_MIN_GROUP, rule=True, tune=Tune(3, "mg{}"))  # fmt: skip
    #: Prefetch only in launches of at least this many CTAs (``gridDim.x * y * z``: query
    #: heads x sequences x partitions, a runtime test); 1: always. A small launch reads
    #: little KV, which a back-to-back launch finds in L2 already.
    min_ctas: int = setting(1, "Prefetch only in launches of >= N CTAs (query heads x sequences x partitions; a runtime "
                            "test; 1 = always).", low=1, high=MAX_MIN_CTAS, rule=True, tune=Tune(4, "ctas{}"))  # fmt: skip
    #: ``issue=call`` only: the call helper returns before the prefetch unless the launch's
    #: KV cache is estimated at >= this many MiB (0: always prefetch). The estimate is read
    #: from the grid: KV heads (``gridDim.x / num_queries_per_kv``) x sequences (``y``) x
    #: partitions (``z``) x one partition's tiles, K and V (v1: one partition of 512 tokens,
    #: a lower bound). The test is in the out-of-line helper, so the loop that calls it
    #: compiles as without it; a small launch, whose KV a back-to-back run finds in L2,
    #: then issues no prefetch.
    min_kv_mib: int = setting(0, "issue=call only: the call helper skips the prefetch unless the launch's KV cache, "
                              "estimated from the grid, is >= MIB (0 = always).", metavar="MIB", low=0,
                              high=MAX_MIN_KV_MIB, rule=True, tune=Tune(5, "kv{}"))  # fmt: skip
    #: How the instruction is emitted: ``inline`` asm in the loop body, or a ``call`` to
    #: an out-of-line (``__noinline__``) device function holding the asm. Inline asm in
    #: a loop stops nvcc from unswitching that loop, which changes code generation
    #: (and the rounding of the ALiBi term in bf16/fp32); a call leaves it as stock.
    #: ``split``: inline asm, and the key loop runs as stock's copy, without the prefetch,
    #: whenever the head's ALiBi slope is not 0 (``if (slope != 0) <stock loop> else
    #: <patched loop>``), so each copy can compile as stock's unswitched loop does.
    issue: str = setting("call", "call (an out-of-line helper; keeps stock's code generation), inline (asm in the loop), "
                         "split (inline, and the key loop runs as stock's copy when the ALiBi slope is not 0).",
                         metavar="call|inline|split", choices=ISSUES, marked=True, rule=True,
                         tune=Tune(0, values=("inline", "call", "split"), always=True), paper="inline")  # fmt: skip
    #: Who reads the next block's number from the block table: ``lane`` 0, inside the guard
    #: (a branch only lane 0 takes: the warp waits for that load, and for the guard's tests,
    #: every iteration), or every lane of the ``warp``, before the guard, at an index clamped
    #: into the loop's range (the same address on every lane). With ``warp`` the guard's tests
    #: are joined by ``&`` and include the number read (``>= 0``, true of every block number),
    #: so the loop-invariant ones leave the loop and nvcc issues the load beside stock's own
    #: block-table load; only the prefetch itself depends on lane 0.
    read: str = setting("lane", "lane (lane 0 reads the next block number inside the guard) or warp (every lane reads "
                        "it before the guard).", choices=READS, rule=True, tune=Tune(6))  # fmt: skip
    #: kvpatch's own launchers only (the plugin, the benchmarks; vLLM's launchers never use it):
    #: one CTA computes this many query heads that share a KV head, reading each K and V tile once
    #: for all of them (``templates/inject/grouped.cuh.j2``); each head's arithmetic is the stock
    #: kernel's, so the output is bit for bit the same. 1: one CTA per query head, as vLLM. Used
    #: where the launch's group (query heads per KV head) is a multiple of it, without ALiBi, on
    #: non-fp8 caches and where :attr:`group_min_ctas` allows; elsewhere the stock form runs.
    group: int = setting(1, "Query heads per CTA in kvpatch's own launchers: 1 (one per head, as vLLM) or 2, 4, 8 "
                         "(each K/V tile read once for that many heads of a KV group, each head's arithmetic stock's).",
                         low=1, high=8, power_of_two=True, rule=True, tune=Tune(7, "g{}"), grouped="all")  # fmt: skip
    #: group > 1 only: the grouped form runs only in launches of at least this many CTAs of its own
    #: grid (query heads / group x sequences x partitions); a smaller launch keeps one CTA per head,
    #: which spreads a small batch over more of the GPU.
    group_min_ctas: int = setting(1, "group > 1 only: group only launches of >= N CTAs of the grouped grid (query "
                                  "heads / group x sequences x partitions; 1 = always).", low=1, high=MAX_MIN_CTAS,
                                  rule=True, tune=Tune(8, "gc{}"), grouped="all")  # fmt: skip
    #: group > 1 only: the grouped kernel is compiled with ``__launch_bounds__(NUM_THREADS, N)``,
    #: so that N of its CTAs fit on an SM's registers: nvcc then keeps it to 65536 / (N x 128)
    #: registers a thread, spilling what does not fit. More CTAs per SM hide more memory latency
    #: and round a launch into fewer waves; the spills cost. Registers do not change a value:
    #: outputs stay stock's. 0: no launch bounds, the registers nvcc chooses.
    group_ctas_per_sm: int = setting(0, "group > 1 only: compile the grouped form so that N of its CTAs fit on an SM "
                                     "(__launch_bounds__; fewer registers, maybe spills; 0 = as nvcc chooses).",
                                     low=0, high=MAX_CTAS_PER_SM, why="an SM of sm_90 holds at most 32 CTAs",
                                     rule=True, tune=Tune(9, "go{}"), grouped="all")  # fmt: skip
    #: group > 1 only, v1 only: where the launch's shared memory (its heads' logits, the context
    #: long) leaves room for fewer than N CTAs of the full group on an SM, the launcher runs half
    #: the group (half the heads a CTA, twice the CTAs) if more CTAs of that, and at least two, fit
    #: (the CUDA runtime answers for this GPU) and its CTAs fill the GPU in no more waves than the
    #: full group's (templates/build/group_rule.h.j2). 2 (the setting's default): only where one CTA
    #: of the full group fits; the shipped table takes 4 for its grouped v1 kernels
    #: (benchmarks/evidence/wave-rule/); 0: never. Outputs stay stock's either way.
    group_half_below: int = setting(2, "group > 1, v1 only: where fewer than N CTAs of the full group fit on an SM, "
                                    "launch half the group if more of those (and two or more) fit and it takes "
                                    "no more waves of CTAs (0 = never).",
                                    low=0, high=MAX_CTAS_PER_SM, why="an SM of sm_90 holds at most 32 CTAs",
                                    rule=True, tune=Tune(10, "gh{}"), grouped="v1")  # fmt: skip
    #: group > 1 only, v1 only: where the launch's shared memory (its heads' logits for the
    #: longest sequence it may see: vLLM's captured graphs size every launch for 8192 tokens)
    #: leaves room for fewer than N CTAs on an SM, the launcher gives it less: as much as lets N
    #: fit (never less than one head's logits for that longest sequence). Each CTA then computes
    #: its heads in as few passes as its own sequence's logits allow in it: all at once where they
    #: fit, else half of them at a time, ... down to one (each pass reads the K and V tiles again).
    #: 0 (the default): never; the kernel has no passes. Outputs stay stock's either way.
    group_fit_ctas: int = setting(0, "group > 1, v1 only: where the launch's shared memory fits fewer than N CTAs on "
                                  "an SM, give it what fits N and let each CTA take its heads in passes where its own "
                                  "sequence's logits do not all fit (0 = never).",
                                  low=0, high=MAX_CTAS_PER_SM, why="an SM of sm_90 holds at most 32 CTAs",
                                  rule=True, tune=Tune(11, "gf{}"), grouped="v1")  # fmt: skip
    #: group > 1 only, v1 only: where the grouped form keeps its heads' logits (fp32, one per token
    #: a head, the context long) between the key loop and the value loop. ``shared``: in the CTA's
    #: shared memory, which the launch sizes for the longest sequence it may see (vLLM's captured
    #: graphs: 8192 tokens), so at long contexts few CTAs fit on an SM. ``global``: in a buffer of
    #: global memory the launcher owns (one per GPU, kept across launches; the CTA's shared memory
    #: then holds only its output reduction), wherever that buffer can be had: it is allocated
    #: outside graph capture only, so a capture that needs a larger one than an eager launch of the
    #: same shape made runs the shared form. ``auto``: global only where shared memory holds fewer
    #: CTAs on an SM, of the full group and of half of it, than registers let the global form hold
    #: (launches sized for many more tokens than a CTA's shared memory then fits: vLLM's 8192-token
    #: graphs), and where the full group's waves of CTAs times its heads come to no more than the
    #: shared form's (templates/build/group_rule.h.j2); elsewhere the shared form, as with
    #: ``shared``. Launches on one GPU share the
    #: buffer, so they must run one after another (one stream, as vLLM and the benchmarks do).
    #: The logits are the same fp32 values either way: outputs stay stock's.
    group_logits: str = setting("shared", "group > 1, v1 only: keep the heads' logits in the CTA's shared memory "
                                "(shared), in a global-memory buffer the launcher owns (global), or in that buffer "
                                "only where shared memory fits fewer CTAs on an SM, of the full or half group, than "
                                "registers do and no wave of CTAs is added (auto).",
                                choices=LOGITS, rule=True, tune=Tune(12, "lg{}"), grouped="v1")  # fmt: skip
    #: group > 1 only: when a warp of the grouped form loads its V vectors. ``at-use``: each where
    #: the value loop uses it, block by block, as vLLM's loop does. ``ahead``: the next block's V
    #: vectors are loaded before the block in hand is computed (one block's vectors held in
    #: registers), so that their loads are in flight while it computes. More registers: where they
    #: no longer fit, nvcc spills (head 256 block 32, head 128 block 32 in bf16), so it is a per-kernel
    #: choice (the shipped table: fp16 head 256 block 16, benchmarks/evidence/v-loads-ahead/). The
    #: arithmetic and its order are the same: outputs stay stock's.
    group_v_loads: str = setting("at-use", "group > 1 only: load each V vector where the value loop uses it (at-use) "
                                 "or the next block's V vectors before the block in hand is computed (ahead).",
                                 choices=V_LOADS, rule=True, tune=Tune(13, "vl{}"), grouped="all")  # fmt: skip
    #: group > 1 only: when a warp of the grouped form loads its K vectors, as ``group_v_loads``
    #: for the key loop: ``at-use`` (each block's where the key loop scores it, as vLLM's loop does)
    #: or ``ahead`` (the next block's K vectors, as they are in the cache, loaded before the block
    #: in hand is scored: one block's vectors more in registers, their loads in flight while it
    #: computes), or ``shared`` (the next block's K vectors copied into the CTA's shared memory,
    #: cp.async on sm_80 and later, while the block in hand is scored, and read back from there:
    #: its loads in flight without holding registers; two blocks' K tiles a warp of static shared
    #: memory, so only where that fits in 48 KB -- head 64 and 128 at block 16, head 64 at block 32
    #: -- elsewhere at use). The same blocks are loaded, and the arithmetic and its order are the
    #: same: outputs stay stock's. A per-kernel choice like group_v_loads (the shipped table: fp16
    #: head 256 block 16, benchmarks/evidence/k-loads-ahead/; fp16 head 64 block 16,
    #: benchmarks/evidence/fp16-h64-grouped/).
    group_k_loads: str = setting("at-use", "group > 1 only: load each block's K vectors where the key loop scores it "
                                 "(at-use), the next block's before the block in hand is scored (ahead), or copy "
                                 "the next block's into shared memory meanwhile (shared: no registers held; head "
                                 "64/128 at block 16, head 64 at block 32).",
                                 choices=K_LOADS, rule=True, tune=Tune(14, "kl{}"), grouped="all")  # fmt: skip
    #: Compile the prefetch in but never execute it (its guard reads a block number
    #: < 0): separates the prefetch's own effect from the code-generation change.
    control: bool = setting(False, "Compile the prefetch but never run it (for measurements).", rule=True, paper=FREE)
    #: Kernels whose KV cache is quantized (fp8: ``cache_t`` differs from ``scalar_t``)
    #: get no prefetch (``skip``: ``if constexpr`` leaves them exactly stock) or the
    #: same prefetch as the others (``prefetch``). Measured on an H200, fp8 caches ran
    #: 0.89-0.97x with the prefetch (docs/tuning.md).
    quantized: str = setting("skip", "skip (fp8-cache kernels stay stock, the default) or prefetch.", choices=QUANTIZED,
                             marked=True, paper="prefetch")  # fmt: skip
    #: No prefetch at all (only meaningful in a rule: those instantiations compile as stock).
    off: bool = False
    #: Opt-in, for kvpatch's own launcher libraries: after the value loop, the kernel's
    #: tail prefetches the head of the next GEMM's weight into L2, each CTA its share, from a
    #: table keyed by the launch's key cache (the layer) that the library's
    #: ``<prefix>_set_weight_prefetch`` fills (``templates/inject/weight_tail.cuh.j2``).
    weight_tail: bool = setting(False, "After the value loop, prefetch the head of the next GEMM's weight into L2.",
                                hidden=True)  # fmt: skip
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
    def uses_group(self) -> bool:
        """Whether some kernel's settings ask for the grouped form (its code goes into the header)."""
        return any(c.group > 1 for _, c in self.variants())

    @property
    def branches_on_types(self) -> bool:
        """Whether the generated code picks by the kernel's types (needs ``kvpatch_is_same``)."""
        return bool(self.overrides) or self.quantized == "skip"

    def marker(self) -> str:
        """The configuration as written into the generated code's marker comments: the settings'
        words (:func:`~.settings.marker_words`; under ``--preset paper`` only those it leaves
        free), then each rule's ``selector:key=value,...``."""
        if self.preset == "paper":
            return " ".join(["preset=paper", *marker_words((s for s in SETTINGS if s.paper == FREE), self)])
        text = " ".join(marker_words(SETTINGS, self))
        for selector, items in self.overrides:
            text += f" {selector}:" + ",".join("off" if k == "off" else f"{k}={as_text(v)}" for k, v in items)
        return text

    def to_toml_dict(self) -> dict[str, Any]:
        """The configuration as a ``kvpatch.toml`` table (``size`` 'auto' for None).

        Complete: every dtype appears (a table of its settings, or ``"none"``), every rule,
        and ``inherit_rules = false``, so reading it back gives this configuration whatever
        kvpatch's default rules are then. A hidden setting appears only when set (opt-in: a
        table without it reads as before).
        """
        d = {k: _toml(v) for k, v in asdict(self).items() if k not in ("overrides", "off")}
        for s in SETTINGS:
            if s.hidden and getattr(self, s.name) == s.default:
                del d[s.name]
        if self.preset == "paper":
            return d
        d["inherit_rules"] = False
        given = dict(self.overrides)
        for dtype in DTYPES:
            items = given.get(dtype)
            d[dtype] = {k: _toml(v) for k, v in items} if items else "none"
        rules = {sel: {k: _toml(v) for k, v in items} for sel, items in self.overrides if sel not in DTYPES}
        d["rules"] = rules if rules else "none"
        return d


def _toml(value: Any) -> Any:
    return "auto" if value is None else value


#: The table of settings: every :class:`PatchConfig` field declared with ``setting``, in order.
SETTINGS = table(PatchConfig)
#: The settings that take one of a fixed set of words.
CHOICES = {s.name: s.choices for s in SETTINGS if s.kind == "word"}
#: Upper bounds, each named in the error that refuses a larger value.
LIMITS = {s.name: s.high for s in SETTINGS if s.kind == "int"}
#: What ``--preset paper`` fixes: the paper's 4096-byte, one-ahead prefetch, and nothing else.
PAPER = {s.name: s.paper_value for s in SETTINGS if s.paper != FREE}
#: Settings a rule may change (the others fix where the code goes), and ``off``: the
#: selected instantiations get no prefetch at all and compile exactly as stock.
OVERRIDABLE = (*(s.name for s in SETTINGS if s.rule), "off")
#: What a rule may give beside ``off``: the grouped form's settings (``off`` is about the
#: prefetch; those kernels' grouped form runs without one).
GROUPING = tuple(s.name for s in SETTINGS if s.grouped)
#: Of them, those only grouped v1 launches read.
V1_ONLY = tuple(s.name for s in SETTINGS if s.grouped == "v1")
