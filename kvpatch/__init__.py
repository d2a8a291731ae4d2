"""kvpatch: patch vLLM's PagedAttention decode kernel with an L2 bulk prefetch.

The pipeline, each step a pure function in its own module:
``parse`` (libclang) -> ``sites`` (where the key/value loops are) -> ``edits``
(templates rendered into byte-offset insertions, applied and re-validated).
``fetch`` and ``workspace`` are the I/O edges; ``api`` composes them; ``cli`` is
a thin shell over ``api``.
"""

__version__ = "0.1.0"
