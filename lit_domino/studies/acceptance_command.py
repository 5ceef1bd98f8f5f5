"""The command behind ``experiments/acceptance.py``: parse, check the flags, build the study's plan
(:func:`lit_domino.studies.acceptance_plan.study_plan`: every check, before any model loads), then run it
(:func:`lit_domino.studies.acceptance.run_acceptance_study`).

This module imports no torch (the plan and the study modules do): a bad flag is one line
``acceptance.py: error: ...`` (rc 2) in well under a second, a bad plan one line before any model loads.
"""

from __future__ import annotations

import argparse

from lit_domino.runtime.command import CommandParser, UsageError, run_command


COMMAND_DOC = """Acceptance predictors: a calibrated confidence head for every parallel drafter, with its calibration table.

    python experiments/acceptance.py --preset smoke
    python experiments/acceptance.py --preset default --drafters backbone,domino,dspark,dflash2 --label hard

Reuses (or trains) each base drafter from ./artifacts ($LIT_DOMINO_CACHE), trains the add-on head on the frozen
drafter (DSpark: its own head, and the add-on one for comparison; Domino: on its GRU state too), calibrates it
per position on held-out regenerated rounds, and writes the AUC / ECE table and reliability diagrams to
results/acceptance/ and MLflow (experiment acceptance-<preset>). The predictors are cached as their own
artifacts (acceptance/), keyed by the drafter, and used by the DLoop gates conf@P, cost and +trunc@P (and by
experiments/bench.py --acceptance NAME=DIR).
"""
"""The command's description and epilog, and ``experiments/acceptance.py``'s docstring (tests/test_entry_points.py)."""
PROG = "acceptance.py"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = CommandParser.from_doc(PROG, COMMAND_DOC)
    parser.add_argument("--preset", default="smoke", help="smoke | default | paper (default: smoke)")
    parser.add_argument("--drafters", default=None,
                        help="comma-separated parallel drafters (default: the study file's, "
                             "backbone,domino,dspark,dflash2)")
    parser.add_argument("--label", default=None, choices=["soft", "hard"],
                        help="training label (default: hard, as the rounds are drafted greedily)")
    parser.add_argument("--out", default=None, help="output directory (default: results/acceptance)")
    parser.add_argument("--no-mlflow", action="store_true", help="no MLflow run for the tables")
    return parser.parse_args(list(argv))


def main(argv=None):
    return run_command(PROG, _run, argv)


def _run(argv: list[str]):
    args = parse_args(argv)
    from lit_domino.training.configs import available_variants, check_preset_flag

    check_preset_flag(args.preset)
    drafters = None
    if args.drafters is not None:
        drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
        unknown = [d for d in drafters if d not in available_variants()]
        if not drafters or unknown:
            raise UsageError(f"--drafters: unknown {unknown or 'none given'}; choose from {available_variants()}")
    from lit_domino.studies.acceptance_plan import study_plan

    plan = study_plan(args.preset, drafters, label=args.label)  # a ConfigError: one line, before any model loads
    from lit_domino.studies.acceptance import run_acceptance_study

    return run_acceptance_study(plan, out_dir=args.out, mlflow_enabled=not args.no_mlflow)
