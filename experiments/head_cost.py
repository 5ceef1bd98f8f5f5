"""A sequential head's draft time over the backbone's as the drafter grows: Domino's and DSpark's Markov head
(random drafters of the papers' proportions).

    python experiments/head_cost.py                                     # d 128 .. 2048, a few minutes on a CPU
    python experiments/head_cost.py --sizes 4096:151936 --block-size 16 --rounds 10   # Qwen3-8B's shape
    python experiments/head_cost.py --heads dspark --sizes 4096:151936 --num-layers 5 --rounds 10  # DeepSpec's

Each size ``d:V`` builds a random target and drafters with r = d/16, d_s = d/4 (at least the embedded default's
64 and 128; :mod:`lit_domino.studies.head_cost`; DSpark's Markov rank is the same r, 256 at d = 4096) and
times steady-state draft rounds of the backbone, of Domino with each ``--pool-sizes`` pool and of DSpark, in
turns round by round. Writes ``results/head-cost-<time>.md`` + ``.json``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_domino.studies.head_cost import main  # noqa: E402  (imports no torch: main parses first)

if __name__ == "__main__":
    main()
