"""Optuna sweep over the Domino head (rank r, GRU size, λ schedule): launch, attach, resume, summarise.

    # a study of 20 finished trials on the default preset (objective: mean τ on validation prompts)
    python sweeps/domino.py run --study-name domino --n-trials 20
    # two more worker processes on the same study (or run the same command in another shell)
    python sweeps/domino.py run --study-name domino --n-trials 20 --workers 2
    # after a crash / kill: fail the dead workers' trials, retry them, finish the study
    python sweeps/domino.py run --study-name domino --n-trials 20 --resume
    # best trial, parameter importances, Optuna plots (PNG, also logged to the study's MLflow run)
    python sweeps/domino.py summary --study-name domino

Storage: ``sqlite:///sweeps/<study>.db`` by default; ``--storage journal:path.journal`` for an
Optuna journal file, or any RDB URL (``postgresql://...``). ``--n-trials`` is the study's total
of finished trials over all workers. Quick look on the smoke preset:
``--preset smoke --max-steps 20 --prompts-per-domain 2 --max-new-tokens 32``.
The library behind this file is the ``lit_domino.studies.sweep`` package; the search space is ``sweeps/space.yaml``.
DSpark's Markov rank (and head type): ``--space sweeps/dspark_space.yaml --study-name dspark``; DFlash 2's selector
(rank, candidates): ``--space sweeps/dflash2_space.yaml --study-name dflash2`` (any variant whose module takes the
space's keys sweeps the same way).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_domino.studies.sweep_command import main  # noqa: E402  (imports no torch: main parses first)

if __name__ == "__main__":
    sys.exit(main())
