"""Optuna sweep over the Domino head (rank r, GRU size, λ schedule): launch, attach, resume, summarise.

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
The library behind this file is the ``lit_domino.sweep`` package; the search space is ``sweeps/space.yaml``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("MPLBACKEND", "Agg")  # plots are written to files, never shown

import yaml  # noqa: E402

from lit_domino import sweep  # noqa: E402
from lit_domino.experiment import parse_override  # noqa: E402


def _interval(text: str):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a step count or a fraction, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sweeps/domino.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("--study-name", default="domino", help="Optuna study (and MLflow experiment sweep-<name>)")
        p.add_argument("--storage", default=None,
                       help="Optuna storage: sqlite:///path.db, journal:path.journal or an RDB URL "
                            "(default sqlite:///<project>/sweeps/<study>.db)")

    run = sub.add_parser("run", help="launch or attach worker(s) to a study")
    common(run)
    d = sweep.SweepSettings()
    run.add_argument("--space", default=str(sweep.DEFAULT_SPACE_FILE), help="search space YAML (default %(default)s)")
    run.add_argument("--n-trials", type=int, default=d.n_trials,
                     help="finished trials the study should hold, all workers together (default %(default)s)")
    run.add_argument("--objective", choices=sweep.OBJECTIVES, default=d.objective,
                     help="mean over domains of tau (papers' τ) or speedup vs our AR baseline (default %(default)s)")
    run.add_argument("--preset", default=d.preset, help="smoke | default | paper (default %(default)s)")
    run.add_argument("--seed", type=int, default=d.seed, help="training seed of every trial")
    run.add_argument("--workers", type=int, default=1, help="worker processes to spawn on this study")
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
    run.add_argument("--pruner", choices=("median", "none"), default="median", help="pruning on val/tau_sim")
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


def settings_from(args) -> sweep.SweepSettings:
    threads = args.threads
    if threads is None and args.workers > 1:
        threads = max(1, (os.cpu_count() or 1) // args.workers)
    return sweep.SweepSettings(
        study_name=args.study_name, storage=args.storage, objective=args.objective, preset=args.preset,
        seed=args.seed, overrides=dict(args.overrides), max_steps=args.max_steps,
        val_check_interval=args.val_check_interval, prompts=args.prompts,
        prompts_per_domain=args.prompts_per_domain, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, n_trials=args.n_trials, pruner=args.pruner,
        n_startup_trials=args.n_startup_trials, n_warmup_steps=args.n_warmup_steps,
        sampler_seed=args.sampler_seed, heartbeat=args.heartbeat, max_retries=args.max_retries,
        evaluator=args.evaluator, experiment=args.experiment, threads=threads, progress=args.progress,
    )


def worker_argv(args, settings: sweep.SweepSettings, index: int) -> list[str]:
    """The command line of spawned worker ``index`` (no --resume: the launcher already recovered)."""
    argv = [sys.executable, str(Path(__file__).resolve()), "run", "--study-name", args.study_name,
            "--space", args.space, "--n-trials", str(args.n_trials), "--objective", args.objective,
            "--preset", args.preset, "--seed", str(args.seed), "--prompts", args.prompts,
            "--prompts-per-domain", str(args.prompts_per_domain), "--max-new-tokens", str(args.max_new_tokens),
            "--temperature", str(args.temperature), "--pruner", args.pruner,
            "--n-startup-trials", str(args.n_startup_trials), "--n-warmup-steps", str(args.n_warmup_steps),
            "--heartbeat", str(args.heartbeat), "--max-retries", str(args.max_retries),
            "--worker-index", str(index)]
    optional = {"--storage": settings.storage_url(), "--max-steps": args.max_steps,
                "--val-check-interval": args.val_check_interval, "--evaluator": args.evaluator,
                "--experiment": args.experiment, "--threads": settings.threads,
                "--sampler-seed": None if args.sampler_seed is None else args.sampler_seed + index}
    for flag, value in optional.items():
        if value is not None:
            argv += [flag, str(value)]
    for key, value in args.overrides:
        argv += ["--set", f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"]
    if args.progress:
        argv.append("--progress")
    return argv


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "summary":
            study = sweep.load_existing_study(args.study_name, args.storage)
            sweep.summarize(study, args.out, log_to_mlflow=not args.no_mlflow)
            return 0
        if args.workers < 1:
            raise sweep.SweepError(f"--workers must be >= 1, got {args.workers}")
        settings = settings_from(args).check()
        space = sweep.load_space(args.space)
        return sweep.run_sweep(settings, space, workers=args.workers, resume=args.resume,
                               worker_command=lambda i: worker_argv(args, settings, i),
                               summary=args.summary and args.worker_index is None)
    except sweep.SweepError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; resume with the same command plus --resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
