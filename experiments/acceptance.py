"""Acceptance predictors: a calibrated confidence head for every parallel drafter, with its calibration table.

    python experiments/acceptance.py --preset smoke
    python experiments/acceptance.py --preset default --drafters backbone,domino,dspark,dflash2 --label hard

Reuses (or trains) each base drafter from ./artifacts ($LIT_DOMINO_CACHE), trains the add-on head on the frozen
drafter (DSpark: its own head, and the add-on one for comparison; Domino: on its GRU state too), calibrates it
per position on held-out regenerated rounds, and writes the AUC / ECE table and reliability diagrams to
results/acceptance/ and MLflow (experiment acceptance-<preset>). The predictors are cached as their own
artifacts (acceptance/), keyed by the drafter, and used by the DLoop gates conf@P, cost and +trunc@P (and by
experiments/bench.py --acceptance NAME=DIR).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_domino.studies.acceptance_command import main  # noqa: E402  (imports no torch: main parses first)

if __name__ == "__main__":
    main()
