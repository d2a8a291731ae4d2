"""kvpatch: stage memory in L2 ahead of use on Hopper GPUs.

* :mod:`kvpatch.patch` -- the pure pipeline that patches vLLM's PagedAttention header:
  ``parse`` (libclang) -> ``sites`` (the key/value loops) -> ``plan`` (templates rendered
  into byte-offset ``edits``, applied and re-parsed); ``markers`` finds earlier injections.
* :mod:`kvpatch.source` -- the I/O edge: releases, fetching (git, else the sdist), the tree.
* :mod:`kvpatch.build` -- nvcc builds of stock and patched kernels, SASS checks.
* :mod:`kvpatch.gpu` -- validation (bit-identity, vLLM's own test) and benchmarks on a GPU.
* :mod:`kvpatch.prefetch` -- the L2 weight-prefetch runtime and the decode-step benchmark.

``api`` composes them, ``render`` draws every table, ``cli`` is a thin Typer shell. Importing
kvpatch does no I/O.
"""

__version__ = "0.1.0"
