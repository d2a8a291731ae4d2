"""What the plugin would do in this process, and why: every check ``register()`` makes,
as data (:class:`Decision`), with nothing registered.

:class:`Target` says where to register and how to look at the host; the default is
vLLM's: namespace ``_C``, dispatch key ``CUDA``, ``import vllm._C``, ``vllm.__version__``,
the environment's bundle. Tests replace parts (a stand-in namespace, the CPU key,
a stand-in library). torch and vLLM are imported inside the functions only.
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

from ..abi import ABI_VERSION, AbiError
from ..errors import printable, text_argument
from .bundle import MANIFEST, BundleError, bundle_dir, describe_missing, file_digest, missing_configs, read_bundle
from .schema import OPS, scales_by_value, schema_mismatch

#: The kill switch: set (to anything but '', '0', 'false', 'no', 'off') to keep vLLM's kernels.
ENV_DISABLE = "KVPATCH_DISABLE"
_ENABLE_HOW = "run 'kvpatch plugin enable' in this environment"


@dataclass(frozen=True)
class Target:
    """Where the override goes and how the host is examined (``None``: vLLM's defaults)."""

    namespace: str = "_C"
    dispatch_key: str = "CUDA"
    import_ops: Callable[[], Any] | None = None  # loads the C++ kernels; None: import vllm._C
    vllm_version: Callable[[], str] | None = None  # None: vllm.__version__
    load_library: Callable[[Path, str], Any] | None = None  # None: kvpatch.abi.load
    device: Any = None  # per-call device operations; None: kernel.CudaDevice
    bundle: Path | None = None  # None: bundle.bundle_dir()
    get_kernel: bool | None = None  # hand unserved calls back; None: whether torch has get_kernel

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.dispatch_key)


#: The one log line's fixed words (:meth:`Decision.line` writes them, :func:`kernels_logged` reads them).
_PREFIX = "kvpatch: "
_RUN = "now run"
_STAY = f"{_PREFIX}vLLM's own paged attention kernels stay:"


def kernels_logged(log: str) -> list[str]:
    """Whose kernels each of the plugin's log lines in ``log`` says a process runs, in order:
    'kvpatch' for a line saying its kernels now run, 'vllm' for one saying vLLM's stay (a
    line saying they *would* run is a status report, not a registration, and is skipped)."""
    found = []
    for line in text_argument(log, "the log").splitlines():
        at = line.find(_PREFIX)
        if at < 0:
            continue
        text = line[at:]
        if text.startswith(_STAY):
            found.append("vllm")
        elif f" {_RUN} kvpatch's patched kernels " in text:
            found.append("kvpatch")
    return found


@dataclass(frozen=True)
class Decision:
    """``action``: 'register' (all checks passed), 'off' (not enabled, or switched off) or
    'refuse' (a check failed: ``reason``, and ``fix`` says what to do)."""

    action: str
    reason: str
    fix: str = ""
    namespace: str = "_C"
    dispatch_key: str = "CUDA"
    bundle: str = ""
    release: str = ""  # the bundle's vLLM release
    vllm_version: str = ""  # the installed one
    header_revision: str = ""
    marker: str = ""
    archs: tuple[str, ...] = ()
    configs: int = 0
    torch_version: str = ""
    #: Calls the library cannot serve: 'get_kernel' (vLLM's kernel serves them) or 'error'.
    fallback: str = ""
    gpus: tuple[str, ...] = ()  # with decide(probe_gpu=True): 'GPU 0 sm_90: served' ...
    registered: bool = False  # register() installed the override
    #: Settings under which vLLM does not call these ops at all (V1 engine, another backend).
    notes: tuple[str, ...] = ()

    @property
    def registers(self) -> bool:
        return self.action == "register"

    @property
    def unserved(self) -> str:
        """What happens to a call the library cannot serve, in words."""
        if self.fallback == "get_kernel":
            return "vLLM's own kernel serves it (torch.library.get_kernel)"
        if self.fallback == "error":
            return (f"it raises RuntimeError (torch {self.torch_version} has no torch.library.get_kernel, "
                    "which arrived in 2.9)")  # fmt: skip
        return ""

    def line(self) -> str:
        """The one log line (whitespace collapsed: an exception's text may hold newlines; control
        characters, from a manifest or the environment, shown as escapes)."""
        return printable(" ".join(self._line().split()))

    def _line(self) -> str:
        ops = f"{self.namespace}::paged_attention_v1/_v2 ({self.dispatch_key})"
        if self.action == "register":
            done = _RUN if self.registered else "would run"
            marker = self.marker if len(self.marker) <= 80 else self.marker[:77] + "..."
            note = f" [{'; '.join(self.notes)}]" if self.notes else ""
            return (f"{_PREFIX}{ops} {done} kvpatch's patched kernels in place of vLLM {self.release}'s own "
                    f"(configuration '{marker}', built for {', '.join(self.archs)}); "
                    f"{ENV_DISABLE}=1 switches back{note}")  # fmt: skip
        if self.action == "off":
            return f"{_STAY} {self.reason}"
        return f"{_STAY} {self.reason}" + (f"; {self.fix}" if self.fix else "")

    def kernels(self) -> str:
        """Whose kernels this decision leaves running: 'kvpatch' (registered) or 'vllm'."""
        return "kvpatch" if self.action == "register" and self.registered else "vllm"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["archs"], d["gpus"], d["notes"], d["unserved"] = (
            list(self.archs),
            list(self.gpus),
            list(self.notes),
            self.unserved,
        )
        return d


