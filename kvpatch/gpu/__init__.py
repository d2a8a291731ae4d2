"""GPU validation and benchmarking of built kernel libraries.

``harness`` holds what both use (input generation, the float64 reference
attention, vLLM's v1/v2 dispatch rule, launch helpers); ``validate`` checks every
variant bit-identical to stock and stock against the reference; ``bench`` times
the variants side by side; ``plot`` draws a bench report.

The libraries are :class:`kvpatch.gpu.launch.Kernels` objects, one per variant. torch,
numpy and matplotlib are imported inside functions only, so this package imports
on a machine that has none of them.
"""

from __future__ import annotations

__all__ = ["harness", "validate", "bench", "plot"]
