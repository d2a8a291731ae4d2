"""The pure pipeline: header text -> sites -> edits -> patched text.

* :mod:`.parse` parses the header with libclang (no CUDA or torch headers needed);
* :mod:`.sites` finds the key and value loops and every name the snippet needs;
* :mod:`.plan` renders ``templates/inject/`` into byte-offset :class:`.edits.Edit`
  insertions, applies them and re-parses the result;
* :mod:`.markers` finds and strips kvpatch's earlier injections.

Nothing here touches the file system beyond the tree's own included headers that
libclang reads.
"""

from .edits import Edit, apply
from .markers import injections, unpatch
from .plan import Result, patch
from .sites import Site, Sites, find_sites

__all__ = ["Edit", "Result", "Site", "Sites", "apply", "find_sites", "injections", "patch", "unpatch"]
