"""What a rule selects: :class:`Selector` (``dtype[/head[/block[/kv[/kernel]]]]``), and the
words of each part."""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import QUERY_DTYPES, VLLM_BLOCK_SIZES, VLLM_HEAD_SIZES
from ..errors import UsageError
from .settings import ascii_digits

#: Query dtypes a configuration can give settings of their own (kvpatch.dtypes' names).
DTYPES = tuple(QUERY_DTYPES)
#: KV-cache kinds a rule can select: the query dtype's own (``auto``) or quantized (``fp8``).
RULE_KV = ("auto", "fp8")
#: Kernels a rule can select: paged_attention_v1 (PARTITION_SIZE 0) or v2 (partitioned).
RULE_KERNELS = ("v1", "v2")


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


def kernel_selector(dtype: str, head_size: int, block_size: int, kv_cache_dtype: str, kernel: str) -> str:
    """``'fp16/128/16/auto/v2'``: the rule selector of exactly one kernel of one instantiation
    (any fp8 cache dtype is ``fp8``)."""
    kv = "auto" if kv_cache_dtype == "auto" else "fp8"
    return f"{dtype}/{head_size}/{block_size}/{kv}/{kernel}"
