"""Regenerate a preset's training data as its own step (before `train.py fit`), resumable and shardable.

    python experiments/regenerate.py --preset smoke                         # HF generate, here
    python experiments/regenerate.py --preset paper --server http://localhost:8000 --concurrency 64
    # N workers (processes, GPUs or machines on one shared cache), then one merge:
    CUDA_VISIBLE_DEVICES=0 python experiments/regenerate.py --preset paper --shard 0/8 &
    ...
    CUDA_VISIBLE_DEVICES=7 python experiments/regenerate.py --preset paper --shard 7/8 &
    wait; python experiments/regenerate.py --preset paper --merge

The sets land in the artifact cache ($LIT_DOMINO_CACHE, default ./artifacts) under the keys that
training's prepare_data looks up (use the same --variant/--preset/--seed/--set as the training run).
Prompts are answered in chunks of `shard_size` prompts, each written atomically: a killed or failed
run keeps its finished chunks and a rerun continues from them. `--server` sends the prompts to any
OpenAI-compatible server (`vllm serve`, SGLang `launch_server`, `transformers serve`) serving the
target; `--server-extra '{"return_token_ids": true}'` makes vLLM return exact token ids.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lit_domino.runtime.command import CommandParser, run_command  # noqa: E402 (light: no torch)

PROG = "regenerate.py"


def parse_args(argv=None) -> argparse.Namespace:
    from lit_domino.training.configs import PRESETS, parse_override  # light: yaml only

    p = CommandParser(prog=PROG, description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", default="domino", help="the training variant whose data config to use (default domino)")
    p.add_argument("--preset", default="default", choices=PRESETS)
    p.add_argument("--seed", type=int, default=0, help="seed_everything of the training run (matters at T > 0)")
    p.add_argument("--set", action="append", type=parse_override, default=[], metavar="KEY=VALUE",
                   help="config override as in train.py (e.g. data.max_new_tokens=512); repeatable")
    p.add_argument("--splits", default="train,eval", help="train,eval (default both)")
    p.add_argument("--server", default=None, help="OpenAI-compatible server URL (default: HF generate here)")
    p.add_argument("--server-model", default=None, help="served model name (default: the server's first model)")
    p.add_argument("--server-extra", default=None, help="JSON object of extra request fields for every request")
    p.add_argument("--concurrency", type=int, default=16, help="conversations in flight on the server (default 16)")
    p.add_argument("--retries", type=int, default=5, help="retries per request, with backoff (default 5)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default 600)")
    p.add_argument("--shard", default=None, metavar="i/N", help="answer only chunk k with k %% N == i")
    p.add_argument("--merge", action="store_true", help="only concatenate the finished chunks (after --shard workers)")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    """Parse, check the options (shards, splits, the server answering, chunks present for a merge), then
    regenerate; bad input is one line ``regenerate.py: error: ...``."""
    return run_command(PROG, _run, argv)


def _run(argv: list[str]) -> dict:
    from lit_domino.training.regen_step import run_regenerate  # light; torch loads after its checks

    out = run_regenerate(parse_args(argv))
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
