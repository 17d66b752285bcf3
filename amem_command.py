"""The `amem` console command's entry point (pyproject.toml's [project.scripts]).

It sits outside the amem_alloc package on purpose. Importing amem_alloc.cli imports the package
first (its extension, numpy; a command then imports torch), which takes seconds on a loaded
machine, and a Ctrl-C in that window used to end in a KeyboardInterrupt traceback and exit status
-2. Here, as once a command runs (amem_alloc/cli/main.py), it is one line and status 130.
"""
import sys

INTERRUPTED = 130  # amem_alloc/cli/exit_status.py's; read from there it would import the package first


def interrupted_line(argv: list) -> str:
    """`amem predict: interrupted` (the command as typed, when it is a word), else `amem: interrupted`."""
    word = next((a for a in argv[1:2] if a.isalpha()), None)
    return f"amem {word}: interrupted" if word else "amem: interrupted"


def main() -> int:
    try:
        from amem_alloc.cli import main as run_command

        return run_command()
    except KeyboardInterrupt:  # before or between the command's own handling: start-up included
        print(interrupted_line(sys.argv), file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
