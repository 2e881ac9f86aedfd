"""The `sketchwalk` command line: one subcommand per module, registered here.

Each command module exposes `register(subparsers)`, which adds its parser and sets `func`
(args -> exit code). Errors a user can fix surface as one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys

from sketchwalk.openmp import short_spin_waits

# How idle OpenMP workers wait takes effect only if set before torch is imported, hence here, at
# the entry point (sketchwalk/openmp.py says why a short spin)
os.environ.update(short_spin_waits(os.environ))

from sketchwalk.allocator import keep_freed_memory
from sketchwalk.errors import SketchWalkError
from sketchwalk.text import terminal_safe

COMMAND_MODULES = (
    "sketchwalk.cli.run",
    "sketchwalk.cli.store",
    "sketchwalk.cli.bench",
    "sketchwalk.cli.eval",
    "sketchwalk.cli.frontier",
    "sketchwalk.cli.calibrate",
    "sketchwalk.cli.app",
    "sketchwalk.cli.worker",
    "sketchwalk.cli.trace",
)


MAX_MESSAGE = 300  # characters of a usage error


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes as one line and exit 2, like every other error (not the usage block)."""

    def error(self, message: str):  # type: ignore[override]
        message = terminal_safe(message)  # argparse quotes a bad choice whole: cut it short
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 1] + "…"
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


class UsageError(Exception):
    """A flag the parser refused (its line is ready to print); main() returns 2 for it, so a
    caller of main() sees the same exit code for every refusal."""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="sketchwalk", description="Sketch&Walk sparse attention: run, store, explore."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # command not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    keep_freed_memory()  # layer after layer reuses freed pages (sketchwalk/allocator.py)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at exit, where no handler runs
        return code
    except BrokenPipeError:  # `sketchwalk runs | head -1`: the reader is gone, nothing to say
        _drop_stdout()
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by it
    except OSError as exc:
        if exc.errno not in OUTPUT_FULL:
            raise
        # stdout on a full disk (or /dev/full): whatever the command stored is stored
        _drop_stdout()
        print(f"sketchwalk: error: cannot write the output: {exc.strerror}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM during a run (exit 128 + signal)
        print(f"sketchwalk: {terminal_safe(str(exc)) or 'interrupted'}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 130))
    except SketchWalkError as exc:
        print(f"sketchwalk: error: {terminal_safe(str(exc))}", file=sys.stderr)
        return 2


OUTPUT_FULL = frozenset((errno.ENOSPC, errno.EDQUOT, errno.EFBIG))
"""Write errors of a full device; the store translates its own (store/db.py), so one of these
reaching main comes from printing the output."""


def _drop_stdout() -> None:
    """Point stdout at /dev/null, dropping what is buffered: Python's flush at exit must not
    fail again (a second message or a traceback)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout closed or not a file: nothing left to flush into
        pass


if __name__ == "__main__":
    sys.exit(main())
