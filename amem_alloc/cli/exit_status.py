"""The exit statuses of the `amem` commands, named once (the convention is cli/main.py's docstring)."""
OK = 0
FAILED = 1             # amem could not do it for a reason other than the input (no pluggable allocator, a device)
BAD_INPUT = 2          # a usage mistake or a bad file: argparse's mistakes and amem's (ValueError, UsageError, SnapshotError)
DATA_DEPENDENT = 3     # amem predict --strict: the code needs a fake tensor's value
NOT_MODELLED = 4       # amem predict: the run cannot be predicted (CUDA graphs, CUDA in a child process, amem failed in it)
DOES_NOT_FIT = 5       # amem predict --check: a policy predicted does not fit the card
TIMEOUT = 124          # amem predict: past --timeout, as timeout(1) says it
INTERRUPTED = 130      # Ctrl-C, as a shell says it (128 + SIGINT)
TERMINATED = 143       # SIGTERM under compare and predict, as a shell says it (128 + SIGTERM)
