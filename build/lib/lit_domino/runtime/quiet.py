"""Lightning's chatter kept off the console during the suite's own trainings, and in a log file instead.

A job that trains many drafters prints its own stage lines; each internal Trainer would otherwise add its
banners ("GPU available: ...", "TPU available: ..."), tips ("💡 Tip: ... litmodels/litlogger") and warnings
(LightningCLI's "not recommended to provide both args and command line arguments" with the whole config,
"Checkpoint directory ... exists and is not empty" on a resume, library deprecations). Inside
:func:`quiet_lightning` the Lightning loggers' records and every warning go to ``log_file`` (the training's
artifact folder keeps it) instead. ``LIT_DOMINO_VERBOSE=1`` (the commands' ``--verbose``) leaves the console
as Lightning has it; errors are never hidden (they are raised, not logged).
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

VERBOSE_ENV = "LIT_DOMINO_VERBOSE"
"""Set to ``1`` for Lightning's own output on the console (inherited by worker processes)."""
LOGGERS = ("lightning.pytorch", "lightning.fabric", "lightning_utilities", "lightning")
"""The loggers whose records :func:`quiet_lightning` moves to the log file."""


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def set_verbose(on: bool) -> None:
    """What ``--verbose`` does: this process and the workers it starts print Lightning's own output."""
    if on:
        os.environ[VERBOSE_ENV] = "1"


@contextlib.contextmanager
def quiet_lightning(log_file: str | Path | None = None) -> Iterator[None]:
    """Route Lightning's log records and every warning raised inside the block to ``log_file`` (appended;
    dropped when None); nothing changes when :func:`verbose`."""
    if verbose():
        yield
        return
    path = Path(log_file) if log_file is not None else None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    else:
        handler = logging.NullHandler()
    saved = []
    for name in LOGGERS:
        log = logging.getLogger(name)
        saved.append((log, log.level, log.propagate, list(log.handlers)))
        log.handlers, log.propagate = [handler], False
        log.setLevel(logging.INFO)

    def show(message, category, filename, lineno, file=None, line=None):
        if path is not None:
            with open(path, "a", encoding="utf-8") as f:
                f.write(warnings.formatwarning(message, category, filename, lineno, line))

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")  # each warning once per place, all of them in the file
            warnings.showwarning = show
            yield
    finally:
        for log, level, propagate, handlers in saved:
            log.handlers, log.propagate = handlers, propagate
            log.setLevel(level)
        handler.close()
