"""The command behind ``sweeps/domino.py``: parse and check (no Optuna, torch or Lightning yet), then launch,
attach, resume or summarise a sweep through :mod:`lit_domino.studies.sweep`.

This module sits beside the package, not inside it: importing the package imports Optuna, Lightning and torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from lit_domino.runtime.command import CommandParser, UsageError, run_command
from lit_domino.runtime.paths import project_root
from lit_domino.training.configs import check_preset_flag, parse_override  # light: yaml only

COMMAND_DOC = """Optuna sweep over the Domino head (rank r, GRU size, λ schedule): launch, attach, resume, summarise.

    # a study of 20 finished trials on the default preset (objective: mean τ on validation prompts)
    python sweeps/domino.py run --study-name domino --n-trials 20
    # two more worker processes on the same study (or run the same command in another shell)
    python sweeps/domino.py run --study-name domino --n-trials 20 --workers 2
    # after a crash / kill: fail the dead workers' trials, retry them, finish the study
    python sweeps/domino.py run --study-name domino --n-trials 20 --resume
    # best trial, parameter importances, Optuna plots (PNG, also logged to the study's MLflow run)
    python sweeps/domino.py summary --study-name domino

Storage: ``sqlite:///sweeps/<study>.db`` by default; ``--storage journal:path.journal`` for an
Optuna journal file, or any RDB URL (``postgresql://...``). ``--n-trials`` is the study's total
of finished trials over all workers. Quick look on the smoke preset:
``--preset smoke --max-steps 20 --prompts-per-domain 2 --max-new-tokens 32``.
The library behind this file is the ``lit_domino.studies.sweep`` package; the search space is ``sweeps/space.yaml``.
DSpark's Markov rank (and head type): ``--space sweeps/dspark_space.yaml --study-name dspark``; DFlash 2's selector
(rank, candidates): ``--space sweeps/dflash2_space.yaml --study-name dflash2`` (any variant whose module takes the
space's keys sweeps the same way).
"""
"""The command's description, and ``sweeps/domino.py``'s docstring (tests/test_entry_points.py)."""
PROG = "sweeps/domino.py"
# lit_domino.studies.sweep imports Optuna, Lightning and torch (seconds): it loads after parsing, and
# its defaults are shown by --help only (they are filled in from SweepSettings after parsing otherwise)
SWEEPS_DIR = project_root() / "sweeps"
SPACE_FILE = SWEEPS_DIR / "space.yaml"
SCRIPT = SWEEPS_DIR / "domino.py"
"""The command's file: spawned workers run it (as the launcher was, from a checkout)."""


def _interval(text: str):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a step count or a fraction, got {text!r}") from None


class _Defaults:
    """SweepSettings' defaults for the help text; None for every field when the parser is built to parse."""

    def __init__(self, settings=None):
        self.settings = settings

    def __getattr__(self, name):
        return None if self.settings is None else getattr(self.settings, name)


def build_parser(with_defaults: bool = False) -> argparse.ArgumentParser:
    """The command's parser; ``with_defaults`` (for --help) imports :mod:`lit_domino.studies.sweep` to show its defaults,
    without it the settings' options default to None (= SweepSettings' default, see :func:`settings_from`)."""
    objectives = None
    if with_defaults:
        from lit_domino.studies import sweep

        d, objectives = _Defaults(sweep.SweepSettings()), sweep.OBJECTIVES
    else:
        d = _Defaults()
    parser = CommandParser(prog=PROG, description=COMMAND_DOC.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("--study-name", default="domino", help="Optuna study (and MLflow experiment sweep-<name>)")
        p.add_argument("--storage", default=None,
                       help="Optuna storage: sqlite:///path.db, journal:path.journal or an RDB URL "
                            "(default sqlite:///<project>/sweeps/<study>.db)")

    run = sub.add_parser("run", help="launch or attach worker(s) to a study")
    common(run)
    run.add_argument("--space", default=str(SPACE_FILE), help="search space YAML (default %(default)s)")
    run.add_argument("--n-trials", type=int, default=d.n_trials,
                     help="finished trials the study should hold, all workers together (default %(default)s)")
    run.add_argument("--objective", choices=objectives, default=d.objective,
                     help="mean over domains of tau (papers' τ) or speedup vs our AR baseline (default %(default)s)")
    run.add_argument("--preset", default=d.preset, help="smoke | default | paper (default %(default)s)")
    run.add_argument("--seed", type=int, default=d.seed, help="training seed of every trial")
    run.add_argument("--workers", type=int, default=1, help="worker processes to spawn on this study (>= 1)")
    run.add_argument("--resume", action="store_true",
                     help="continue after a crash: fail trials of dead workers (Optuna heartbeat; without one, "
                          "every RUNNING trial), retry failed trials once")
    run.add_argument("--max-steps", type=int, default=None, help="optimizer steps per trial (default: preset epochs)")
    run.add_argument("--val-check-interval", type=_interval, default=None,
                     help="validate/report val/tau_sim every N steps (int) or fraction of an epoch (float)")
    run.add_argument("--prompts", default=d.prompts, help="validation benchmarks, name[:n],... (default %(default)s)")
    run.add_argument("--prompts-per-domain", type=int, default=d.prompts_per_domain,
                     help="last N prompts of each benchmark are decoded (default %(default)s)")
    run.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="per prompt (default %(default)s)")
    run.add_argument("--temperature", type=float, default=d.temperature, help="decoding temperature (default 0)")
    run.add_argument("--set", dest="overrides", type=parse_override, action="append", default=[], metavar="KEY=VALUE",
                     help="fixed config override for every trial, e.g. --set data.batch_size=8 (repeatable)")
    run.add_argument("--pruner", choices=("median", "none"), default=d.pruner, help="pruning on val/tau_sim")
    run.add_argument("--n-startup-trials", type=int, default=d.n_startup_trials,
                     help="trials before pruning and TPE start (default %(default)s)")
    run.add_argument("--n-warmup-steps", type=int, default=d.n_warmup_steps,
                     help="reports of a trial before it may be pruned (default %(default)s)")
    run.add_argument("--sampler-seed", type=int, default=None, help="TPE seed (worker i uses seed + i)")
    run.add_argument("--heartbeat", type=int, default=d.heartbeat,
                     help="Optuna RDB heartbeat seconds (a trial whose worker stopped beating fails after 2 "
                          "beats and is retried); 0 = off (default %(default)s)")
    run.add_argument("--max-retries", type=int, default=d.max_retries, help="retries of a crashed trial")
    run.add_argument("--evaluator", default=None, help="advanced: module:function evaluating a trial "
                                                      "(default: train_variant + real decoding)")
    run.add_argument("--experiment", default=None, help="MLflow experiment (default sweep-<study>)")
    run.add_argument("--threads", type=int, default=None, help="torch threads per worker (default: cores / workers)")
    run.add_argument("--progress", action="store_true", help="training/decoding progress bars")
    run.add_argument("--summary", action="store_true", help="print the summary (and write plots) at the end")
    run.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)

    summ = sub.add_parser("summary", help="best trial, importances, Optuna plots (PNG, logged to MLflow)")
    common(summ)
    summ.add_argument("--out", default=None, help="plot directory (default results/sweeps/<study>)")
    summ.add_argument("--no-mlflow", action="store_true", help="do not log the plots to MLflow")
    return parser


SETTINGS_OPTIONS = ("study_name", "storage", "objective", "preset", "seed", "max_steps", "val_check_interval",
                    "prompts", "prompts_per_domain", "max_new_tokens", "temperature", "n_trials", "pruner",
                    "n_startup_trials", "n_warmup_steps", "sampler_seed", "heartbeat", "max_retries", "evaluator",
                    "experiment", "progress")
"""The options that are :class:`~lit_domino.studies.sweep.SweepSettings` fields of the same name (None = its default)."""


def settings_from(args):
    """The worker's :class:`~lit_domino.studies.sweep.SweepSettings` (options left unset keep the dataclass defaults)."""
    from lit_domino.studies import sweep

    threads = args.threads
    if threads is None and args.workers > 1:
        threads = max(1, (os.cpu_count() or 1) // args.workers)
    given = {k: getattr(args, k) for k in SETTINGS_OPTIONS if getattr(args, k) is not None}
    return sweep.SweepSettings(**given, overrides=dict(args.overrides), threads=threads)


def worker_argv(args, settings, index: int) -> list[str]:
    """The command line of spawned worker ``index`` (no --resume: the launcher already recovered)."""
    s = settings
    argv = [sys.executable, str(SCRIPT), "run", "--study-name", s.study_name,
            "--space", args.space, "--n-trials", str(s.n_trials), "--objective", s.objective,
            "--preset", s.preset, "--seed", str(s.seed), "--prompts", s.prompts,
            "--prompts-per-domain", str(s.prompts_per_domain), "--max-new-tokens", str(s.max_new_tokens),
            "--temperature", str(s.temperature), "--pruner", s.pruner,
            "--n-startup-trials", str(s.n_startup_trials), "--n-warmup-steps", str(s.n_warmup_steps),
            "--heartbeat", str(s.heartbeat), "--max-retries", str(s.max_retries),
            "--worker-index", str(index)]
    optional = {"--storage": settings.storage_url(), "--max-steps": s.max_steps,
                "--val-check-interval": s.val_check_interval, "--evaluator": s.evaluator,
                "--experiment": s.experiment, "--threads": settings.threads,
                "--sampler-seed": None if s.sampler_seed is None else s.sampler_seed + index}
    for flag, value in optional.items():
        if value is not None:
            argv += [flag, str(value)]
    for key, value in args.overrides:
        argv += ["--set", f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"]
    if args.progress:
        argv.append("--progress")
    return argv


def check_args(args) -> None:
    """The checks that need no sweep import (Optuna, torch): answered in well under a second."""
    if args.command != "run":
        return
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    for flag in ("n_trials", "prompts_per_domain", "max_new_tokens", "max_steps"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    if args.preset is not None:
        check_preset_flag(args.preset)
    if not Path(args.space).expanduser().is_file():
        raise UsageError(f"--space {args.space!r} does not exist")


def main(argv: list[str] | None = None) -> int:
    """The exit code: 0, 1 (a worker failed), 2 (bad input: one line ``sweeps/domino.py: error: ...``), 130."""
    os.environ.setdefault("MPLBACKEND", "Agg")  # plots are written to files, never shown
    try:
        return run_command(PROG, _run, argv)
    except SystemExit as done:  # run_command's and the parser's one-line errors: returned, as the workers' codes
        return done.code if isinstance(done.code, int) else 2


def _run(argv: list[str]) -> int:
    help_asked = any(a in ("-h", "--help") for a in argv)
    args = build_parser(with_defaults=help_asked).parse_args(argv)
    check_args(args)
    from lit_domino.studies import sweep

    try:
        if args.command == "summary":
            study = sweep.load_existing_study(args.study_name, args.storage)
            sweep.summarize(study, args.out, log_to_mlflow=not args.no_mlflow)
            return 0
        settings = settings_from(args).check()
        space = sweep.load_space(args.space)
        return sweep.run_sweep(settings, space, workers=args.workers, resume=args.resume,
                               worker_command=lambda i: worker_argv(args, settings, i),
                               summary=args.summary and args.worker_index is None)
    except KeyboardInterrupt:
        raise KeyboardInterrupt("resume with the same command plus --resume") from None
