"""The command behind ``experiments/train.py``: the cheap checks of ``--variant/--preset/--set`` (YAML only), then
the suite's LightningCLI (:func:`lit_domino.training.cli.main`), so that a mistyped variant, preset, ``--set``
section or target is one line (``train: error: ...``, rc 2) before torch is imported.
"""

from __future__ import annotations

from lit_domino.runtime.command import run_command
from lit_domino.training.configs import check_train_arguments  # YAML only: answers before torch loads


def main(argv: list[str] | None = None, run: bool = True):
    """The cheap checks (variant, preset, ``--set`` sections, target), then ``lit_domino.training.cli.main``."""

    def train(args: list[str]):
        check_train_arguments(args)
        from lit_domino.training.cli import main as cli_main  # torch and Lightning: only once the cheap checks passed

        return cli_main(args, run=run)

    return run_command("train", train, argv)
