"""``python -m kvpatch``: the same as the ``kvpatch`` command."""

from .cli import run

run()
