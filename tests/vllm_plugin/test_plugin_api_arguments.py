"""The plugin's Python API refuses what it cannot work with in one line, as a UsageError naming
the argument and the type given (before: a TypeError or AttributeError from deep inside, and
``set_default_target`` kept a wrong value that every later ``register()`` then tripped on). No
torch: the package imports none."""

from __future__ import annotations

import pytest

from kvpatch.errors import KvpatchError, UsageError
from kvpatch.vllm_plugin import (
    KernelSet,
    Target,
    decide,
    kernels_logged,
    missing_configs,
    read_bundle,
    register,
    registration,
    remove_bundle,
    schema_mismatch,
    schemas_from_bindings,
    set_default_target,
    unregister,
    write_bundle,
)
from kvpatch.vllm_plugin.plugin import default_target


def _write(**change):
    args = dict(library="lib.so", vllm_release="0.10.2", header_revision="r", marker="m", archs=("9.0a",),
                prefix="p", configs=(), kernel_set=KernelSet(("fp16",), ("auto",), (128,), (16,)), schemas={},
                scale_by_value=False, directory="/nonexistent-bundle")  # fmt: skip
    return write_bundle(**{**args, **change})


CALLS = {
    "read_bundle(123)": (lambda: read_bundle(123), "the bundle's folder must be a path (str or os.PathLike), not int"),
    "remove_bundle(b'x')": (lambda: remove_bundle(b"x"), "the bundle's folder must be a path"),
    "write_bundle(library=None)": (lambda: _write(library=None), "the library must be a path"),
    "write_bundle(directory=1.5)": (lambda: _write(directory=1.5), "the bundle's folder must be a path"),
    "write_bundle(configs='fp16/128/16')": (lambda: _write(configs="fp16/128/16"), "must be labels"),
    "missing_configs(None, [])": (
        lambda: missing_configs(None, []),
        "the kernel set must be a KernelSet, not NoneType",
    ),
    "missing_configs(set, None)": (lambda: missing_configs(KernelSet(), None), "must be labels (an iterable of str)"),
    "missing_configs(set, [1])": (lambda: missing_configs(KernelSet(), [1]), "must be a label (str), not int"),
    "schemas_from_bindings(None)": (lambda: schemas_from_bindings(None), "the bindings' text must be text"),
    "schemas_from_bindings(b'')": (lambda: schemas_from_bindings(b""), "the bindings' text must be text"),
    "schema_mismatch(None, None)": (lambda: schema_mismatch(None, None), "the recorded schema must be text"),
    "kernels_logged(None)": (lambda: kernels_logged(None), "the log must be text (str), not NoneType"),
    "set_default_target('x')": (lambda: set_default_target("x"), "target must be a Target, not str"),
    "decide('x')": (lambda: decide("x"), "target must be a Target"),
    "register(1)": (lambda: register(1), "target must be a Target"),
    "unregister('x')": (lambda: unregister("x"), "target must be a Target"),
    "registration({})": (lambda: registration({}), "target must be a Target"),
}


@pytest.mark.parametrize("call", CALLS)
def test_a_wrong_argument_is_one_line_naming_it(call: str) -> None:
    before = default_target()
    do, needle = CALLS[call]
    with pytest.raises(UsageError) as info:
        do()
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert default_target() is before and isinstance(before, Target)  # nothing kept of a refused call


def test_bindings_without_an_op_stay_a_value_error_and_become_a_kvpatch_error() -> None:
    with pytest.raises(ValueError, match="paged_attention_v2") as info:
        schemas_from_bindings('ops.def("paged_attention_v1(Tensor a) -> ()");')
    assert isinstance(info.value, KvpatchError) and info.value.exit_code == 2
