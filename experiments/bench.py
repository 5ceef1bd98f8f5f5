"""Benchmark speculative decoding: tau, speedup vs our AR baseline and vs HF generate, peers.

    python experiments/bench.py --target embedded:default \\
        --drafters domino=artifacts/drafters/domino-xxxx,dflash=artifacts/drafters/backbone-xxxx \\
        --benchmarks embedded-math:20,embedded-code:20 --temperatures 0 --dloop off,-0.5:3 \\
        --max-new-tokens 256 --peers prompt_lookup,assisted,dflash --assistant small

The Domino head's K sweep (correction, pick and q on the top-K base candidates): ``--pool-sizes full,16,64,256``
(rows ``domino+pool(K)``; compare ``tau`` and ``draft_ms_per_round`` with the ``full`` row, ``--threads 1``).

Writes ``results/bench-<time>.md`` + ``.json`` and one MLflow run (experiment ``bench``;
``$MLFLOW_TRACKING_URI`` or ``sqlite:///<project>/mlflow.db``). Everything runs in one
process on the same prompts (see :func:`lit_domino.decoding.benchmark`; the command itself is
:func:`lit_domino.studies.bench.run_bench`).

Smoke options (no trained artifacts): ``--target random`` (a random 8-layer, 192-wide,
4096-vocabulary Qwen3), ``--drafters NAME=random:KIND`` (a randomly initialised drafter),
``--benchmarks random:N`` (N random token prompts).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_domino.studies.bench import main  # noqa: E402  (imports no torch: main parses first)

if __name__ == "__main__":
    main()
