"""Every error a command can end with is a KvpatchError carrying its exit code: the library ABI's,
vLLM's own test's and git's errors too, which keep their names, attributes and (for the first two)
RuntimeError, so the callers that catch them by those still do."""

from __future__ import annotations

import pytest

from kvpatch.abi import AbiError
from kvpatch.errors import BuildError, GpuCheckError, KvpatchError
from kvpatch.gpu.upstream_test import UpstreamError
from kvpatch.source.git import GitFailed


@pytest.mark.parametrize("error, kind, code", [(AbiError("x.so has launcher ABI 7"), BuildError, 5),
                                               (UpstreamError("no test_paged_attention"), GpuCheckError, 6)])  # fmt: skip
def test_the_abi_and_upstream_errors_carry_their_exit_codes_and_stay_runtime_errors(error, kind, code) -> None:
    assert isinstance(error, KvpatchError) and isinstance(error, kind) and error.exit_code == code
    assert isinstance(error, RuntimeError)


def test_a_failed_git_command_is_a_tool_that_failed() -> None:
    e = GitFailed(["git", "checkout", "v0.10.2"], 128, "error: one\nfatal: pathspec 'v0.10.2' did not match\n")
    assert isinstance(e, BuildError) and e.exit_code == 5
    assert str(e) == e.reason() == "pathspec 'v0.10.2' did not match"
    assert (e.argv, e.status, e.timed_out) == (["git", "checkout", "v0.10.2"], 128, False)
    assert str(GitFailed(["git"], None, "", timed_out=True)) == "timed out"
