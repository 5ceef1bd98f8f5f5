"""Regenerate a preset's training data as its own step (before `train.py fit`), resumable and shardable.

    python experiments/regenerate.py --preset smoke                         # HF generate, here
    python experiments/regenerate.py --preset paper --server http://localhost:8000 --concurrency 64
    # N workers (processes, GPUs or machines on one shared cache), then one merge:
    CUDA_VISIBLE_DEVICES=0 python experiments/regenerate.py --preset paper --shard 0/8 &
    ...
    CUDA_VISIBLE_DEVICES=7 python experiments/regenerate.py --preset paper --shard 7/8 &
    wait; python experiments/regenerate.py --preset paper --merge
    python experiments/regenerate.py --preset default --ship               # rebuild the sets the package ships

The sets land in the artifact cache ($LIT_DOMINO_CACHE, default ./artifacts) under the keys that
training's prepare_data looks up (use the same --variant/--preset/--seed/--set as the training run).
Prompts are answered in chunks of `shard_size` prompts, each written atomically: a killed or failed
run keeps its finished chunks and a rerun continues from them. `--server` sends the prompts to any
OpenAI-compatible server (`vllm serve`, SGLang `launch_server`, `transformers serve`) serving the
target; `--server-extra '{"return_token_ids": true}'` makes vLLM return exact token ids.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_domino.training.regen_step import main  # noqa: E402  (imports no torch: main parses first)

if __name__ == "__main__":
    main()
