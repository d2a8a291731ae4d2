"""libclang, loaded on first use.

The patching and build modules name ``ci`` (``clang.cindex``) at import time but use it
only when they parse. The GPU machine runs ``validate``, ``bench`` and ``tune`` on
prebuilt libraries without libclang installed, and it imports those modules on the way
(the package ``__init__`` files re-export them), so the import itself must not need
libclang. A missing libclang is reported when a header is parsed, in one line.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from ..errors import PatchError


class _OnFirstUse:
    """Attribute access loads the object (once) and reads the attribute from it."""

    def __init__(self, load: Callable[[], Any], what: str) -> None:
        self._load = load
        self._what = what
        self._obj: Any = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if self._obj is None:
            self._obj = self._load()
        return getattr(self._obj, name)

    def __repr__(self) -> str:
        return f"<{self._what}, loaded on first use>"


def _cindex() -> Any:
    try:
        return importlib.import_module("clang.cindex")
    except ImportError as e:
        raise PatchError(f"parsing the header needs libclang, which is not installed here ({e}): "
                         "pip install 'libclang>=18.1,<19'") from None  # fmt: skip


#: ``clang.cindex``
ci: Any = _OnFirstUse(_cindex, "clang.cindex")
#: ``clang.cindex.CursorKind``
CursorKind: Any = _OnFirstUse(lambda: ci.CursorKind, "clang.cindex.CursorKind")
