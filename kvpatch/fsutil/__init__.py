"""The one way kvpatch writes files: atomically, through symlinks, never half-written.

``write_atomic`` writes a temporary file beside the *resolved* target and renames it
over the target, so a symlinked file is updated where it really lives (the link stays
a link) and a reader never sees a partial file; on any failure the old file is left as
it was and the temporary file is removed. A path that names a device, pipe or socket
(``/dev/stdout``, ``/dev/null``) is written in place: there is nothing to replace, and
renaming over it would clobber the device node; a FIFO nobody reads fails after
:data:`FIFO_WAIT` seconds instead of blocking forever. :func:`read_regular` reads an
input only if it is a regular file (a FIFO, socket or device could block or never end). ``write_if_different`` skips the write
when the content is already there (build inputs keep their mtimes).

The modules: :mod:`.files` (writing and reading), :mod:`.outputs` (outputs checked before any
work), :mod:`.locks` (locks between kvpatch processes).
"""

from .files import FIFO_WAIT, FileTooLargeError, NotRegularFileError, READ_LIMIT, STALE_AFTER, Staged, file_kind, is_temp_name, open_descriptor, read_input, read_regular, read_regular_with_stat, remove_stale_temps, resolve_target, stage, write_atomic, write_both, write_if_different  # noqa: F401
from .outputs import check_outputs, output_problem, same_file  # noqa: F401
from .locks import LOCK_NOTE, hold_lock  # noqa: F401
