"""What each command does: the only layer that composes the others.

Every command is a module with an options dataclass and ``run(opts, *, progress) -> report``
(:mod:`kvpatch.progress` is the one progress convention); the CLI parses options into the
dataclass, calls ``run`` and renders the report (:mod:`kvpatch.render`). Tests call ``run``.

* patching: :mod:`.apply`, :mod:`.sites`, :mod:`.diff`, :mod:`.revert`, :mod:`.show_config`;
  the tree they work on: :mod:`.tree`;
* building: :mod:`.build`;
* measuring (GPU): :mod:`.validate`, :mod:`.bench`, :mod:`.tune`, :mod:`.decode`; what they
  share: :mod:`.common`;
* what a decode-step GPU run carries, built into one folder: :mod:`.decode_libs`;
* the defaults and choices the CLI's options name: :mod:`.choices`.
"""
