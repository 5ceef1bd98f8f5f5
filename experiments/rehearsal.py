"""Rehearse the paper preset end to end on this machine (docs/paper-rehearsal.md).

    python experiments/rehearsal.py                          # the rehearsal preset on the CPU (a few minutes)
    python experiments/rehearsal.py --device cuda --set data.target=embedded:rehearsal-large   # a GPU, larger

Builds the Qwen3-8B-shaped target, regenerates the training data through a real transformers serve (two --shard
workers, then --merge), trains every paper variant under DDP (2 processes), runs the ablation (decode, tables,
MLflow), exports each drafter to its field format and decodes the re-imported copy against greedy decoding.
Writes report.json (every stage, with its settings read back from MLflow) to --out.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_domino.studies.rehearsal import main  # noqa: E402  (imports no torch: main parses first)

if __name__ == "__main__":
    main()
