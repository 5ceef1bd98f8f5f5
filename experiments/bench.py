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

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lit_domino.runtime.command import CommandParser, run_command  # noqa: E402 (light: no torch)

PROG = "bench.py"


def parse_args(argv=None) -> argparse.Namespace:
    p = CommandParser(prog=PROG, description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="embedded:default",
                   help="model directory, hub id, embedded:<preset>, or 'random' (default: embedded:default)")
    p.add_argument("--drafters", default="", help="name=path[,name=path...]; path may be random:<kind>")
    p.add_argument("--benchmarks", default="embedded-math:20",
                   help="name[:n],... from lit_domino.data.benchmarks, or random:N (default: embedded-math:20)")
    p.add_argument("--temperatures", default="0", help="comma-separated temperatures (default: 0)")
    p.add_argument("--dloop", default="off", help="comma-separated DLoop settings: off, [GATE@]THRESHOLD[:STAGES] (sum, mean, scaled, "
                   "last), conf@P[:STAGES], cost[:STAGES], trunc@P, each optionally +trunc@P; conf, cost and "
                   "trunc need a drafter with an acceptance predictor (DSpark's own head, or one attached: "
                   "experiments/acceptance.py)")
    p.add_argument("--block-size", type=int, default=None, help="block size (default: each drafter's own)")
    p.add_argument("--pool-sizes", default="full",
                   help="Domino candidate pools K to run, comma-separated: full (the whole vocabulary, the exact "
                        "head) or integers 1..V, e.g. full,16,64,256 for the K sweep (default: full)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--peers", default="",
                   help="comma-separated peers: prompt_lookup,assisted (HF) and dflash (z-lab's dflash_generate on "
                        "each backbone drafter; needs requirements-peers.txt)")
    p.add_argument("--assistant", default=None,
                   help="for the assisted peer: the name of a small_lm drafter in --drafters, or an HF model dir")
    p.add_argument("--prompt-lookup-tokens", type=int, default=10)
    p.add_argument("--no-hf-baseline", action="store_true", help="skip HF generate (no speedup_vs_hf_generate)")
    p.add_argument("--repeats", type=int, default=1,
                   help="decodes per prompt and method, the method order reversed on every other one; times are "
                        "their mean (default: 1; 2 for a comparison of close loops, e.g. ours vs dflash_generate)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--static-cache", action="store_true",
                   help="the target's KV cache as a transformers StaticCache and the parallel drafters' static K/V "
                        "buffers (the fixed-shape path --compile compiles, run eagerly; same tokens)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile of the target's forward over a StaticCache (the AR baseline and every "
                        "drafter alike) and of the parallel drafters' fixed-shape block forward and Domino's rollout (CUDA graphs on "
                        "cuda, inductor's C++ kernels on cpu; compiled in an untimed "
                        "warm-up over every prompt)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--out", default=str(ROOT / "results"), help="output directory (default: results/)")
    p.add_argument("--experiment", default="bench", help="MLflow experiment (default: bench)")
    p.add_argument("--no-mlflow", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    """Parse, check the options (no torch yet), then benchmark; bad input is one line ``bench.py: error: ...``."""
    return run_command(PROG, _run, argv)


def _run(argv: list[str]) -> list[dict]:
    from lit_domino.studies.bench import check_options, run_bench  # light; run_bench imports torch after its checks

    args = parse_args(argv)
    check_options(vars(args))
    return run_bench(args)


if __name__ == "__main__":
    main()
