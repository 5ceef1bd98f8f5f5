"""The objectives study: each block drafter trained on each training objective, decoded, ranked in τ.

    python experiments/objectives.py --preset smoke                  # a few minutes on 2 CPU cores
    python experiments/objectives.py --preset default                # see docs/results.md for its run time
    python experiments/objectives.py --preset default --drafters domino,dspark --objectives kl,dpace,auf
    python experiments/objectives.py --preset default --step-cost    # ms per training step of each objective

Trains (or reuses from ./artifacts, $LIT_DOMINO_CACHE) the backbone, Domino, DSpark and DFlash 2 on their own loss
and on each objective of lit_domino/configs/studies/objectives.yaml (the registry: docs/objectives.md), decodes
the embedded eval prompts per domain (every row token-identical to the AR baseline), and writes the tables
(τ and speedup per domain, mean ± spread over seeds, the change against the drafter's own loss and the
published figure beside it), the per-position acceptance curves and the per-drafter recommendation to
results/objectives-<preset>/, and a study run with the trainings nested under it to MLflow (experiment
objectives-<preset>).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_domino.studies.objectives_command import main  # noqa: E402  (imports no torch: main parses first)

if __name__ == "__main__":
    main()
