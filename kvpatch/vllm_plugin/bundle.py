"""The bundle: what ``kvpatch plugin enable`` installs into a Python environment.

A directory (:func:`bundle_dir`: ``<sys.prefix>/share/kvpatch/vllm-plugin``, or
``$KVPATCH_PLUGIN_DIR``) holding the patched launcher library and ``bundle.json``,
the :class:`Manifest`: the vLLM release and stock-header revision it was built for,
the configuration marker, archs, the configurations built (and the full set the
release instantiates, which they must cover), the library's size, sha256 and ABI
version, and the op schemas recorded from that release's ``csrc/torch_bindings.cpp``.

Writes are atomic: the library goes in under a name holding its digest, then the
manifest replaces the old one in one rename, then the old library is removed. A
reader sees the old bundle or the new one, never half of either. A damaged
manifest is one :class:`BundleError` line, never a traceback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from .. import dtypes as D
from ..abi import ABI_VERSION, config_label
from ..errors import KvpatchError, UsageError, path_argument, typed_argument
from ..fsutil.reading import file_digest, parse_json, read_regular
from .schema import OPS

#: Overrides :func:`bundle_dir` (tests; an environment whose prefix is read-only).
ENV_DIR = "KVPATCH_PLUGIN_DIR"
MANIFEST = "bundle.json"
#: A manifest is a few kB; anything far larger is not one.
MANIFEST_LIMIT = 1 << 24
#: The manifest's own format; bump on an incompatible change.
FORMAT = 1


#: The file names :func:`write_bundle` gives libraries (what :func:`remove_bundle` removes).
_LIBRARY_NAME = re.compile(r"lib[A-Za-z0-9_]+-[0-9a-f]{12}\.[A-Za-z0-9]+")


class BundleError(KvpatchError):
    """The bundle is damaged or inconsistent; the message is one line naming why."""


def bundle_dir() -> Path:
    """Where this Python environment's bundle lives (nothing is created): absolute, a relative
    ``$KVPATCH_PLUGIN_DIR`` taken from the current directory now (a process started elsewhere
    with the same environment must find the same folder)."""
    env = os.environ.get(ENV_DIR)
    return Path(os.path.abspath(env)) if env else _default_dir()


def _default_dir() -> Path:
    """The bundle's folder where ``$KVPATCH_PLUGIN_DIR`` is unset: in this environment's ``share/``."""
    return Path(sys.prefix) / "share" / "kvpatch" / "vllm-plugin"


@dataclass(frozen=True)
class KernelSet:
    """The configurations a release instantiates: every (dtype, kv-cache dtype, head size,
    block size) vLLM's own ``paged_attention_v1.cu`` dispatches to."""

    dtypes: tuple[str, ...] = tuple(D.QUERY_DTYPES)
    kv_cache_dtypes: tuple[str, ...] = tuple(D.KV_CACHE_DTYPES)
    head_sizes: tuple[int, ...] = D.VLLM_HEAD_SIZES
    block_sizes: tuple[int, ...] = D.VLLM_BLOCK_SIZES

    def labels(self) -> list[str]:
        return [config_label(d, k, h, b) for d in self.dtypes for k in self.kv_cache_dtypes
                for h in self.head_sizes for b in self.block_sizes]  # fmt: skip


def _folder(directory: str | os.PathLike[str] | None) -> Path:
    """The bundle's folder: ``directory`` (refused in one line where it is no path), else :func:`bundle_dir`."""
    return Path(path_argument(directory, "the bundle's folder")) if directory is not None else bundle_dir()


def missing_configs(kernel_set: KernelSet, built: Iterable[str]) -> list[str]:
    """The release's configurations the library lacks (empty: it covers the full set)."""
    have = set(_labels(built))
    return [c for c in typed_argument(kernel_set, KernelSet, "the kernel set").labels() if c not in have]


def _labels(built: Any) -> tuple[str, ...]:
    """Configuration labels as given (an iterable of ``str``), or a one-line :class:`UsageError`."""
    if isinstance(built, (str, bytes)) or not isinstance(built, Iterable):
        raise UsageError(f"the built configurations must be labels (an iterable of str), not {type(built).__name__}")
    labels = tuple(built)
    wrong = next((c for c in labels if not isinstance(c, str)), None)
    if wrong is not None:
        raise UsageError(f"a built configuration must be a label (str), not {type(wrong).__name__}")
    return labels


def describe_missing(missing: list[str], total: int) -> str:
    shown = ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else "")
    return f"{len(missing)} of the release's {total} configurations are not built ({shown})"


