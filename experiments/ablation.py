"""The main job: train every drafter variant, decode for real, print the papers' tables.

    python experiments/ablation.py                      # the default preset (< 1 h on 2 CPU cores)
    python experiments/ablation.py --preset smoke       # CI-sized, a few minutes
    python experiments/ablation.py --preset paper       # Qwen/Qwen3-8B on a GPU box
    python experiments/ablation.py --variants backbone,domino --seeds 0,1,2

Everything is cached under ./artifacts ($LIT_DOMINO_CACHE): a rerun reuses what did not
change. Tables go to results/ablation-<preset>/, runs to MLflow (sqlite:///mlflow.db).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="default", help="smoke | default | paper (default: default)")
    parser.add_argument("--variants", default=None, help="comma-separated subset (default: all of the study)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: the preset's)")
    parser.add_argument("--out", default=None, help="output directory (default: results/ablation-<preset>)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (logs only)")
    args = parser.parse_args(argv)

    from lit_domino.ablation import run_ablation

    run_ablation(
        args.preset,
        variants=args.variants.split(",") if args.variants else None,
        seeds=[int(s) for s in args.seeds.split(",")] if args.seeds else None,
        out_dir=args.out,
        progress=not args.no_progress,
    )


if __name__ == "__main__":
    main()
