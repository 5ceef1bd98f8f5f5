"""The command behind ``experiments/objectives.py``: parse and check (preset, drafters, objectives), then run
:func:`lit_domino.studies.objectives.run_objectives_study`, or measure each objective's cost per training step
(:func:`lit_domino.studies.objectives_cost.step_costs`).

This module imports no torch (the study modules do, with MLflow and Lightning): bad input is one line
``objectives.py: error: ...`` (rc 2) in well under a second.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lit_domino.runtime.command import CommandParser, run_command
from lit_domino.studies.ablation import jobs_arg, seed_list
from lit_domino.training.configs import parse_override

COMMAND_DOC = """The objectives study: each block drafter trained on each training objective, decoded, ranked in τ.

    python experiments/objectives.py --preset smoke                  # a few minutes on 2 CPU cores
    python experiments/objectives.py --preset default                # see docs/results.md for its run time
    python experiments/objectives.py --preset default --drafters domino,dspark --objectives kl,dpace,auf
    python experiments/objectives.py --preset default --step-cost    # ms per training step of each objective

Trains (or reuses from ./artifacts, $LIT_DOMINO_CACHE) the backbone, Domino, DSpark and DFlash 2 on their own loss
and on each objective of lit_domino/configs/studies/objectives.yaml (the registry: docs/objectives.md), decodes
the embedded eval prompts per domain (every row token-identical to the AR baseline), and writes the tables
(τ and speedup per domain, mean ± spread over seeds, the change against the drafter's own loss and the
published figure beside it), the per-position acceptance curves and the per-drafter recommendation to
results/objectives-<preset>/, and a study run with the trainings nested under it to MLflow (experiment
objectives-<preset>).
"""
"""The command's description and epilog, and ``experiments/objectives.py``'s docstring (tests/test_entry_points.py)."""
PROG = "objectives.py"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = CommandParser.from_doc(PROG, COMMAND_DOC)
    parser.add_argument("--preset", default="smoke", help="smoke | default (default: smoke)")
    parser.add_argument("--drafters", default=None, help="comma-separated subset of backbone,domino,dspark,dflash2 "
                        "(default: all)")
    parser.add_argument("--objectives", default=None, help="comma-separated rows of the study file (default: the "
                        "preset's; own, the drafter's own loss, is always in)")
    parser.add_argument("--seeds", default=None, type=seed_list, help="comma-separated seeds (default: the preset's)")
    parser.add_argument("--set", type=parse_override, action="append", default=[], metavar="KEY=VALUE",
                        help="a training config key for every training, VALUE in YAML (e.g. trainer.max_epochs=1; "
                             "repeatable; new cache keys: pair it with --out)")
    parser.add_argument("--out", default=None, help="output directory (default: results/objectives-<preset>)")
    parser.add_argument("--jobs", default="auto", type=jobs_arg, help="trainings at once in worker processes "
                        "(default auto: 2 on a CPU machine with 2+ cores)")
    parser.add_argument("--no-mlflow", action="store_true", help="no study run in MLflow (training runs still log)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (logs only)")
    parser.add_argument("--step-cost", action="store_true", help="instead of the study: ms per training step of "
                        "every drafter x objective (interleaved, one thread, the preset's shapes)")
    parser.add_argument("--repeats", default=5, type=int, help="--step-cost: timed steps of each (default 5)")
    return parser.parse_args(argv)


def _names(text: str | None) -> list[str] | None:
    return [x.strip() for x in text.split(",") if x.strip()] if text else None


def main(argv=None):
    """Parse and check (before any training), then run; bad input is one line ``objectives.py: error: ...``."""
    return run_command(PROG, _run, argv)


def _run(argv: list[str]):
    args = parse_args(argv)
    from lit_domino.studies.objectives import check_names  # YAML only: before the study's torch imports

    drafters, objectives = _names(args.drafters), _names(args.objectives)
    check_names(args.preset, drafters, objectives)
    if args.step_cost:
        from lit_domino.runtime.jsonio import write_json
        from lit_domino.studies.objectives import default_out_dir
        from lit_domino.studies.objectives_cost import cost_table, step_costs

        costs = step_costs(args.preset, drafters, objectives, repeats=args.repeats)
        print(cost_table(costs))
        out = default_out_dir(args.preset) if args.out is None else Path(args.out)
        write_json(costs, out / "step-cost.json")
        return costs
    from lit_domino.studies.objectives import check_plan, run_objectives_study

    overrides = dict(args.set)
    check_plan(args.preset, drafters, objectives, args.seeds, overrides)  # every training config parsed: one line
    return run_objectives_study(args.preset, drafters, objectives, args.seeds, out_dir=args.out,
                                progress=not args.no_progress, mlflow_enabled=not args.no_mlflow, jobs=args.jobs,
                                overrides=overrides)