@dataclass(frozen=True)
class Manifest:
    """``bundle.json``, as data."""

    vllm_release: str  # '0.10.2': the release the kernels were built from
    header_revision: str  # md5 (or its prefix) of the stock attention_kernels.cuh
    marker: str  # the configuration marker the patch injected
    archs: tuple[str, ...]  # SASS targets, 'sm_90a'; 'compute_90a' where PTX is embedded
    prefix: str  # the launchers' symbol prefix
    library: str  # the library's file name, inside the bundle directory
    library_bytes: int
    library_sha256: str
    abi_version: int
    scale_by_value: bool  # the kernels take k_scale/v_scale as floats (0.6.4)
    configs: tuple[str, ...]  # what the library was built with
    kernel_set: KernelSet  # what the release instantiates (configs must cover it)
    schemas: Mapping[str, str]  # op -> schema text from the release's torch_bindings.cpp
    kvpatch_version: str = ""
    format: int = FORMAT
    extra: Mapping[str, Any] = field(default_factory=dict)  # provenance, shown by status

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["archs"], d["configs"] = list(self.archs), list(self.configs)
        d["kernel_set"] = {k: list(v) for k, v in asdict(self.kernel_set).items()}
        d["schemas"], d["extra"] = dict(self.schemas), dict(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Manifest:
        """Check every field's presence and type: :class:`BundleError` naming the first bad one."""
        if not isinstance(d, dict):
            raise BundleError("the manifest is not a JSON object")
        if type(d.get("format")) is not int or d.get("format") != FORMAT:  # true and 1.0 are no format 1
            raise BundleError(f"manifest format {d.get('format')!r}, this kvpatch reads {FORMAT}")

        def get(name: str, kind: type) -> Any:
            if name not in d:
                raise BundleError(f"the manifest lacks '{name}'")
            v = d[name]
            if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
                raise BundleError(f"the manifest's '{name}' should be a {kind.__name__}, not {type(v).__name__}")
            return v

        def strings(name: str, v: Any) -> tuple[str, ...]:
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise BundleError(f"the manifest's '{name}' is not a list of strings")
            return tuple(v)

        def ints(name: str, v: Any) -> tuple[int, ...]:
            if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                raise BundleError(f"the manifest's '{name}' is not a list of integers")
            return tuple(v)

        ks = get("kernel_set", dict)
        for key in ("dtypes", "kv_cache_dtypes", "head_sizes", "block_sizes"):
            if key not in ks:
                raise BundleError(f"the manifest's 'kernel_set' lacks '{key}'")
            if ks[key] == []:  # every release instantiates some: an empty list would let any library pass
                raise BundleError(f"the manifest's 'kernel_set' has no '{key}'")
        schemas = get("schemas", dict)
        for op in OPS:
            if not isinstance(schemas.get(op), str) or not schemas[op].strip():
                raise BundleError(f"the manifest records no schema for {op}")
        if get("archs", list) == []:  # a library for no GPU: every launch would fall back
            raise BundleError("the manifest's 'archs' is empty: the library was built for no GPU")
        library = get("library", str)
        if not library or Path(library).name != library or library in (".", "..") or "\0" in library:
            raise BundleError(f"the manifest's library {library!r} is not a plain file name")
        return cls(
            vllm_release=get("vllm_release", str), header_revision=get("header_revision", str),
            marker=get("marker", str), archs=strings("archs", get("archs", list)), prefix=get("prefix", str),
            library=library, library_bytes=get("library_bytes", int), library_sha256=get("library_sha256", str),
            abi_version=get("abi_version", int), scale_by_value=get("scale_by_value", bool),
            configs=strings("configs", get("configs", list)),
            kernel_set=KernelSet(strings("dtypes", ks["dtypes"]), strings("kv_cache_dtypes", ks["kv_cache_dtypes"]),
                                 ints("head_sizes", ks["head_sizes"]), ints("block_sizes", ks["block_sizes"])),
            schemas={op: schemas[op] for op in OPS}, kvpatch_version=str(d.get("kvpatch_version", "")),
            extra=d.get("extra") if isinstance(d.get("extra"), dict) else {},
        )  # fmt: skip


def _readable(path: str) -> None:
    """Give a temporary file (mkstemp makes it 0600) the umask's default permissions: the
    bundle is read by whichever user runs vLLM."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _readable(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bundle(
    library: str | os.PathLike[str],
    *,
    vllm_release: str,
    header_revision: str,
    marker: str,
    archs: Iterable[str],
    prefix: str,
    configs: Iterable[str],
    kernel_set: KernelSet,
    schemas: Mapping[str, str],
    scale_by_value: bool,
    kvpatch_version: str = "",
    extra: Mapping[str, Any] | None = None,
    directory: str | os.PathLike[str] | None = None,
) -> Manifest:
    """Install ``library`` and its manifest as the environment's bundle (replacing any).

    Refuses (:class:`BundleError`) a library that does not cover ``kernel_set`` (a
    partial build would leave some of vLLM's calls unserved) and schemas missing an op.
    """
    src = Path(path_argument(library, "the library"))
    out = _folder(directory)
    configs = _labels(configs)
    missing = missing_configs(kernel_set, configs)
    if missing:
        raise BundleError(describe_missing(missing, len(kernel_set.labels())) + ": build the full set")
    for op in OPS:
        if not str(schemas.get(op, "")).strip():
            raise BundleError(f"no schema recorded for {op}")
    out.mkdir(parents=True, exist_ok=True)
    size, sha = file_digest(src)
    name = f"lib{prefix}-{sha[:12]}{src.suffix or '.so'}"
    old = read_bundle(out, missing_ok=True, damaged_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.", suffix=".tmp")
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        if file_digest(tmp) != (size, sha):
            raise BundleError(f"{src} changed while it was copied")
        _readable(tmp)
        os.replace(tmp, out / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    manifest = Manifest(
        vllm_release=vllm_release, header_revision=header_revision, marker=marker, archs=tuple(archs),
        prefix=prefix, library=name, library_bytes=size, library_sha256=sha, abi_version=ABI_VERSION,
        scale_by_value=bool(scale_by_value), configs=configs, kernel_set=kernel_set,
        schemas={op: schemas[op] for op in OPS}, kvpatch_version=kvpatch_version, extra=dict(extra or {}),
    )  # fmt: skip
    _write_atomic(out / MANIFEST, (json.dumps(manifest.to_dict(), indent=1, sort_keys=True) + "\n").encode())
    if old is not None and old.library != name and _LIBRARY_NAME.fullmatch(old.library):  # only what kvpatch wrote
        (out / old.library).unlink(missing_ok=True)
    return manifest


def read_bundle(
    directory: str | os.PathLike[str] | None = None, *, missing_ok: bool = True, damaged_ok: bool = False
) -> Manifest | None:
    """The installed manifest; None when there is no bundle (``missing_ok``) or, with
    ``damaged_ok``, a damaged one. Otherwise :class:`BundleError` in one line."""
    path = (_folder(directory)) / MANIFEST
    try:  # a regular file of bounded size only: a FIFO or a device must not hang vLLM's start-up
        text = read_regular(path, limit=MANIFEST_LIMIT).decode("utf-8")
    except FileNotFoundError:
        if missing_ok:
            return None
        raise BundleError(f"no bundle at {path.parent}") from None
    except (OSError, UnicodeDecodeError) as e:
        if damaged_ok:
            return None
        raise BundleError(f"cannot read {path}: {e}") from None
    try:
        return Manifest.from_dict(parse_json(text))
    except (ValueError, BundleError) as e:  # not JSON, nested too deeply included
        if damaged_ok:
            return None
        why = e.args[0] if isinstance(e, BundleError) else f"not JSON ({e})"
        raise BundleError(f"damaged manifest {path}: {why}") from None


def remove_bundle(directory: str | os.PathLike[str] | None = None) -> bool:
    """Remove the bundle: its manifest (first, so no reader sees a manifest without its
    library), the library the manifest names and :func:`write_bundle`'s own leftovers of the
    two, then the directory if nothing else is in it. Only what a valid manifest names is
    touched: no manifest is nothing to remove (False); a damaged one is :class:`BundleError`."""
    out = _folder(directory)
    try:
        m = read_bundle(out, missing_ok=True)
    except BundleError as e:
        raise BundleError(f"{e}; nothing removed (only what a valid manifest names is): 'kvpatch plugin enable' "
                          f"replaces it, or delete {out / MANIFEST} yourself") from None  # fmt: skip
    if m is None:
        return False
    if not _LIBRARY_NAME.fullmatch(m.library):
        raise BundleError(f"{out / MANIFEST} names {m.library!r}, not a library kvpatch writes: nothing removed")
    if (out / m.library).is_dir():
        raise BundleError(f"{out / m.library} is a directory, not the library {out / MANIFEST} names: nothing removed")
    (out / MANIFEST).unlink(missing_ok=True)
    (out / m.library).unlink(missing_ok=True)
    try:
        for p in out.iterdir():
            ours = p.name.startswith((f".{m.library}.", f".{MANIFEST}.")) and p.name.endswith(".tmp")
            if ours and p.is_file():
                p.unlink(missing_ok=True)
    except OSError:
        pass  # a folder this user may not list: the bundle is gone, its leftovers (if any) stay
    try:
        out.rmdir()
        if out == _default_dir():
            out.parent.rmdir()  # share/kvpatch/, where it holds nothing else
    except OSError:
        pass  # something else lives there: leave it
    return True
