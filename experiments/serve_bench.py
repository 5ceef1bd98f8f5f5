"""Serving throughput under concurrency: any OpenAI-compatible endpoint against one without speculation.

    # on a GPU box: the target with a drafter, and the target alone (see the README's serving section)
    python experiments/serve_bench.py --url http://localhost:8000 --baseline http://localhost:8001 \\
        --benchmarks gsm8k:64,humaneval:64 --concurrency 1,2,4,8,16,32 --max-tokens 512

    # on CPU, a local transformers serve of a model directory (no speculation; checks the pipeline)
    transformers serve DIR --device cpu --dtype float32 --port 8000 &
    python experiments/serve_bench.py --url http://localhost:8000 --benchmarks embedded-math:8 --concurrency 1,2

Reports per concurrency level output tokens/s and request latency (mean, p50, p90), and the speedup
over the baseline; writes results/serve_bench-<time>.md + .json and one MLflow run (experiment
`serve_bench`). An unreachable URL is an error before anything is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lit_domino.runtime.command import CommandParser, run_command  # noqa: E402 (light: no torch)

PROG = "serve_bench.py"


def parse_args(argv=None) -> argparse.Namespace:
    p = CommandParser(prog=PROG, description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="the (speculative) server, e.g. http://localhost:8000")
    p.add_argument("--model", default=None, help="its served model name (default: its first model)")
    p.add_argument("--baseline", default=None, help="the same target served without speculation")
    p.add_argument("--baseline-model", default=None, help="the baseline's served model name")
    p.add_argument("--benchmarks", default="embedded-math:32",
                   help="name[:n],... from lit_domino.data.benchmarks (default embedded-math:32)")
    p.add_argument("--concurrency", default="1,2,4,8,16,32", help="concurrency levels (default 1,2,4,8,16,32)")
    p.add_argument("--max-tokens", type=int, default=256, help="answer budget per request (default 256)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--chat-template-kwargs", default='{"enable_thinking": false}',
                   help="JSON for the server's chat template (default: Qwen3 thinking off, as the suite); '' = none")
    p.add_argument("--retries", type=int, default=3, help="retries per request, with backoff (default 3)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default 600)")
    p.add_argument("--warmup", type=int, default=1, help="requests per server before measuring (default 1)")
    p.add_argument("--seed", type=int, default=0, help="benchmark shuffle seed")
    p.add_argument("--out", default=str(ROOT / "results"), help="output directory (default results/)")
    p.add_argument("--experiment", default="serve_bench", help="MLflow experiment (default serve_bench)")
    p.add_argument("--no-mlflow", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    """Parse, check the options and that every URL answers, then measure; errors are one line."""
    return run_command(PROG, _run, argv)


def _run(argv: list[str]) -> list[dict]:
    from lit_domino.studies.serve_bench import run_serve_bench  # light; it checks everything before loading prompts

    return run_serve_bench(parse_args(argv))


if __name__ == "__main__":
    main()
