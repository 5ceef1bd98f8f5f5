"""Train one drafter variant: the suite's LightningCLI (``lit_domino.cli``) on the command line.

    python experiments/train.py fit --variant domino --preset smoke [--seed 1] [--set model.rank=16]
    python experiments/train.py fit --variant domino --preset smoke --ckpt_path last   # resume a killed run
    python experiments/train.py fit --variant domino --print_config                    # every resolved key
    python experiments/train.py fit --config results/train/<run>/config.yaml           # a saved, complete config

``--variant/--preset`` compose ``experiments/configs`` (base.yaml + the variant + the preset, see
``lit_domino.configs``); any LightningCLI flag after them (``--trainer.max_epochs 3``) still applies.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from lit_domino.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
