"""The command behind ``experiments/dloop.py``: parse and check everything (gates, grid, drafters), then run
:func:`lit_domino.studies.dloop.run_dloop_study`.

This module imports no torch (the study module does, with MLflow and Lightning): bad input is one line
``dloop.py: error: ...`` (rc 2) in well under a second.
"""

from __future__ import annotations

import argparse

from lit_domino.runtime.command import CommandParser, UsageError, run_command


COMMAND_DOC = """The DLoop study: loop-aware fine-tunes, the gate's threshold x depth grid and the DLoop table.

    python experiments/dloop.py --preset smoke                      # CI-sized, minutes on 2 CPU cores
    python experiments/dloop.py --preset smoke --thresholds -0.5,-1,-2 --stages 1,2,3
    python experiments/dloop.py --preset default                    # drafters from the ablation; time: docs/results.md
    python experiments/dloop.py --preset default --drafters backbone,domino --block-sizes 4

Trains (or reuses from ./artifacts, $LIT_DOMINO_CACHE) each base drafter and its loop-aware
fine-tunes, decodes the embedded eval prompts per domain with every DLoop gate each drafter can use
(the papers' sum log q, conf, cost, truncation; EAGLE-3 skips the predictor gates), sweeps the
decode block size for the gain-vs-acceptance figure, and writes Markdown + JSON + PNG to
results/dloop/ and runs to MLflow (experiment dloop-<preset>). Every row must be lossless.
"""
"""The command's description and epilog, and ``experiments/dloop.py``'s docstring (tests/test_entry_points.py)."""
PROG = "dloop.py"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = CommandParser.from_doc(PROG, COMMAND_DOC)
    parser.add_argument("--preset", default="smoke", help="smoke | default | paper (default: smoke)")
    parser.add_argument("--drafters", default=None,
                        help="comma-separated subset of backbone,domino,dspark,dflash2,eagle3 (default: all)")
    parser.add_argument("--thresholds", default=None, help="gate thresholds g <= 0 (default: -0.25,-0.5,-0.75,-1,-2)")
    parser.add_argument("--stages", default=None, help="stage caps N >= 1 (default: 1,2,3,4; 1 = no loop)")
    parser.add_argument("--table-dloop", default=None,
                        help="the DLoop table's gate [GATE@]THRESHOLD[:STAGES][+trunc@P], as bench.py's --dloop "
                             "(default -0.5:3; e.g. mean@-0.1:3, conf@0.5:3, cost:3; the predictor gates conf, "
                             "cost and +trunc need parallel drafters: their acceptance predictors are built and "
                             "cached first)")
    parser.add_argument("--block-sizes", default=None,
                        help="decode block sizes B of the gain-vs-acceptance sweep besides each drafter's trained one "
                             "(default: the preset's, study.yaml; e.g. 4; a B above a drafter's trained one is skipped)")
    parser.add_argument("--out", default=None, help="output directory (default: results/dloop)")
    parser.add_argument("--no-mlflow", action="store_true", help="no tables run in MLflow (training runs still log)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (logs only)")
    argv = list(argv)
    for i in range(len(argv) - 1):  # "--thresholds -0.5,-1" would read as an option: join it as "--thresholds=..."
        if argv[i] in ("--thresholds", "--table-dloop") and argv[i + 1].startswith("-"):
            argv[i:i + 2] = [f"{argv[i]}={argv[i + 1]}", ""]
    return parser.parse_args([a for a in argv if a != ""])


def main(argv=None):
    """Parse, plan (every check, before any training), run; bad input is one line ``dloop.py: error: ...``."""
    return run_command(PROG, _run, argv)


def _run(argv: list[str]):
    args = parse_args(argv)
    from lit_domino.training.configs import check_preset_flag  # light: before the study's torch imports

    check_preset_flag(args.preset)
    from lit_domino.decoding import DLoopConfig  # torch-free: a bad gate spec is answered before the study loads

    try:
        gate = DLoopConfig.parse(args.table_dloop) if args.table_dloop else None  # bench.py's --dloop parser too
    except ValueError as err:
        raise UsageError(str(err)) from None
    if args.table_dloop and gate is None:
        raise UsageError("the DLoop table needs a gate, not 'off'")
    from lit_domino.decoding.dloop import check_grid, check_table_gate, parse_list

    try:  # the grid and the table's gate, before the study (mlflow, torch) loads
        thresholds, stages = parse_list(args.thresholds, float), parse_list(args.stages, int)
        check_grid(thresholds or [-1.0], stages or [1])
        block_sizes = parse_list(args.block_sizes, int)
        if block_sizes is not None and any(b < 2 for b in block_sizes):
            raise ValueError(f"--block-sizes: each block size B must be >= 2 (B - 1 drafts), got {block_sizes}")
        if gate is not None:
            check_table_gate(gate.threshold, gate.max_stages, gate.gate, gate.truncate)
    except ValueError as err:
        raise UsageError(str(err)) from None
    from lit_domino.studies.dloop import run_dloop_study, study_plan, table_gate

    choice = dict(drafters=args.drafters.split(",") if args.drafters else None)
    if gate is not None:
        choice["table_dloop"] = table_gate(gate)
    try:  # what needs the study file (unknown drafters), before any training
        choice.update(thresholds=thresholds, stages=stages, block_sizes=block_sizes)
        study_plan(args.preset, **choice)
    except UsageError:
        raise
    except ValueError as err:
        raise UsageError(str(err)) from None
    return run_dloop_study(args.preset, **choice, out_dir=args.out, progress=not args.no_progress,
                           mlflow_enabled=not args.no_mlflow)
