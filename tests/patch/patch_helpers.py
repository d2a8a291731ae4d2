"""What kvpatch injected into a header, laid out so that headers of other layouts compare."""

from __future__ import annotations

import re

_REGION = re.compile(r"^[ \t]*// kvpatch:begin (\S+) .*?^[ \t]*// kvpatch:end \1$", re.M | re.S)

#: What :func:`injected_regions` writes in place of the copy of stock's key loop (issue=split).
STOCK_KEY_LOOP = "<stock key loop>"


def injected_regions(patched: str, key_loop_text: str = "") -> list[tuple[str, str]]:
    """(label, text) of each ``// kvpatch:begin`` .. ``// kvpatch:end`` region, in order, each
    line without its indentation. In the ``key-split`` region, the copy of the stock key loop
    (``key_loop_text``, which issue=split copies verbatim) reads :data:`STOCK_KEY_LOOP`, so the
    regions of two headers whose loops differ compare by what kvpatch itself wrote."""
    out = []
    for m in _REGION.finditer(patched):
        text = m.group(0)
        if m.group(1) == "key-split":
            assert text.count(key_loop_text) == 1 and key_loop_text, "the split region holds no copy of the key loop"
            text = text.replace(key_loop_text, STOCK_KEY_LOOP)
        out.append((m.group(1), "\n".join(line.strip() for line in text.splitlines())))
    return out
