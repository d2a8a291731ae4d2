"""The marker text, read back: :func:`config_from_marker` is the exact inverse of
:meth:`~.model.PatchConfig.marker` (``config_from_marker(cfg.marker()) == cfg``)."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError, text_argument
from .make import make_config, parse_override
from .model import DTYPES, SETTINGS, PatchConfig, Selector

#: A switch's marker word -> its setting (the word alone means on).
_SWITCHES = {s.word: s.name for s in SETTINGS if s.kind == "bool"}
#: A marker word -> its setting, for ``word=value`` (and the preset's own word).
_KEYS = {**{s.word: s.name for s in SETTINGS if s.kind != "bool"}, "preset": "preset"}


def config_from_marker(text: str) -> PatchConfig:
    """The configuration a marker's text (:meth:`PatchConfig.marker`) was written for.

    The inverse of ``marker()``: ``config_from_marker(cfg.marker()) == cfg``. Raises
    :class:`UsageError` for text ``marker()`` cannot have written.
    """
    text_argument(text, "a configuration marker")
    options: dict[str, Any] = {}
    dtypes: dict[str, Any] = {d: "none" for d in DTYPES}
    rules: dict[str, Any] = {}  # every rule the marker does not name is absent (inherit_rules=False)
    for word in text.split():
        if word in _SWITCHES:
            options[_SWITCHES[word]] = True
            continue
        selector, colon, items = word.partition(":")
        if colon and (selector in DTYPES or "/" in selector):
            settings = parse_override(items)
            if selector in DTYPES:
                dtypes[selector] = settings
            else:
                rules[str(Selector.parse(selector))] = settings
            continue
        key, eq, value = word.partition("=")
        name = _KEYS.get(key)  # a word marker() never writes (rules=, fp16=, inherit-rules=) is none of them
        if not eq or name is None or name in options:
            raise UsageError(f"not a kvpatch marker: {text[:80]!r}")
        options[name] = value
    if options.get("preset") == "paper":
        cfg = make_config(**options)
    else:
        cfg = make_config(**options, **dtypes, rules=rules, inherit_rules=False)
    if cfg.marker() != text.strip(" "):  # single spaces, as marker() writes them
        raise UsageError(f"not a kvpatch marker: {text[:80]!r}")
    return cfg
