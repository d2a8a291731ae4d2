"""Jinja2 over ``templates/``: every piece of CUDA kvpatch generates is rendered here.

``templates/inject/`` holds what is injected into the header (``kvpatch.patch``),
``templates/build/`` the launcher translation units (``kvpatch.jit``) and
``templates/prefetch/`` the weight-prefetch kernel (``kvpatch.prefetch``).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import jinja2

from .errors import KvpatchError


def templates_dir() -> Path:
    """Installed wheels carry ``kvpatch/templates``; a checkout has ``templates/`` beside it."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parent / "templates"):
        if candidate.is_dir():
            return candidate
    raise KvpatchError("kvpatch's templates directory is missing from this installation")


@cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=False,
        autoescape=False,
    )


def render(name: str, **context) -> str:
    """Render one template (``'inject/prefetch.cuh.j2'``); no leading or trailing line breaks."""
    return environment().get_template(name).render(**context).strip("\n")
