"""The one way kvpatch writes and reads files: atomically, through symlinks, never half-written,
and only regular files as inputs (:mod:`.files` says how).

The modules: :mod:`.files` (writing and reading), :mod:`.outputs` (outputs checked before any
work), :mod:`.locks` (locks between kvpatch processes), :mod:`.problems` (a full disk or a path
too long, said as what it is).
"""

from .files import (  # noqa: F401
    FIFO_WAIT,
    READ_LIMIT,
    STALE_AFTER,
    FileTooLargeError,
    NotRegularFileError,
    Staged,
    check_library_file,
    expand_home,
    file_digest,
    file_kind,
    is_temp_name,
    open_descriptor,
    parse_json,
    read_input,
    read_regular,
    read_regular_with_stat,
    remove_stale_temps,
    resolve_target,
    stage,
    stat_regular,
    write_atomic,
    write_both,
    write_if_different,
)
from .locks import LOCK_NOTE, hold_lock  # noqa: F401
from .outputs import check_outputs, check_stdout, output_problem, same_file  # noqa: F401
from .problems import DiskFullError, PathTooLongError, machine_problem, problem_in_text, shown_path  # noqa: F401
