"""lit_domino.studies.sweep.worker: kill + resume with several worker processes, an exception in a trial, and the
heartbeat-based recovery of a dead worker's trial (Optuna's heartbeat + RetryHeartbeatStaleTrialCallback)."""

from __future__ import annotations

import os
import threading
import time

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState
from sweep_fakes import cli, fake_settings, states

from lit_domino.studies import sweep
from lit_domino.studies.sweep.storage import retry_callback
from lit_domino.studies.sweep.tracking import start_trial_run
from lit_domino.runtime.tracking import default_tracking_uri


@pytest.mark.slow  # two worker processes, one killed
def test_kill_a_worker_then_resume(tmp_path, importable_tests, monkeypatch, capsys):
    """Two worker processes on one study; the one running trial 2 is SIGKILLed (its heartbeat stops); --resume
    fails that trial once its heartbeat is stale, retries its configuration and finishes the study.

    Both workers run a trial (the first trials wait for each other; trial 1 ends only after trial 2's kill),
    and trial 2 is the last one the target lets start, so no live worker asks for another trial (and fails
    the stale one itself, as Optuna's optimize does) before the launcher returns."""
    main = cli().main
    storage = f"sqlite:///{tmp_path / 'kill.db'}"
    args = ["run", "--study-name", "kill", "--storage", storage, "--preset", "smoke", "--n-trials", "3",
            "--evaluator", "sweep_fakes:fake_evaluator", "--sampler-seed", "0", "--heartbeat", "1"]
    monkeypatch.setenv("SWEEP_TEST_CRASH", f"kill:2:{tmp_path / 'killed'}")
    (tmp_path / "workers").mkdir()
    monkeypatch.setenv("SWEEP_TEST_WORKERS", f"{tmp_path / 'workers'}:2")
    assert main(args + ["--workers", "2"]) == 1  # a worker died
    assert "failed; rerun with --resume" in capsys.readouterr().err
    study = optuna.load_study(study_name="kill", storage=storage)
    assert states(study) == {"COMPLETE": 2, "RUNNING": 1}
    assert study.trials[2].state == TrialState.RUNNING and (tmp_path / "killed").exists()
    pids = {t.user_attrs["worker_pid"] for t in study.trials}
    assert len(pids) == 2 and os.getpid() not in pids  # two worker processes attached to the study

    assert main(args + ["--resume"]) == 0
    out = capsys.readouterr().out
    assert "trials [2] were RUNNING on dead workers" in out
    study = optuna.load_study(study_name="kill", storage=storage)
    assert states(study) == {"COMPLETE": 3, "FAIL": 1}
    retry = study.trials[3]
    assert retry.system_attrs["failed_trial"] == 2 and retry.params == study.trials[2].params
    client = MlflowClient(default_tracking_uri())
    parent = study.user_attrs[sweep.RUN_ATTR]
    assert client.get_run(parent).info.status == "FINISHED"
    killed = client.get_run(study.trials[2].user_attrs["mlflow_run_id"])
    assert killed.info.status == "FAILED" and killed.data.tags["optuna.state"] == "FAIL"
    for t in study.get_trials(states=(TrialState.COMPLETE,)):
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert run.data.tags["mlflow.parentRunId"] == parent and run.info.status == "FINISHED"
        assert run.data.metrics["objective"] == pytest.approx(t.value)
        assert run.data.params["trial.rank"] == str(t.params["rank"])
    # done: another run of the same command has nothing left to do
    assert main(args) == 0 and "already has 3 finished trials" in capsys.readouterr().out


def test_exception_in_a_trial_then_resume(tmp_path, monkeypatch):
    space, settings = sweep.load_space(), fake_settings(tmp_path, "boom")
    monkeypatch.setenv("SWEEP_TEST_CRASH", f"raise:1:{tmp_path / 'raised'}")
    with pytest.raises(RuntimeError, match="injected crash"):
        sweep.run_worker(settings, space, echo=lambda *_: None)
    study = optuna.load_study(study_name="boom", storage=settings.storage)
    assert states(study) == {"COMPLETE": 1, "FAIL": 1}
    client = MlflowClient(default_tracking_uri())
    assert client.get_run(study.trials[1].user_attrs["mlflow_run_id"]).info.status == "FAILED"
    assert client.get_run(study.user_attrs[sweep.RUN_ATTR]).info.status == "FAILED"  # never left RUNNING
    study = sweep.run_worker(settings, space, resume=True, echo=lambda *_: None)
    assert states(study) == {"COMPLETE": 3, "FAIL": 1}
    assert study.trials[2].params == study.trials[1].params  # the failed configuration is retried first
    assert study.trials[2].system_attrs["failed_trial"] == 1
    assert client.get_run(study.user_attrs[sweep.RUN_ATTR]).info.status == "FINISHED"


class WorkerDied(BaseException):
    """Leaves ``study.optimize`` without a tell: the trial stays RUNNING and its heartbeat thread stops, as
    when the worker process is killed."""


