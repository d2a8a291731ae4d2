"""L2 weight prefetch on a side stream: the runtime behind docs/weight-prefetch.md.

At fixed points of a decode step a small kernel on a side stream pulls the byte ranges
of the weights the next kernels read into L2 while a kernel that leaves HBM partly
idle (attention) runs, so the next GEMM starts warm::

    from kvpatch.prefetch import PrefetchController, weight_ranges
    ctl = PrefetchController(device, priority="high")
    ctl.add("attn->oproj", layer, [o_proj.weight, gate_up.weight], cap_bytes=32 << 20)
    ctl.fork("attn->oproj", layer)   # after the work the prefetch may overlap
    attention(...)                   # the side stream prefetches meanwhile
    ctl.join()                       # the current stream waits for the side stream

* :mod:`.ranges`: ``weight_ranges`` (pure arithmetic, no torch) and the int64 table.
* :mod:`.kernel`: the prefetch kernel (``templates/prefetch/l2_prefetch.cu.j2``),
  built by nvcc into a cached shared library, SASS checked, loaded with ctypes.
* :mod:`.controller`: ``PrefetchController``.
* :mod:`.tail`: the in-kernel form's table (a patched attention library's ``weight_tail``).

The model-shaped decode step that measures it is :mod:`kvpatch.decode`.

Importing this package does no I/O and imports no torch.
"""

from __future__ import annotations

from .controller import PrefetchController
from .ranges import weight_ranges

__all__ = ["PrefetchController", "weight_ranges"]
