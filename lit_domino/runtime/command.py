"""One convention for every command: parse first, then one library call; expected errors are one line.

A command's body raises :class:`UsageError` (or any error class that mixes it in: a config key that does
not exist, a drafter directory that is not one, a server that does not answer) for what the user can fix.
:func:`run_command` turns it into ``prog: error: <message>`` on stderr and exit status 2; an interrupt into
``prog: interrupted`` and 130 (the shell's code for SIGINT). ``--debug`` anywhere on the command line
restores the traceback. :class:`CommandParser` answers argument errors on one line too, and is meant to be
built before any heavy import (torch, lightning), so that a mistyped flag is answered in well under 2 s.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn


class UsageError(ValueError):
    """An error the user can fix from the command line: printed as one line, exit status 2."""


DEBUG_FLAG = "--debug"


class CommandParser(argparse.ArgumentParser):
    """``argparse`` whose errors are one line (``prog: error: ...``, rc 2) instead of usage + error."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_argument(DEBUG_FLAG, action="store_true", help="show tracebacks of expected errors")

    @classmethod
    def from_doc(cls, prog: str, doc: str) -> "CommandParser":
        """A command's parser: ``doc``'s first line its description, the rest its epilog, as written."""
        first, _, rest = doc.partition("\n")
        return cls(prog=prog, description=first, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def fail(self, message: str) -> NoReturn:
        """A validation error found after parsing (a path that does not exist, a shard out of range)."""
        self.exit(2, f"{self.prog}: error: {message}\n")

    def add_output_flags(self, out: str, experiment: str) -> None:
        """The measuring commands' output flags: ``--out`` (default ``out``), ``--experiment`` (the MLflow
        experiment, default ``experiment``), ``--no-mlflow`` and ``--no-progress``."""
        self.add_argument("--out", default=out, help=f"output directory (default: {out})")
        self.add_argument("--experiment", default=experiment, help=f"MLflow experiment (default: {experiment})")
        self.add_argument("--no-mlflow", action="store_true")
        self.add_argument("--no-progress", action="store_true")


def require_file(path: str | os.PathLike, what: str) -> None:
    """Raise :class:`UsageError` unless ``path`` exists (``what`` names it in the message)."""
    if not os.path.exists(path):
        raise UsageError(f"{what} {str(path)!r} does not exist")


def positive_int(item: str, flag: str, expected: str, at_least: str) -> int:
    """One item of a comma-separated flag as an integer >= 1: :class:`UsageError` ``"{flag}: expected {expected},
    got ..."`` for text, ``"{flag}: {at_least}, got n"`` below 1."""
    try:
        n = int(item)
    except ValueError:
        raise UsageError(f"{flag}: expected {expected}, got {item!r}") from None
    if n < 1:
        raise UsageError(f"{flag}: {at_least}, got {n}")
    return n


def run_command(prog: str, body: Callable[[list[str]], Any], argv: Sequence[str] | None = None) -> Any:
    """Run ``body(argv)`` as the command ``prog``: expected errors one line with rc 2, interrupts rc 130.

    Expected errors are :class:`UsageError` and its subclasses. Anything else is a bug and keeps its
    traceback. With ``--debug`` in ``argv`` expected errors and interrupts re-raise as well.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in argv
    try:
        return body(argv)
    except UsageError as err:
        if debug:
            raise
        message = str(err).strip().replace("\n", " ") or type(err).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt as err:
        if debug:
            raise
        detail = f": {err}" if str(err) else ""
        print(f"{prog}: interrupted{detail}", file=sys.stderr)
        raise SystemExit(130) from None
