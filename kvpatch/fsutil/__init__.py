"""The one way kvpatch writes and reads files: atomically, through symlinks, never half-written,
and only regular files as inputs.

The modules: :mod:`.files` (writing), :mod:`.reading` (reading what kvpatch is given), :mod:`.outputs`
(outputs checked before any work), :mod:`.locks` (locks between kvpatch processes), :mod:`.problems`
(a full disk or a path too long, said as what it is).
"""

from .files import (  # noqa: F401
    FIFO_WAIT,
    STALE_AFTER,
    STOPPING,
    Staged,
    deferred_signals,
    is_temp_name,
    note_stop,
    open_descriptor,
    remove_stale_temps,
    resolve_target,
    stage,
    stop_noted,
    write_atomic,
    write_both,
    write_if_different,
    write_own,
)
from .locks import LOCK_NOTE, hold_lock  # noqa: F401
from .outputs import check_output, check_output_folder, check_outputs, output_problem, same_file, stdout_file  # noqa: F401
from .problems import DiskFullError, PathTooLongError, machine_problem, problem_in_text, shown_path  # noqa: F401
from .reading import (  # noqa: F401
    READ_LIMIT,
    FileTooLargeError,
    NotRegularFileError,
    check_library_file,
    expand_home,
    file_digest,
    file_kind,
    folder_spelling,
    open_regular,
    parse_json,
    read_input,
    read_regular,
    read_regular_with_stat,
    read_text_input,
    stat_regular,
)
