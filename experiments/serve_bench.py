"""Serving throughput under concurrency: any OpenAI-compatible endpoint against one without speculation.

    # on a GPU box: the target with a drafter, and the target alone (see docs/serving.md)
    python experiments/serve_bench.py --url http://localhost:8000 --baseline http://localhost:8001 \\
        --benchmarks gsm8k:64,humaneval:64 --concurrency 1,2,4,8,16,32 --max-tokens 512

    # on CPU, a local transformers serve of a model directory (no speculation; checks the pipeline)
    transformers serve DIR --device cpu --dtype float32 --port 8000 &
    python experiments/serve_bench.py --url http://localhost:8000 --benchmarks embedded-math:8 --concurrency 1,2

Reports per concurrency level output tokens/s and request latency (mean, p50, p90), and the speedup
over the baseline; writes results/serve_bench-<time>.md + .json and one MLflow run (experiment
`serve_bench`). An unreachable URL is an error before anything is written.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_domino.studies.serve_bench import main  # noqa: E402  (imports no torch: main parses first)

if __name__ == "__main__":
    main()
