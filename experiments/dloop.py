"""The DLoop study: loop-aware fine-tunes, the gate's threshold x depth grid and the DLoop table.

    python experiments/dloop.py --preset smoke                      # CI-sized, minutes on 2 CPU cores
    python experiments/dloop.py --preset smoke --thresholds -0.5,-1,-2 --stages 1,2,3
    python experiments/dloop.py --preset default                    # drafters from the ablation; time: docs/results.md
    python experiments/dloop.py --preset default --drafters backbone,domino --block-sizes 4

Trains (or reuses from ./artifacts, $LIT_DOMINO_CACHE) each base drafter and its loop-aware
fine-tunes, decodes the embedded eval prompts per domain with every DLoop gate each drafter can use
(the papers' sum log q, conf, cost, truncation; EAGLE-3 skips the predictor gates), sweeps the
decode block size for the gain-vs-acceptance figure, and writes Markdown + JSON + PNG to
results/dloop/ and runs to MLflow (experiment dloop-<preset>). Every row must be lossless.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_domino.studies.dloop_command import main  # noqa: E402  (imports no torch: main parses first)

if __name__ == "__main__":
    main()
