"""Where kvpatch keeps what it fetches and builds: the cache's root (``$KVPATCH_CACHE``, else
the platform's user cache directory) and kvpatch's folders in it. Light to import: platformdirs
only where the root is the platform's default."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UsageError
from ..fsutil import expand_home

#: kvpatch's folders in its cache: the fetched releases (``releases/vX``: :mod:`.fetch`) and the
#: built libraries (``builds/<key>``: :class:`kvpatch.jit.layout.CacheLayout`).
RELEASES_DIR = "releases"
BUILDS_DIR = "builds"


def cache_root() -> Path:
    """``$KVPATCH_CACHE`` if set, else the platform's user cache dir; always absolute (a
    relative one is taken relative to the current directory, now). Creates nothing."""
    env = os.environ.get("KVPATCH_CACHE")
    if env:
        return absolute(expand_home(env, f"KVPATCH_CACHE={env}"), f"KVPATCH_CACHE={env}")
    import platformdirs

    return absolute(Path(platformdirs.user_cache_dir("kvpatch")), "the user cache directory")


def cache_folders() -> dict[str, Path]:
    """kvpatch's own folders in its cache, by what they hold: what no output may be written into
    (a release another apply checks out and a script reads, a library another command reuses).
    None where there is no cache to name: a ``KVPATCH_CACHE`` whose ``~`` names no home (the
    commands that use the cache refuse it themselves), or no ``KVPATCH_CACHE`` on a machine
    without platformdirs (a GPU machine given prebuilt libraries), where no kvpatch made one."""
    try:
        root = cache_root()
    except (UsageError, ImportError):
        return {}
    return {"kvpatch's release cache": root / RELEASES_DIR, "kvpatch's build cache": root / BUILDS_DIR}


def absolute(path: Path, what: str) -> Path:
    """``path`` made absolute against the current directory (``..`` kept: a symlinked
    directory before it must not change where it points)."""
    if path.is_absolute():
        return path
    try:
        return Path.cwd() / path
    except OSError as e:  # the current directory was removed
        raise UsageError(
            f"{what} is relative and the current directory cannot be read ({e.strerror or e}); give an absolute path"
        ) from None
