"""``--arch`` in TORCH_CUDA_ARCH_LIST syntax: one target per SM, however often it is given,
with PTX kept where any spelling asks for it; the order as given."""

from __future__ import annotations

import pytest

from kvpatch.arch import parse_arch_list
from kvpatch.errors import UsageError


def test_an_sm_given_with_and_without_ptx_is_one_target() -> None:
    (one,) = parse_arch_list("9.0a;9.0a+PTX")
    assert one.code == "sm_90a" and one.ptx
    assert [a.code for a in parse_arch_list("9.0+PTX 9.0;8.0")] == ["sm_90", "sm_80"]
    assert parse_arch_list("9.0+PTX 9.0")[0].ptx
    assert not parse_arch_list("9.0a")[0].ptx


@pytest.mark.parametrize("text", ["", "nine", "9.0b", "[red]9.0"])
def test_what_is_not_an_arch_list_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_arch_list(text)
    assert "\n" not in str(info.value)
