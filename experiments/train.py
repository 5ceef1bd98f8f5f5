"""Train one drafter variant: the suite's LightningCLI (``lit_domino.training.cli``) on the command line.

    python experiments/train.py fit --variant domino --preset smoke [--seed 1] [--set model.head.rank=16]
    python experiments/train.py fit --variant domino --preset smoke --ckpt_path last   # resume a killed run
    python experiments/train.py fit --variant domino --print_config                    # every resolved key
    python experiments/train.py fit --config results/train/<run>/config.yaml           # a saved, complete config

``--variant/--preset`` compose ``experiments/configs`` (base.yaml + the variant + the preset, see
``lit_domino.training.configs``); any LightningCLI flag after them (``--trainer.max_epochs 3``) still applies.
``--set methods.<kind>.<key>=V`` sets the preset's per-method section. A mistyped variant, preset,
``--set`` section or target is one line (``train: error: ...``, rc 2) before torch is imported.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_domino.training.train import main  # noqa: E402  (imports no torch: main parses first)

if __name__ == "__main__":
    main()
