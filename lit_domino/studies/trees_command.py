"""The command behind ``experiments/trees.py``: parse and check everything (builders, budgets, drafters), then run
:func:`lit_domino.studies.trees.run_trees_study`.

This module imports no torch (the study module does, with MLflow and Lightning): bad input is one line
``trees.py: error: ...`` (rc 2) in well under a second for the flags, before any training for the drafters.
"""

from __future__ import annotations

import argparse

from lit_domino.runtime.command import CommandParser, UsageError, positive_int, run_command


COMMAND_DOC = """The tree study: chain vs DDTree, path-conditioned and EAGLE-2 trees at each budget and cost-aware.

    python experiments/trees.py --preset smoke                      # a minute or two with the drafters cached
    python experiments/trees.py --preset default                    # drafters cached; run time: docs/results.md
    python experiments/trees.py --preset smoke --drafters domino,eagle3 --builders path --budgets 16,32

Reuses (or trains) the ablation's base drafters from ./artifacts ($LIT_DOMINO_CACHE), measures the target's
verify-cost curve C_v(n), decodes the embedded eval prompts per domain with the AR baseline, every drafter's
chain and every tree builder it has at each budget and cost-aware, interleaved in one benchmark (every row
token-identical to AR at T = 0, or the study fails), and writes the tables, the sibling-rank statistic, the curve,
a GPU projection and a figure to results/trees/ and MLflow (experiment trees-<preset>).
"""
"""The command's description and epilog, and ``experiments/trees.py``'s docstring (tests/test_entry_points.py)."""
PROG = "trees.py"
BUILDERS = ("ddtree", "path", "eagle")
"""The tree builders the study compares with the chain (:data:`lit_domino.studies.trees.TREE_BUILDERS`)."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = CommandParser.from_doc(PROG, COMMAND_DOC)
    parser.add_argument("--preset", default="smoke", help="smoke | default | paper (default: smoke)")
    parser.add_argument("--drafters", default=None,
                        help="comma-separated subset of backbone,domino,dspark,dflash2,eagle3 (default: all)")
    parser.add_argument("--builders", default=None, help=f"comma-separated subset of {','.join(BUILDERS)} "
                                                         "(default: all; each drafter decodes those it has)")
    parser.add_argument("--budgets", default=None, help="tree budgets, nodes per round >= 1 (default: 16,32,64)")
    parser.add_argument("--top-k", type=int, default=None, help="children considered per node (default: 4)")
    parser.add_argument("--out", default=None, help="output directory (default: results/trees)")
    parser.add_argument("--no-mlflow", action="store_true", help="no tables run in MLflow (training runs still log)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (logs only)")
    return parser.parse_args(list(argv))


def split(spec: str | None) -> list[str] | None:
    return None if spec is None else [s.strip() for s in spec.split(",") if s.strip()]


def parse_budgets(spec: str | None) -> list[int] | None:
    """``16,32,64`` → ``[16, 32, 64]``; each an integer >= 1 (UsageError naming ``--budgets``)."""
    if spec is None:
        return None
    out = [positive_int(item, "--budgets", "integers (tree nodes per round)",
                        "a tree budget is at least 1 node per round") for item in split(spec)]
    if not out:
        raise UsageError("--budgets is empty")
    return out


def main(argv=None):
    """Parse, plan (every check, before any training), run; bad input is one line ``trees.py: error: ...``."""
    return run_command(PROG, _run, argv)


def _run(argv: list[str]):
    args = parse_args(argv)
    from lit_domino.training.configs import check_preset_flag  # light: before the study's torch imports

    check_preset_flag(args.preset)
    builders = split(args.builders)
    if builders is not None:
        bad = [b for b in builders if b not in BUILDERS]
        if bad or not builders:
            raise UsageError(f"--builders: unknown {bad or 'none given'}; choose from {', '.join(BUILDERS)} (the "
                             "chain, tree off, is always decoded)")
    budgets = parse_budgets(args.budgets)
    if args.top_k is not None and args.top_k < 1:
        raise UsageError(f"--top-k: children per node is at least 1, got {args.top_k}")
    from lit_domino.studies.trees import run_trees_study, study_plan

    choice = dict(drafters=split(args.drafters), builders=builders, budgets=budgets, top_k=args.top_k)
    try:  # what needs the study file and the drafters' classes (unknown drafters), before any training
        study_plan(args.preset, **choice)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return run_trees_study(args.preset, **choice, out_dir=args.out, progress=not args.no_progress,
                           mlflow_enabled=not args.no_mlflow)
