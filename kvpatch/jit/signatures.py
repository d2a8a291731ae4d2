"""The kernels' signatures, read from the header with libclang, and how the launcher fills them.

The v1/v2/reduce kernels' template parameters and parameters differ between vLLM
releases (e.g. ``k_scale`` is a ``float`` in 0.6.4 and a ``const float*`` later), so
the launcher's template and call arguments are derived from what the header declares.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..errors import BuildError
from ..patch.cursors import walk
from ..patch.interrupts import interruptible
from ..patch.libclang import ci
from ..patch.parse import parse_header

#: The kernels a variant library holds, by the short name reports use.
KERNELS = {
    "v1": "paged_attention_v1_kernel",
    "v2": "paged_attention_v2_kernel",
    "reduce": "paged_attention_v2_reduce_kernel",
}


@dataclass(frozen=True)
class Param:
    """One kernel parameter as libclang reads it: ``k_scale``, ``'const float *'``."""

    name: str
    type: str
    pointer: bool


@dataclass(frozen=True)
class KernelSignature:
    """A ``__global__`` function template's template parameters and parameters."""

    name: str
    template_params: tuple[str, ...]
    params: tuple[Param, ...]

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


@interruptible
def kernel_signatures(text: str, header_path: str | Path) -> dict[str, KernelSignature]:
    """The v1, v2 and reduce kernels' signatures in ``text``, keyed ``'v1'``, ``'v2'``, ``'reduce'``.

    ``header_path`` is where the text would live in its tree (its siblings are read
    from there). Raises :class:`BuildError` when a kernel is missing.
    """
    parsed = parse_header(text, str(header_path))
    found: dict[str, KernelSignature] = {}
    wanted = {name: kind for kind, name in KERNELS.items()}
    for node in walk(parsed.tu.cursor):  # iterative: a header a thousand rules deep is walked to its end
        if node.kind != ci.CursorKind.FUNCTION_TEMPLATE or node.spelling not in wanted:
            continue
        if node.location.file is None or node.location.file.name != parsed.path:
            continue
        kind = wanted[node.spelling]
        if kind in found and not node.is_definition():
            continue
        found[kind] = _signature(node)
    missing = [KERNELS[k] for k in KERNELS if k not in found]
    if missing:
        raise BuildError(f"{header_path}: no {', '.join(missing)} found; is this vLLM's attention_kernels.cuh?")
    return found


def _signature(node: ci.Cursor) -> KernelSignature:
    tparams: list[str] = []
    params: list[Param] = []
    for child in node.get_children():
        if child.kind in (ci.CursorKind.TEMPLATE_TYPE_PARAMETER, ci.CursorKind.TEMPLATE_NON_TYPE_PARAMETER):
            tparams.append(child.spelling)
        elif child.kind == ci.CursorKind.PARM_DECL:
            pointer = child.type.get_canonical().kind == ci.TypeKind.POINTER
            params.append(Param(child.spelling, child.type.spelling, pointer))
    return KernelSignature(node.spelling, tuple(tparams), tuple(params))


#: Template arguments of the kernels, by template parameter name, in launcher terms.
_TEMPLATE_ARGS = {
    "scalar_t": "T",
    "cache_t": "CACHE_T",
    "HEAD_SIZE": "HEAD_SIZE",
    "BLOCK_SIZE": "BLOCK_SIZE",
    "NUM_THREADS": "kNumThreads",
    "KV_DTYPE": "KV_DTYPE",
    "IS_BLOCK_SPARSE": "false",
    "PARTITION_SIZE": "kPartitionSize",
}

#: Call arguments by kernel parameter name; vLLM's launcher values with blocksparse off.
_CALL_ARGS = {
    "out": "reinterpret_cast<T*>(a.out)",
    "exp_sums": "a.exp_sums",
    "max_logits": "a.max_logits",
    "tmp_out": "reinterpret_cast<T*>(a.tmp_out)",
    "q": "reinterpret_cast<const T*>(a.query)",
    "k_cache": "reinterpret_cast<const CACHE_T*>(a.key_cache)",
    "v_cache": "reinterpret_cast<const CACHE_T*>(a.value_cache)",
    "num_kv_heads": "a.num_kv_heads",
    "scale": "a.scale",
    "block_tables": "a.block_tables",
    "seq_lens": "a.seq_lens",
    "max_num_blocks_per_seq": "a.max_num_blocks_per_seq",
    "alibi_slopes": "a.alibi_slopes",
    "q_stride": "a.q_stride",
    "kv_block_stride": "a.kv_block_stride",
    "kv_head_stride": "a.kv_head_stride",
    "tp_rank": "/* tp_rank */ 0",
    "blocksparse_local_blocks": "/* blocksparse_local_blocks */ 0",
    "blocksparse_vert_stride": "/* blocksparse_vert_stride */ 0",
    "blocksparse_block_size": "/* blocksparse_block_size */ 64",
    "blocksparse_head_sliding_step": "/* blocksparse_head_sliding_step */ 0",
    "max_num_partitions": "max_num_partitions",
}


def template_arguments(sig: KernelSignature) -> str:
    """``'T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, kNumThreads, KV_DTYPE, false'`` for v1."""
    unknown = [p for p in sig.template_params if p not in _TEMPLATE_ARGS]
    if unknown:
        raise BuildError(f"{sig.name} has template parameter(s) kvpatch cannot fill: {', '.join(unknown)}")
    return ", ".join(_TEMPLATE_ARGS[p] for p in sig.template_params)


def call_arguments(sig: KernelSignature) -> list[str]:
    """The launcher's arguments for ``sig``, in its order; scales by pointer or by value."""
    args = []
    for p in sig.params:
        if p.name in ("k_scale", "v_scale"):
            args.append(f"a.{p.name}_ptr" if p.pointer else f"a.{p.name}")
        elif p.name in _CALL_ARGS:
            args.append(_CALL_ARGS[p.name])
        else:
            raise BuildError(f"{sig.name} has a parameter kvpatch's launcher does not know: {p.type} {p.name}")
    return args


def scale_by_value(sigs: Mapping[str, KernelSignature]) -> bool:
    """True when the kernels take ``k_scale`` as a float (vLLM 0.6.4), not a pointer."""
    k_scale = sigs["v1"].param("k_scale")
    return k_scale is not None and not k_scale.pointer
