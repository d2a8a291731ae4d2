"""kvpatch: stage memory in L2 ahead of use on Hopper GPUs.

The rooms, from the ground up (each imports only from rooms below it; ``tests/test_layout.py``
holds the order):

* ``errors``, ``dtypes``, ``arch``, ``fsutil``, ``templating``, ``progress``, ``abi``: the ground floor;
* :mod:`kvpatch.config` -- the patch configuration (model, user input, marker, kvpatch.toml, the
  shipped table); :mod:`kvpatch.source` -- releases, fetching, the tree and its state (I/O);
* :mod:`kvpatch.patch` -- the pure pipeline: header text -> sites -> edits -> patched text;
* :mod:`kvpatch.jit` -- the one JIT path: generated CUDA built into cached libraries, SASS checked;
* :mod:`kvpatch.gpu` -- measuring on a GPU (one timer, one flush, one environment reader);
  :mod:`kvpatch.prefetch` -- the L2 weight-prefetch runtime; :mod:`kvpatch.vllm_plugin` -- the
  patched kernels inside a stock vLLM wheel;
* :mod:`kvpatch.tune` -- choosing settings per kernel; :mod:`kvpatch.decode` -- the model-shaped
  decode step and its benchmarks;
* :mod:`kvpatch.commands` -- what each command does; :mod:`kvpatch.render` -- what it prints;
  :mod:`kvpatch.cli` -- the Typer shell.

Importing kvpatch does no I/O.
"""

__version__ = "0.1.0"
