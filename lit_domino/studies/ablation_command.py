"""``experiments/ablation.py``'s parser (:func:`lit_domino.studies.ablation.main` runs it): its arguments and
their types, one-line errors; building it imports nothing heavy."""

from __future__ import annotations

import argparse

from lit_domino.runtime.command import CommandParser
from lit_domino.training.configs import parse_override


def seed_list(text: str) -> list[int]:
    """``"0,1"`` → ``[0, 1]``: the argparse type of ``--seeds`` (an error at parse time names the bad item)."""
    seeds = []
    for item in (s.strip() for s in text.split(",")):
        if not item.isdigit():
            raise argparse.ArgumentTypeError(f"seeds are integers >= 0 separated by commas, got {item!r} in {text!r}")
        seeds.append(int(item))
    return seeds


def jobs_arg(text: str) -> int | str:
    """``--jobs``: ``auto`` or an integer >= 1."""
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--jobs is 'auto' or an integer >= 1, got {text!r}")
    return int(text)


def build_parser() -> CommandParser:
    """``experiments/ablation.py``'s arguments (one-line errors; building it imports nothing heavy)."""
    parser = CommandParser(prog="ablation", description="Train every drafter variant, decode for real, "
                           "print the papers' tables (cached under ./artifacts, runs in MLflow).")
    parser.add_argument("--preset", default="default", help="smoke | default | paper (default: default)")
    parser.add_argument("--variants", default=None, help="comma-separated subset (default: all of the study)")
    parser.add_argument("--seeds", default=None, type=seed_list, help="comma-separated seeds >= 0 (default: the preset's)")
    parser.add_argument("--out", default=None, help="output directory (default: results/ablation-<preset>, with the "
                        "subset appended for --variants/--seeds/--set runs)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (stage logs only)")
    parser.add_argument("--verbose", action="store_true",
                        help="Lightning's own output of every training (banners, tips, warnings) on the console; "
                             "by default it goes to each training's train.log in its artifact folder")
    parser.add_argument("--set", type=parse_override, action="append", default=[], metavar="KEY=VALUE",
                        help="override a training config key, VALUE in YAML, e.g. "
                             "--set 'data.train_examples={math: 4000, code: 1000, chat: 1000}' (repeatable); a model "
                             "key (model.head.rank) reaches the variants whose module takes it, methods.<kind>.<key> "
                             "(methods.domino.head.rank=16) the preset's section of that drafter method")
    parser.add_argument("--train-only", action="store_true",
                        help="train (or find cached) every drafter, then stop; rerun without it to decode and tabulate")
    parser.add_argument("--jobs", default="auto", type=jobs_arg,
                        help="trainings at once, in worker processes (default auto: 2 on a CPU machine with 2+ "
                             "cores, 1 with accelerators)")
    return parser
