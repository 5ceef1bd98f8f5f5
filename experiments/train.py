"""Train one drafter variant: the suite's LightningCLI (``lit_domino.training.cli``) on the command line.

    python experiments/train.py fit --variant domino --preset smoke [--seed 1] [--set model.rank=16]
    python experiments/train.py fit --variant domino --preset smoke --ckpt_path last   # resume a killed run
    python experiments/train.py fit --variant domino --print_config                    # every resolved key
    python experiments/train.py fit --config results/train/<run>/config.yaml           # a saved, complete config

``--variant/--preset`` compose ``experiments/configs`` (base.yaml + the variant + the preset, see
``lit_domino.training.configs``); any LightningCLI flag after them (``--trainer.max_epochs 3``) still applies.
``--set methods.<kind>.<key>=V`` sets the preset's per-method section. A mistyped variant, preset,
``--set`` section or target is one line (``train: error: ...``, rc 2) before torch is imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from lit_domino.training.configs import check_train_arguments  # noqa: E402  (YAML only: answers before torch loads)
from lit_domino.runtime.command import run_command  # noqa: E402


def main(argv: list[str] | None = None, run: bool = True):
    """The cheap checks (variant, preset, ``--set`` sections, target), then ``lit_domino.training.cli.main``."""

    def train(args: list[str]):
        check_train_arguments(args)
        from lit_domino.training.cli import main as cli_main  # torch and Lightning: only once the cheap checks passed

        return cli_main(args, run=run)

    return run_command("train", train, argv)


if __name__ == "__main__":
    main()
