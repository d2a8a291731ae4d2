"""How long the GPU commands measure by default (data only, no imports: the CLI reads these
for its option defaults and ``--help`` without loading the measuring modules)."""

#: ``kvpatch bench``: 50 timed launches per variant per round (more for short kernels),
#: 3 rounds, 5 untimed warm-up launches per variant before each round.
DEFAULT_REPS = 50
DEFAULT_ROUNDS = 3
DEFAULT_WARMUP = 5
#: ``kvpatch tune``: timed launches per tuning point, candidate and round (the tuning set
#: has 324 points), over DEFAULT_ROUNDS rounds.
TUNE_REPS = 20
#: ``kvpatch bench-decode``: layers per step (enough that per-layer time is stable, small
#: enough for 16k x 64) and interleaved rounds (its speedup interval is min..max over them).
DECODE_LAYERS = 8
DECODE_ROUNDS = 5
#: The most layers ``--layers`` may ask a step for: 128 (Llama-3.1-405B has 126); a typo, not a
#: wish, is what it catches.
MAX_DECODE_LAYERS = 128
#: The arch a GPU command builds for when ``--arch`` is not given (``build`` and ``plugin enable`` too).
DEFAULT_ARCH = "9.0a"