def test_heartbeat_recovery_of_a_dead_workers_trial(tmp_path):
    """A RUNNING trial whose heartbeat stopped is failed and retried once on resume (its MLflow run ends
    FAILED); the RUNNING trial of a live worker, whose heartbeat goes on, is left alone."""
    space, settings = sweep.load_space(), fake_settings(tmp_path, "beat", heartbeat=1, n_trials=2)
    client = MlflowClient(default_tracking_uri())
    release = threading.Event()

    def live_objective(trial):
        space.suggest(trial)
        assert release.wait(60)
        return 1.0

    live = sweep.create_or_load_study(settings, space)
    worker = threading.Thread(target=live.optimize, args=(live_objective,), kwargs={"n_trials": 1})
    worker.start()
    try:
        dead = sweep.create_or_load_study(settings, space)
        while not dead.trials:
            time.sleep(0.05)

        def dying_objective(trial):
            space.suggest(trial)
            trial.set_user_attr("mlflow_run_id", start_trial_run(settings.experiment_name(), "beat-t001",
                                                                 space.variant, settings, None))
            raise WorkerDied

        with pytest.raises(WorkerDied):
            dead.optimize(dying_objective, n_trials=1)
        study = sweep.create_or_load_study(settings, space)
        assert [t.state for t in study.trials] == [TrialState.RUNNING, TrialState.RUNNING]
        lines: list[str] = []
        assert sweep.recover_study(study, settings, echo=lines.append) == {"failed": [1], "retried": [1]}
        trials = study.trials
        assert [t.state for t in trials] == [TrialState.RUNNING, TrialState.FAIL, TrialState.WAITING]
        assert trials[2].params == trials[1].params and trials[2].system_attrs["failed_trial"] == 1
        text = "\n".join(lines)
        assert "trials [1] were RUNNING on dead workers" in text and "trials [0] are still RUNNING" in text
        run = client.get_run(trials[1].user_attrs["mlflow_run_id"])
        assert run.info.status == "FAILED" and run.data.tags["optuna.state"] == "FAIL"
    finally:
        release.set()
        worker.join()
    # retried once: resuming again adds no second copy (test_kill_a_worker_then_resume runs the copy)
    assert sweep.recover_study(study, settings, echo=lambda *_: None) == {"failed": [], "retried": []}
    assert states(study) == {"COMPLETE": 1, "FAIL": 1, "WAITING": 1}


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_resume_without_a_heartbeat(tmp_path, storage):
    """No heartbeat (``--heartbeat 0``, or a journal file: Optuna 5 has none there): a worker's liveness is
    unknown, so resume takes every RUNNING trial for a dead worker's, fails and retries it."""
    url = f"journal:{tmp_path / 'nb.journal'}" if storage == "journal" else f"sqlite:///{tmp_path / 'nb.db'}"
    space = sweep.load_space()
    settings = fake_settings(tmp_path, "nobeat", storage=url, heartbeat=0 if storage == "sqlite" else 60)
    study = sweep.create_or_load_study(settings, space)
    space.suggest(study.ask())  # RUNNING, with no worker behind it
    lines: list[str] = []
    assert sweep.recover_study(study, settings, echo=lines.append) == {"failed": [0], "retried": [0]}
    assert "records no heartbeat" in lines[0]
    trials = study.trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING] and trials[1].params == trials[0].params


def test_a_retry_ends_the_failed_attempts_run(tmp_path):
    """A live worker's ``study.optimize`` fails a stale trial itself (``fail_stale_trials`` before each trial)
    and the storage's retry callback re-enqueues it, with no ``--resume``: the retry's objective then ends
    the dead attempt's MLflow run FAILED."""
    space, settings = sweep.load_space(), fake_settings(tmp_path, "again", n_trials=1)
    study = sweep.create_or_load_study(settings, space)
    trial = study.ask()
    space.suggest(trial)
    run_id = start_trial_run(settings.experiment_name(), "again-t000", space.variant, settings, None)
    trial.set_user_attr("mlflow_run_id", run_id)
    study.tell(trial, state=TrialState.FAIL)  # what fail_stale_trials does to a stale trial ...
    retry_callback(settings.max_retries)(study, study.trials[0])  # ... and then the storage's callback
    lines: list[str] = []
    study.optimize(sweep.make_objective(study, settings, space, None, lines.append), n_trials=1)
    assert states(study) == {"FAIL": 1, "COMPLETE": 1} and study.trials[1].params == study.trials[0].params
    assert any("(retry of trial 0)" in line for line in lines)
    assert study.trials[1].user_attrs["mlflow_run_id"] not in (None, run_id)  # the retry's own run
    run = MlflowClient(default_tracking_uri()).get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["optuna.state"] == "FAIL"


def test_a_mistyped_target_key_fails_before_any_trial(tmp_path):
    """A space target key the training parser does not know (``model.rnak``) is a ConfigError naming it and its
    close match, raised before the study runs a trial (no training, no storage written)."""
    from lit_domino.training.cli import ConfigError

    settings = fake_settings(tmp_path, "typo", evaluator=None, n_trials=1)
    space = sweep.parse_space({"variant": "domino", "params": {
        "rank": {"type": "int", "low": 16, "high": 64, "target": "model.rnak"}}})
    with pytest.raises(ConfigError, match="model.rnak; did you mean model.head.rank"):
        sweep.run_sweep(settings, space)
    assert not (tmp_path / "typo.db").exists()
    flat = sweep.parse_space({"variant": "domino", "params": {  # a space written before the head section
        "rank": {"type": "int", "low": 16, "high": 64, "target": "model.rank"}}})
    with pytest.raises(ConfigError, match=r"model\.rank moved to model\.head\.rank"):
        sweep.run_sweep(settings, flat)
    assert not (tmp_path / "typo.db").exists()
