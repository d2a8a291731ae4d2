"""vLLM's choice between the v1 and v2 decode kernels, and the v2 partition size.

From ``vllm/attention/ops/paged_attn.py`` (``PagedAttention.forward_decode``, vLLM
0.6.4 through 0.10.x): ``_PARTITION_SIZE = 512``, and::

    max_num_partitions = (max_seq_len + _PARTITION_SIZE - 1) // _PARTITION_SIZE
    # For context len > 8192, use V2 kernel to avoid shared memory shortage.
    use_v1 = (max_seq_len <= 8192
              and (max_num_partitions == 1 or num_seqs * num_heads > 512))
"""

from __future__ import annotations

from ..errors import UsageError

#: The kernels, in the order reports list them.
KERNELS = ("v1", "v2")
#: vLLM's v2 partition size (paged_attention_v2_launcher's PARTITION_SIZE default).
PARTITION_SIZE = 512
#: vLLM dispatches v1 only up to this max_seq_len.
V1_MAX_SEQ_LEN = 8192
#: ...and, with several partitions, only when num_seqs * num_heads exceeds this.
V1_MIN_PARALLELISM = 512


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def num_partitions(max_seq_len: int, partition_size: int = PARTITION_SIZE) -> int:
    return cdiv(max_seq_len, partition_size)


def uses_v1(num_seqs: int, num_heads: int, max_seq_len: int) -> bool:
    """vLLM's rule: v1 iff max_seq_len <= 8192 and (one partition or num_seqs * num_heads > 512)."""
    return max_seq_len <= V1_MAX_SEQ_LEN and (
        num_partitions(max_seq_len) == 1 or num_seqs * num_heads > V1_MIN_PARALLELISM
    )


def dispatched_kernel(num_seqs: int, num_heads: int, max_seq_len: int) -> str:
    """``"v1"`` or ``"v2"``: the kernel vLLM would launch for this batch."""
    return "v1" if uses_v1(num_seqs, num_heads, max_seq_len) else "v2"


def check_kernel(kernel: str) -> str:
    if kernel not in KERNELS:
        raise UsageError(f"unknown kernel {kernel!r}: v1 or v2")
    return kernel
