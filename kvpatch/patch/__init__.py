"""The pure pipeline: header text -> sites -> edits -> patched text.

* :mod:`.parse` parses the header with libclang (no CUDA or torch headers needed);
* :mod:`.sites` finds the key and value loops and every name the snippet needs;
* :mod:`.plan` renders ``templates/inject/`` into byte-offset :class:`.edits.Edit`
  insertions;
* :mod:`.markers` finds and strips kvpatch's earlier injections;
* :mod:`.header` composes them: a header parsed once, patched, re-parsed to check it.

Nothing here touches the file system beyond the tree's own included headers that
libclang reads.
"""

from .edits import Edit, apply
from .header import Header, Injected, Result, inspect, patch, patch_header, read_header, unpatch
from .markers import injections
from .plan import plan
from .sites import Site, Sites, find_sites

__all__ = ["Edit", "Header", "Injected", "Result", "Site", "Sites", "apply", "find_sites", "injections", "inspect",
           "patch", "patch_header", "plan", "read_header", "unpatch"]  # fmt: skip