@dataclass
class Ready:
    """What the checks produced that registering needs."""

    manifest: Any
    library: Any  # the loaded launcher library
    fallback: bool


def disabled() -> bool:
    value = os.environ.get(ENV_DISABLE, "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def normalize_version(text: str) -> str:
    """``'v0.10.2+cu128'`` -> ``'0.10.2'``, ``'0.6.4.post1'`` stays: the local label goes,
    leading zeros go, the rest (post, dev) is kept and compared."""
    text = text.strip().removeprefix("v").split("+")[0]
    m = re.match(r"(\d+(?:\.\d+)*)(.*)", text)
    if m is None:
        return text
    return ".".join(str(int(p)) for p in m.group(1).split(".")) + m.group(2)


def torch_version() -> str:
    """torch's version where it is imported already ('' where not: nothing is imported)."""
    import sys

    return str(getattr(sys.modules.get("torch"), "__version__", ""))


def _vllm_distribution() -> bool:
    """Whether a vLLM distribution is installed (its metadata; nothing imported)."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _installed_vllm() -> str:
    import vllm

    return str(vllm.__version__)


def _live_schema(namespace: str, op: str) -> Any:
    """The op's FunctionSchema in this process, or None when no such op is defined."""
    import torch

    try:
        return getattr(getattr(torch.ops, namespace), op).default._schema
    except (AttributeError, RuntimeError):
        return None


def evaluate(target: Target, *, probe_gpu: bool = False) -> tuple[Decision, Ready | None]:
    """Every check, in order; the first that fails decides (and no later one runs). Switched
    off or not enabled, it imports nothing (not even torch)."""
    base = Decision("off", "", namespace=target.namespace, dispatch_key=target.dispatch_key,
                    torch_version=torch_version())  # fmt: skip
    where = target.bundle if target.bundle is not None else bundle_dir()
    base = replace(base, bundle=str(where))
    if disabled():
        return replace(base, reason=f"{ENV_DISABLE}={os.environ.get(ENV_DISABLE)} switches the plugin off"), None

    def refuse(reason: str, fix: str) -> tuple[Decision, None]:
        return replace(base, action="refuse", reason=reason, fix=fix), None

    try:
        m = read_bundle(where)
    except BundleError as e:
        return refuse(str(e), f"{_ENABLE_HOW} again (it replaces the manifest), or delete {Path(where) / MANIFEST}")
    if m is None:
        return replace(base, reason=f"not enabled (no bundle at {where})", fix=_ENABLE_HOW), None
    base = replace(base, release=m.vllm_release, header_revision=m.header_revision, marker=m.marker,
                   archs=m.archs, configs=len(m.configs))  # fmt: skip
    again = f"{_ENABLE_HOW} again"
    if m.abi_version != ABI_VERSION:
        return refuse(f"the bundle's launcher ABI is {m.abi_version}, this kvpatch's is {ABI_VERSION}", again)
    # the library's file, the one the manifest names as it was installed: a damaged bundle is said
    # as one before anything of this environment is looked at (enabling again mends it, whatever else is missing)
    path = where / m.library
    try:
        if path.is_dir():
            return refuse(f"the bundle's library {path} is a directory, not the library the manifest names", again)
        size = path.stat().st_size
        sha = file_digest(path)[1] if size == m.library_bytes else ""
    except OSError as e:
        return refuse(f"cannot read the bundle's library {path}: {e.strerror or e}", again)
    if size != m.library_bytes or sha != m.library_sha256:
        what = f"{size} bytes, the manifest says {m.library_bytes}" if size != m.library_bytes else "its sha256 differs"
        return refuse(f"the bundle's library {path.name} is not the one installed ({what})", again)
    if target.vllm_version is None and not _vllm_distribution():
        return refuse(
            "vLLM is not installed in this environment", f"install vLLM {m.vllm_release}, the bundle's release"
        )
    try:
        import torch
    except ImportError as e:
        return refuse(f"cannot import torch ({e})", "install vLLM (and so torch) in this environment")
    base = replace(base, torch_version=torch.__version__)

    # vLLM: its version, then its C++ ops (registered before ours can be)
    try:
        installed = (target.vllm_version or _installed_vllm)()
    except Exception as e:  # noqa: BLE001 - any failure to import vLLM is one reason
        return refuse(f"cannot read vLLM's version ({type(e).__name__}: {e})", "install vLLM in this environment")
    base = replace(base, vllm_version=str(installed))
    if normalize_version(str(installed)) != normalize_version(m.vllm_release):
        return refuse(f"the bundle is for vLLM {m.vllm_release}, this environment has vLLM {installed}",
                      f"build for {normalize_version(str(installed))} and {_ENABLE_HOW} again")  # fmt: skip
    try:
        (target.import_ops or (lambda: importlib.import_module("vllm._C")))()
    except Exception as e:  # noqa: BLE001
        return refuse(f"cannot import vLLM's kernels ({type(e).__name__}: {e})", "check the vLLM installation")
    for op in OPS:
        qual = f"{target.namespace}::{op}"
        live = _live_schema(target.namespace, op)
        if live is None:
            return refuse(f"{qual} is not defined: vLLM's kernels are not loaded (import vllm._C first)",
                          "load the plugin from vLLM (its plugin loader runs after vllm._C is imported)")  # fmt: skip
        diff = schema_mismatch(m.schemas[op], live)
        if diff is not None:
            return refuse(f"{qual} has another schema than the bundle records: {diff}", again)
        if not torch._C._dispatch_has_kernel_for_dispatch_key(qual, target.dispatch_key):
            return refuse(f"{qual} has no {target.dispatch_key} kernel to replace", "check the vLLM installation")
    if m.scale_by_value != scales_by_value(m.schemas["paged_attention_v1"]):
        return refuse("the bundle's kernels and its recorded schema disagree on how k_scale/v_scale are passed", again)

    # the library: what it says about itself
    try:
        if target.load_library is not None:
            lib = target.load_library(path, m.prefix)
        else:
            from ..abi import load

            lib = load(path, m.prefix)
    except AbiError as e:
        return refuse(str(e), again)
    if set(lib.configs) != set(m.configs):
        return refuse("the library's configurations are not the ones the manifest records", again)
    if bool(lib.scale_by_value) != m.scale_by_value:
        return refuse("the library and the manifest disagree on how k_scale/v_scale are passed", again)
    missing = missing_configs(m.kernel_set, lib.configs)
    if missing:
        return refuse(describe_missing(missing, len(m.kernel_set.labels())), "build the full set and enable again")

    fallback = target.get_kernel if target.get_kernel is not None else hasattr(torch.library, "get_kernel")
    base = replace(base, action="register", reason="all checks passed", fallback="get_kernel" if fallback else "error",
                   notes=engine_notes(m.vllm_release))  # fmt: skip
    if probe_gpu:
        base = replace(base, gpus=_probe_gpus(m.archs, base.unserved))
    return base, Ready(m, lib, bool(fallback))


def engine_notes(release: str, environ: Any = None) -> tuple[str, ...]:
    """Which of vLLM's settings are missing for it to call these ops on CUDA at all: only
    the V0 engine's XFORMERS backend does (PagedAttention.forward_decode), and from 0.8
    the V1 engine is the default. Empty when the environment has them."""
    env = os.environ if environ is None else environ
    digits = [int(p) for p in re.findall(r"\d+", release)[:2]]
    missing = []
    if tuple(digits) >= (0, 8) and env.get("VLLM_USE_V1", "") != "0":
        missing.append("VLLM_USE_V1=0")
    if env.get("VLLM_ATTENTION_BACKEND", "") != "XFORMERS":
        missing.append("VLLM_ATTENTION_BACKEND=XFORMERS")
    return (f"vLLM calls them only with {' '.join(missing)}",) if missing else ()


def _probe_gpus(archs: tuple[str, ...], unserved: str) -> tuple[str, ...]:
    """Each visible GPU and whether the bundle's archs serve it (this initialises CUDA)."""
    import torch

    from .kernel import arch_serves

    if not torch.cuda.is_available():
        return ("no CUDA GPU visible",)
    out = []
    for i in range(torch.cuda.device_count()):
        cap = torch.cuda.get_device_capability(i)
        ok = arch_serves(archs, cap)
        out.append(f"GPU {i} {torch.cuda.get_device_name(i)} sm_{cap[0]}{cap[1]}: "
                   + ("served" if ok else f"not served: for its calls, {unserved}"))  # fmt: skip
    return tuple(out)
