"""Export a trained drafter to a field format: DFlash (backbone), SpecForge Domino, speculators EAGLE-3 / DSpark / DFlash 2.

    python experiments/export.py RUN_OR_DRAFTER_DIR OUT_DIR --format dflash|specforge-domino|eagle3|dspark|dflash2 \\
        [--target embedded:default]

RUN_OR_DRAFTER_DIR is a drafter directory (``save_pretrained``: config.json + model.safetensors) or a
training run directory holding one under ``drafter/``. ``--target`` (a model directory, hub id or
``embedded:<preset>``) binds the drafter first, so the export records the target's name and refuses a
target the drafter was not trained for; without it the drafter's recorded fingerprint is written.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_domino.interop.export import main  # noqa: E402  (imports no torch: main parses first)

if __name__ == "__main__":
    main()
