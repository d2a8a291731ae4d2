"""The model-shaped decode step and its benchmarks (``kvpatch bench-decode``).

* :mod:`.models`: model shapes from the checkpoints' ``config.json``.
* :mod:`.step`: one decode step of such a model (random weights, paged caches).
* :mod:`.options`, :mod:`.windows`, :mod:`.arms`: the weight-prefetch configuration, its
  windows, and the arms a measurement compares.
* :mod:`.measure`, :mod:`.micro`, :mod:`.kernels`, :mod:`.bench`, :mod:`.stages`,
  :mod:`.sweep`, :mod:`.picks`, :mod:`.report`: measuring, the staged sweep, reporting.
* :mod:`.prepare`: the variants a GPU run carries and unpacking its prepared folder (the
  build itself: :mod:`kvpatch.commands.decode_libs`).
"""
