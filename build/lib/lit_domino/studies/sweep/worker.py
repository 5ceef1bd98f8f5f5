"""Running a study: one worker (:func:`run_worker`), several worker processes (:func:`launch_workers`),
the stop condition, and the recovery of a crashed sweep (:func:`recover_study`).

``n_trials`` is the study's total of finished (COMPLETE + PRUNED) trials, shared by all workers:
a worker stops starting trials once finished + RUNNING trials cover it. The check and the next
trial's start are not one transaction, so workers that finish trials at the same moment may each
start one more: a study can end with up to ``workers - 1`` trials over the target (as with
Optuna's own ``MaxTrialsCallback``); none is lost, the summary counts them all.

Crash handling is Optuna's heartbeat (RDB storages, ``heartbeat`` > 0, see
:func:`lit_domino.studies.sweep.storage.open_storage`): every RUNNING trial beats every ``heartbeat`` s;
one whose beats stopped for 2 intervals (its worker died, on any host) is failed by
``optuna.storages.fail_stale_trials`` and its parameters re-enqueued once by
``RetryHeartbeatStaleTrialCallback`` — by ``--resume``, and by any live worker before its next
trial. A retried configuration retrains from its last checkpoint (``train_variant``'s cache).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from typing import Callable, Sequence

import optuna
import torch
from optuna.storages import fail_stale_trials
from optuna.trial import FrozenTrial, TrialState

from lit_domino.training.cli import DrafterCLI, check_config, cli_args
from lit_domino.studies.sweep.objective import make_objective, trial_config, validation_prompts
from lit_domino.studies.sweep.settings import SweepSettings
from lit_domino.studies.sweep.space import SearchSpace, SweepError
from lit_domino.studies.sweep.storage import (create_or_load_study, finished_trials, has_heartbeat, load_existing_study,
                                      quiet_experimental, redact, retried_trials, retry_callback, retry_history,
                                      trial_counts)
from lit_domino.studies.sweep.summary import summarize
from lit_domino.studies.sweep.tracking import ensure_study_run, finish_study_run, mark_run_failed, mlflow_client, set_run_status


def target_covered(study: optuna.Study, n_trials: int) -> bool:
    """Finished + RUNNING trials reach ``n_trials``: no new trial should start."""
    c = trial_counts(study)
    return c["COMPLETE"] + c["PRUNED"] + c["RUNNING"] >= n_trials


def stop_when_done(settings: SweepSettings, parent: str, client) -> Callable[[optuna.Study, FrozenTrial], None]:
    """The ``study.optimize`` callback: log the best value to the study run, stop once the target is covered."""

    def callback(study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.state == TrialState.COMPLETE:
            try:
                client.log_metric(parent, "best_value", study.best_value, step=trial.number)
            except Exception:
                pass
        if target_covered(study, settings.n_trials):
            study.stop()

    return callback


def _running(study: optuna.Study) -> list[int]:
    return [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]


def recover_study(study: optuna.Study, settings: SweepSettings, echo: Callable[[str], None] = print, *,
                  wait: bool = True) -> dict:
    """After a crash: fail the trials of dead workers, mark their MLflow runs FAILED, retry failed trials once.

    Dead workers are told by Optuna's heartbeat: ``optuna.storages.fail_stale_trials`` fails each
    RUNNING trial whose last heartbeat is older than the grace period (2 intervals) and the storage's
    ``RetryHeartbeatStaleTrialCallback`` re-enqueues its parameters. A worker that died moments ago
    still looks alive for up to one grace period, so with ``wait`` this polls until each RUNNING
    trial is failed or has outlived the grace period (then its worker is alive).
    Without a heartbeat (a journal storage, or ``heartbeat=0``) a worker's liveness is unknown:
    every RUNNING trial is taken for a dead worker's (``study.tell(..., state=FAIL)``).
    Trials failed otherwise (an exception in the trial) are re-enqueued through the same callback.
    Each original trial is retried at most ``max_retries`` times.

    Returns ``{"failed": [numbers], "retried": [numbers]}`` (this call's).
    """
    running = _running(study)
    grace = 2 * settings.heartbeat
    if running and has_heartbeat(settings.storage_url(), settings.heartbeat):
        # a trial dead now is stale within grace + 1 s (SQLite/MySQL store heartbeats in whole seconds)
        deadline = time.monotonic() + (grace + 1.25 if wait else 0.0)
        if wait:
            echo(f"resume: checking the heartbeats of RUNNING trials {running} (a dead worker's trial is failed "
                 f"{grace}s after its last heartbeat; waiting at most {grace + 2}s)")
        while True:
            with quiet_experimental():
                fail_stale_trials(study)
            left = time.monotonic() - deadline
            if not set(running) & set(_running(study)) or left >= 0:
                break
            time.sleep(min(1.0, -left))
    elif running:
        echo(f"resume: this storage records no heartbeat (journal, or --heartbeat 0): trials {running} are taken "
             "for trials of dead workers")
        for number in running:
            study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
    failed = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)) if t.number in running]
    retried_before = retried_trials(study)  # fail_stale_trials has already retried the stale ones
    retried = [n for n in failed if n in retried_before]
    client, _ = mlflow_client()
    retry = retry_callback(settings.max_retries)
    for t in study.get_trials(deepcopy=True, states=(TrialState.FAIL,)):
        mark_run_failed(client, t.user_attrs.get("mlflow_run_id"))
        if t.number in retried_before or len(retry_history(t)) >= settings.max_retries:
            continue
        with quiet_experimental():
            retry(study, t)
        retried.append(t.number)
    others = _running(study)
    if failed:
        echo(f"resume: trials {failed} were RUNNING on dead workers; marked FAIL")
    if retried:
        echo(f"resume: re-enqueued the parameters of failed trials {sorted(retried)} (they resume from their last "
             "checkpoint)")
    if others:
        echo(f"resume: trials {others} are still RUNNING on live workers (their heartbeat is fresh)")
    return {"failed": failed, "retried": sorted(retried)}


def _first_values(space: SearchSpace) -> dict:
    out = {}
    for p in space.params:
        if p.type == "categorical":
            out[p.name] = p.choices[0]
        elif p.type == "int":
            out[p.name] = int(p.low)
        else:
            out[p.name] = float(p.low)
    return out


def check_trial_config(settings: SweepSettings, space: SearchSpace) -> dict:
    """The first trial's training config, parsed by the training parser before any trial runs: a mistyped
    target key in the space (``model.rnak``) is a :class:`~lit_domino.training.cli.ConfigError` naming it."""
    cfg = trial_config(settings, space, _first_values(space))
    check_config(cfg)
    return cfg


def prepare_shared_artifacts(settings: SweepSettings, space: SearchSpace) -> None:
    """Build the target, the regenerated data and the prompt set once, before several workers start (the
    build locks would make the workers wait for one another anyway; this way the waiting is visible)."""
    if settings.evaluator is not None:
        return
    cfg = check_trial_config(settings, space)
    cfg["tracking"]["enabled"] = False
    DrafterCLI(args=cli_args(cfg), run=False).datamodule.prepare_data()  # the training pipeline's DataModule
    validation_prompts(settings)


def run_worker(settings: SweepSettings, space: SearchSpace, *, resume: bool = False,
               echo: Callable[[str], None] = print) -> optuna.Study:
    """One worker: attach to (or create) the study and run trials until it holds ``n_trials`` finished ones.

    ``resume``: first recover from a crash (:func:`recover_study`). An exception in a
    trial fails that trial, marks its MLflow run FAILED and stops this worker (rerun with
    ``--resume`` to retry it).
    """
    if settings.threads:
        torch.set_num_threads(int(settings.threads))
    study = create_or_load_study(settings, space)
    if resume:
        recover_study(study, settings, echo)
    parent = ensure_study_run(study, settings, space)
    client, _ = mlflow_client()
    done = finished_trials(study)
    if target_covered(study, settings.n_trials) and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if done >= settings.n_trials:
            echo(f"study {settings.study_name!r} already has {done} finished trials (target {settings.n_trials}); "
                 "raise --n-trials to run more")
        else:
            running = trial_counts(study)["RUNNING"]
            echo(f"study {settings.study_name!r}: {done} finished + {running} running trials cover the target "
                 f"{settings.n_trials}; nothing to start (if those workers died, rerun with --resume)")
        finish_study_run(study, settings, parent, client)
        return study
    echo(f"study {settings.study_name!r}: {done}/{settings.n_trials} finished trials; storage "
         f"{redact(settings.storage_url())}; MLflow experiment {settings.experiment_name()!r}")
    objective = make_objective(study, settings, space, parent, echo)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study.optimize(objective, n_trials=None, callbacks=[stop_when_done(settings, parent, client)],
                       gc_after_trial=True)
    except BaseException:
        if not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            set_run_status(client, parent, "FAILED")
        raise
    finish_study_run(study, settings, parent, client)
    return study


def launch_workers(settings: SweepSettings, space: SearchSpace, commands: Sequence[Sequence[str]], *,
                   resume: bool = False, echo: Callable[[str], None] = print) -> int:
    """Create/recover the study once, prepare shared artifacts, then run one worker process per command
    (each a ``sweeps/domino.py run ... --worker-index i`` line) on it. Returns 0, or 1 when a worker failed."""
    study = create_or_load_study(settings, space)
    if resume:
        recover_study(study, settings, echo)
    parent = ensure_study_run(study, settings, space)
    echo(f"preparing shared artifacts (target, regenerated data) before {len(commands)} workers start ...")
    sys.stdout.flush()
    prepare_shared_artifacts(settings, space)
    procs = []
    try:
        for i, command in enumerate(commands):
            if i:
                time.sleep(0.5)  # stagger the first storage writes
            procs.append(subprocess.Popen(list(command)))
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        raise
    study = create_or_load_study(settings, space)
    finish_study_run(study, settings, parent)
    bad = [(i, c) for i, c in enumerate(codes) if c != 0]
    counts = {k: v for k, v in trial_counts(study).items() if v}
    echo(f"workers done; study {settings.study_name!r}: {counts}")
    if bad:
        print(f"workers {bad} (index, exit code) failed; rerun with --resume to retry their trials", file=sys.stderr)
        return 1
    return 0


def run_sweep(settings: SweepSettings, space: SearchSpace, *, workers: int = 1,
              worker_command: Callable[[int], Sequence[str]] | None = None, resume: bool = False,
              summary: bool = False, echo: Callable[[str], None] = print) -> int:
    """``sweeps/domino.py run``: one worker in this process, or ``workers`` processes (``worker_command(i)``);
    then the :func:`~lit_domino.studies.sweep.summary.summarize` output with ``summary``. Returns the exit code."""
    if workers < 1:
        raise SweepError(f"--workers must be >= 1, got {workers}")
    if settings.evaluator is None:  # the space's target keys, checked before any trial
        check_trial_config(settings, space)
    if workers > 1:
        if worker_command is None:
            raise SweepError("several workers need the command line of a worker process")
        rc = launch_workers(settings, space, [worker_command(i) for i in range(workers)], resume=resume, echo=echo)
    else:
        run_worker(settings, space, resume=resume, echo=echo)
        rc = 0
    if summary:
        summarize(load_existing_study(settings.study_name, settings.storage_url()), echo=echo)
    return rc
