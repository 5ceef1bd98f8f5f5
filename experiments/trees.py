"""The tree study: chain vs DDTree, path-conditioned and EAGLE-2 trees at each budget and cost-aware.

    python experiments/trees.py --preset smoke                      # a minute or two with the drafters cached
    python experiments/trees.py --preset default                    # drafters cached; run time: docs/results.md
    python experiments/trees.py --preset smoke --drafters domino,eagle3 --builders path --budgets 16,32

Reuses (or trains) the ablation's base drafters from ./artifacts ($LIT_DOMINO_CACHE), measures the target's
verify-cost curve C_v(n), decodes the embedded eval prompts per domain with the AR baseline, every drafter's
chain and every tree builder it has at each budget and cost-aware, interleaved in one benchmark (every row
token-identical to AR at T = 0, or the study fails), and writes the tables, the sibling-rank statistic, the curve,
a GPU projection and a figure to results/trees/ and MLflow (experiment trees-<preset>).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_domino.studies.trees_command import main  # noqa: E402  (imports no torch: main parses first)

if __name__ == "__main__":
    main()
