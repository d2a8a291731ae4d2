"""The launcher ABI: the C interface between a built kernel library and the runtime.

``kvpatch.jit`` renders launchers that return :data:`ABI_VERSION` from
``<prefix>_abi_version()``; ``kvpatch.gpu.launch`` refuses a library with another.
Bump it whenever templates/build/launcher.cu.j2's exported functions change.
"""

ABI_VERSION = 1
