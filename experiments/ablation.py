"""The main job: train every drafter variant, decode for real, print the papers' tables.

    python experiments/ablation.py                      # the default preset (~18-26 min on 2 CPU cores, first run)
    python experiments/ablation.py --preset smoke       # CI-sized, a few minutes
    python experiments/ablation.py --preset paper       # Qwen/Qwen3-8B on a GPU box
    python experiments/ablation.py --variants backbone,domino --seeds 0,1,2
    python experiments/ablation.py --variants domino --set "data.train_examples={math: 4000}" --out results/more-data
    python experiments/ablation.py --preset smoke --set methods.domino.head.rank=16   # the preset's Domino section

Everything is cached under ./artifacts ($LIT_DOMINO_CACHE): a rerun reuses what did not
change. Tables go to results/ablation-<preset>/, runs to MLflow (sqlite:///mlflow.db).
The study itself (variants, seeds, evaluation prompts) is experiments/configs/studies/ablation.yaml.
Arguments are checked before torch is imported: a mistyped preset, variant or target is one line
(``ablation: error: ...``, rc 2) in well under 2 s.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_domino.studies.ablation import main  # noqa: E402  (imports no torch: main parses first)

if __name__ == "__main__":
    main()
