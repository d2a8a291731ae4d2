"""kvpatch.gpu.dispatch: vLLM's choice between the v1 and v2 decode kernels."""

from __future__ import annotations

import pytest

from kvpatch.errors import UsageError
from kvpatch.gpu import dispatch as Dp


@pytest.mark.parametrize(
    "seqs,heads,max_len,kernel",
    [
        (1, 32, 512, "v1"),  # one partition
        (1, 32, 513, "v2"),  # two partitions, 32 <= 512
        (16, 32, 1024, "v2"),  # 512 is not > 512
        (17, 32, 1024, "v1"),  # 544 > 512
        (64, 32, 1024, "v1"),
        (64, 32, 4096, "v1"),
        (64, 32, 8192, "v1"),  # 8192 is still <= 8192
        (64, 32, 8193, "v2"),
        (1000, 32, 16384, "v2"),
        (1, 1, 1, "v1"),
    ],
)
def test_dispatch_rule(seqs, heads, max_len, kernel):
    assert Dp.dispatched_kernel(seqs, heads, max_len) == kernel
    assert Dp.uses_v1(seqs, heads, max_len) == (kernel == "v1")


def test_partitions_are_512_tokens():
    assert [Dp.num_partitions(n) for n in (1, 512, 513, 1500, 2100)] == [1, 1, 2, 3, 5]


def test_unknown_kernel_is_refused():
    assert Dp.check_kernel("v2") == "v2"
    with pytest.raises(UsageError):
        Dp.check_kernel("v3")
