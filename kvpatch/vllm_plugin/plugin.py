"""``register()``: the ``vllm.general_plugins`` entry point, and its process-wide state.

vLLM calls every general plugin in every process it creates (0.6.4 several times in
one process), before the model is loaded, the KV cache set up and CUDA graphs
captured. :func:`register` decides once per process (per namespace and dispatch
key): with a bundle installed, ``KVPATCH_DISABLE`` unset and every check of
:func:`kvpatch.vllm_plugin.checks.evaluate` passed, it registers the override
through ``torch.library.Library(namespace, "IMPL")``, keeps that Library alive
here, confirms in the dispatcher that its kernel is the active one and logs one
line; otherwise one warning line says why, and vLLM's kernels stay. Later calls
return the first decision and log nothing. It never initialises CUDA.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from ..errors import typed_argument
from .checks import ENV_DISABLE, Decision, Ready, Target, evaluate, torch_version
from .kernel import Override
from .schema import OPS

logger = logging.getLogger("kvpatch.vllm_plugin")

_default = Target()
_decided: dict[tuple[str, str], Decision] = {}
_registered: dict[tuple[str, str], "Registration"] = {}


def set_default_target(target: Target) -> Target:
    """What :func:`register` with no argument uses (tests); returns the previous one."""
    global _default
    previous, _default = _default, typed_argument(target, Target, "target")
    return previous


def default_target() -> Target:
    """What :func:`register` with no argument uses."""
    return _default


def decide(target: Target | None = None, *, probe_gpu: bool = False) -> Decision:
    """What :func:`register` would do here and why, without registering anything.
    Where it already ran in this process, its decision. ``probe_gpu`` also lists the
    visible GPUs and whether the bundle serves them (that initialises CUDA)."""
    t = typed_argument(target, Target, "target") if target is not None else _default
    if t.key in _decided and not probe_gpu:
        return _decided[t.key]
    try:
        return evaluate(t, probe_gpu=probe_gpu)[0]
    except Exception as e:  # noqa: BLE001 - a decision, never a traceback
        return _internal(t, e)


def register(target: Target | None = None) -> Decision:
    """The entry point (``kvpatch = "kvpatch.vllm_plugin:register"``): see the module."""
    t = typed_argument(target, Target, "target") if target is not None else _default
    if t.key in _decided:
        return _decided[t.key]
    try:
        decision, ready = evaluate(t)
        if ready is not None:
            decision = _install(t, decision, ready)
    except Exception as e:  # noqa: BLE001 - a warning line, never a failed plugin load
        decision = _internal(t, e)
    _decided[t.key] = decision
    _log(decision)
    return decision


def unregister(target: Target | None = None) -> bool:
    """Restore the kernel that was registered before (drop the override's Library) and
    forget the decision, so that :func:`register` decides again. True if one was active."""
    t = typed_argument(target, Target, "target") if target is not None else _default
    _decided.pop(t.key, None)
    reg = _registered.pop(t.key, None)
    if reg is None:
        return False
    reg.suspend()
    return True


def registration(target: Target | None = None) -> "Registration | None":
    """The live override of this process (None when none was registered)."""
    t = typed_argument(target, Target, "target") if target is not None else _default
    return _registered.get(t.key)


def reset() -> None:
    """Unregister everything and forget every decision (tests)."""
    for reg in list(_registered.values()):
        reg.suspend()
    _registered.clear()
    _decided.clear()


# --------------------------------------------------------------------------- registering


@dataclass
class Registration:
    """The override's torch Library (kept alive here: dropping it restores vLLM's kernel)."""

    namespace: str
    dispatch_key: str
    override: Override
    library: Any = None

    def resume(self) -> None:
        """Register the override's functions (again); a no-op while they are registered."""
        import torch

        if self.library is not None:
            return
        lib = torch.library.Library(self.namespace, "IMPL")
        try:
            for op, kind in zip(OPS, ("v1", "v2")):
                lib.impl(op, self.override.impl(kind), self.dispatch_key,
                         with_keyset=self.override.fallbacks is not None)  # fmt: skip
        except BaseException:
            _destroy(lib)
            raise
        self.library = lib

    def suspend(self) -> None:
        """Drop the override's registrations: the kernels registered before are active again."""
        lib, self.library = self.library, None
        if lib is not None:
            _destroy(lib)


def _destroy(lib: Any) -> None:
    destroy = getattr(lib, "_destroy", None)
    if destroy is not None:  # torch >= 2.1; older torch deregisters when the Library is collected
        destroy()


def active_kernel(qualname: str, dispatch_key: str) -> tuple[str | None, list[str]]:
    """From ``torch._C._dispatch_dump``: the active kernel's registration line for the key
    (None: none) and the inactive ones it shadows."""
    import torch

    active, inactive = None, []
    for line in torch._C._dispatch_dump(qualname).splitlines():
        if line.startswith(f"{dispatch_key}: "):
            active = line[len(dispatch_key) + 2 :]
        elif line.startswith(f"{dispatch_key} (inactive): "):
            inactive.append(line[len(dispatch_key) + len(" (inactive): ") :])
    return active, inactive


def _install(t: Target, decision: Decision, ready: Ready) -> Decision:
    import torch

    quals = {op: f"{t.namespace}::{op}" for op in OPS}
    before = {op: active_kernel(q, t.dispatch_key)[0] for op, q in quals.items()}
    fallbacks = {op: torch.library.get_kernel(q, t.dispatch_key) for op, q in quals.items()} if ready.fallback else None
    override = Override(ready.library, archs=ready.manifest.archs, scale_by_value=ready.manifest.scale_by_value,
                        fallbacks=fallbacks, device=t.device)  # fmt: skip
    reg = Registration(t.namespace, t.dispatch_key, override)
    try:
        reg.resume()
    except Exception as e:  # noqa: BLE001
        return replace(decision, action="refuse", reason=f"torch refused the registration ({type(e).__name__}: {e})",
                       fix="is another plugin overriding these ops?")  # fmt: skip
    for op, q in quals.items():
        active, inactive = active_kernel(q, t.dispatch_key)
        if active is None or active == before[op] or (before[op] is not None and before[op] not in inactive):
            reg.suspend()
            return replace(decision, action="refuse", fix="report this with 'kvpatch plugin status'",
                           reason=f"registered, but the dispatcher's active {t.dispatch_key} kernel of {q} "
                                  f"is not kvpatch's ({active})")  # fmt: skip
    _registered[t.key] = reg
    return replace(decision, registered=True)


def _internal(t: Target, e: BaseException) -> Decision:
    return Decision("refuse", f"unexpected {type(e).__name__}: {e}", "report this with 'kvpatch plugin status'",
                    namespace=t.namespace, dispatch_key=t.dispatch_key, torch_version=torch_version())  # fmt: skip


# --------------------------------------------------------------------------- the one line


def _log(decision: Decision) -> None:
    _ensure_handler()
    if decision.action == "register":
        logger.info("%s", decision.line())
    elif decision.action == "refuse":
        logger.warning("%s", decision.line())
    elif decision.reason.startswith(ENV_DISABLE):
        logger.info("%s", decision.line())  # switched off by hand: confirm it
    else:
        logger.debug("%s", decision.line())  # not enabled: the plugin is just installed


def _ensure_handler() -> None:
    """vLLM configures its own 'vllm' logger only: without a handler anywhere above ours,
    give it one on stderr (INFO), so that the line is seen."""
    if logger.hasHandlers():
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [kvpatch] %(message)s", "%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    logger.propagate = False
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
