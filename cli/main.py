"""The `sketchwalk` command line: one subcommand per module, registered here.

Each command module exposes `register(subparsers)`, which adds its parser and sets `func`
(args -> exit code). Errors a user can fix surface as one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Idle OpenMP workers must sleep, not spin: with spinning workers on a busy 2-core machine every
# small parallel torch op waits for a scheduler tick (~8 ms), which dominates sparse attention.
# It only takes effect if set before torch is imported, hence here, at the entry point.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes as one line and exit 2, like every other error (not the usage block)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {terminal_safe(message)} (see {self.prog} --help)\n")


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
    args = parser.parse_args(argv)
    keep_freed_memory()  # layer after layer reuses freed pages (sketchwalk/allocator.py)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at exit, where no handler runs
        return code
    except BrokenPipeError:  # `sketchwalk runs | head -1`: the reader is gone, nothing to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit must not fail again
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by it
    except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM during a run (exit 128 + signal)
        print(f"sketchwalk: {terminal_safe(str(exc)) or 'interrupted'}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 130))
    except SketchWalkError as exc:
        print(f"sketchwalk: error: {terminal_safe(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
