"""The patch configuration: what the injected prefetch does, validated once.

* :mod:`.model`: the settings and :class:`PatchConfig` (its rules, its marker text);
* :mod:`.make`: :func:`make_config`, the one function user input goes through;
* :mod:`.marker`: the marker text read back (:func:`config_from_marker`);
* :mod:`.toml`: ``kvpatch.toml`` read and written; :mod:`.layers`: the precedence of what a
  user gives over the shipped table, and where each setting came from;
* :mod:`.reach`: which options and rules change no kernel (``apply`` warns);
* :mod:`.defaults`: the shipped rule table and the machine it was tuned on;
* :mod:`.machine`: a machine record and how two differ.

Pure: nothing here touches the GPU, nvcc or the network; only :mod:`.toml` reads files.
"""

from .defaults import DEFAULT_OVERRIDES, DEFAULT_TUNED_ON
from .layers import config_and_tuned
from .machine import Machine, differences
from .make import make_config, parse_override, parse_rules
from .marker import config_from_marker
from .model import (
    CACHE_HINTS,
    CACHES,
    CHOICES,
    DTYPES,
    ISSUES,
    K_LOADS,
    LOGITS,
    MAX_ALIGN,
    MAX_LOOKAHEAD,
    MAX_MIN_CTAS,
    MAX_MIN_GROUP,
    MAX_MIN_KV_MIB,
    MAX_SIZE,
    OVERRIDABLE,
    PAPER,
    PLACEMENTS,
    PRESETS,
    QUANTIZED,
    READS,
    RULE_KERNELS,
    RULE_KV,
    SCOPES,
    V_LOADS,
    PatchConfig,
    Selector,
)  # fmt: skip
from .reach import unreached
from .toml import (
    RESERVED_VARIANTS,
    check_variant_name,
    dump_config,
    load_config_file,
    read_config_file,
    variant_configs,
    variant_files,
)

__all__ = [
    "CACHES", "CACHE_HINTS", "CHOICES", "DEFAULT_OVERRIDES", "DEFAULT_TUNED_ON", "DTYPES", "ISSUES", "K_LOADS", "LOGITS", "MAX_ALIGN",
    "MAX_LOOKAHEAD", "MAX_MIN_CTAS", "MAX_MIN_GROUP", "MAX_MIN_KV_MIB", "MAX_SIZE", "Machine", "OVERRIDABLE", "PAPER",
    "PLACEMENTS", "PRESETS", "PatchConfig", "QUANTIZED", "READS", "RESERVED_VARIANTS", "RULE_KERNELS", "RULE_KV",
    "SCOPES", "Selector", "V_LOADS", "config_and_tuned", "config_from_marker", "differences", "dump_config",
    "load_config_file", "make_config", "parse_override", "parse_rules", "read_config_file", "unreached",
    "variant_configs",
    "variant_files",
    "check_variant_name",
]  # fmt: skip
