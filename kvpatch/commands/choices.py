"""What the CLI shows before a command runs: the defaults and choices its options name, and the
option values it turns into objects (``whole_number``: a count as written on a command line; ``folder_spelling``: a file option spelled as a folder), taken from the rooms below so that the CLI imports the
commands (and the rendering) alone.
"""

from __future__ import annotations

from ..config.model import SETTINGS, decimal_number, whole_number
from ..config.settings import Setting
from ..decode.models import MODELS
from ..decode.options import DEFAULT_MODELS
from ..fsutil import folder_spelling
from ..gpu.defaults import (
    DECODE_LAYERS,
    DECODE_ROUNDS,
    DEFAULT_ARCH,
    DEFAULT_REPS,
    DEFAULT_ROUNDS,
    DEFAULT_WARMUP,
    TUNE_REPS,
)
from ..gpu.points import MAX_CONTEXT
from ..tune.grid import GRID_KEYS

__all__ = [
    "DECODE_LAYERS", "DECODE_ROUNDS", "DEFAULT_ARCH", "DEFAULT_MODELS", "DEFAULT_REPS", "DEFAULT_ROUNDS", "DEFAULT_WARMUP",
    "GRID_KEYS", "MAX_CONTEXT", "MODELS", "SETTINGS", "Setting", "TUNE_REPS", "decimal_number", "folder_spelling", "whole_number",
]  # fmt: skip
