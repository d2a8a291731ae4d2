"""GPU validation and benchmarking of built kernel libraries, one job per module.

* ``dispatch`` -- vLLM's v1/v2 rule and partition size
* ``inputs`` -- random inputs in vLLM's layouts (pools, block tables, fp8 bytes)
* ``reference`` -- the float64 reference attention, rel-L2, tolerances
* ``launch`` -- loading a library (``Kernels``, ``NAME=path.so:prefix``), buffers, launches
* ``timing`` -- event timing, interleaved rounds, the L2 flush, copy bandwidth
* ``env`` -- environment capture and per-round nvidia-smi sampling
* ``stats`` -- median, quantile, geomean, speedup intervals and verdicts
* ``points`` -- bench points and the named sets (tuning, headline, heldout)
* ``validate`` / ``bench`` -- the two measurements; ``report`` -- their result types
* ``upstream`` (+ ``upstream_shim``) -- vLLM's own kernel test against the libraries
* ``commands`` -- the bodies of ``kvpatch validate`` / ``bench`` / ``tune``
* ``plot`` -- a bench report as a PNG

torch, numpy and matplotlib are imported inside functions only, so this package
imports on a machine that has none of them.
"""

from __future__ import annotations
