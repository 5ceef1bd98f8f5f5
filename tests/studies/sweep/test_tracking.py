"""lit_domino.studies.sweep.tracking: the study's MLflow run (created once, FINISHED only when the study is done) and
the nested trial runs."""

from __future__ import annotations

from mlflow.tracking import MlflowClient
from sweep_fakes import fake_settings

from lit_domino.studies import sweep
from lit_domino.studies.sweep.tracking import mark_run_failed, start_trial_run
from lit_domino.runtime.tracking import default_tracking_uri


def test_study_run_and_trial_runs(tmp_path):
    space, settings = sweep.load_space(), fake_settings(tmp_path, "track", n_trials=1)
    study = sweep.create_or_load_study(settings, space)
    parent = sweep.ensure_study_run(study, settings, space)
    assert sweep.ensure_study_run(study, settings, space) == parent == study.user_attrs[sweep.RUN_ATTR]
    client = MlflowClient(default_tracking_uri())
    run = client.get_run(parent)
    assert run.info.status == "RUNNING" and run.data.tags["sweep_role"] == "study"
    assert run.data.tags["sweep"] == "track" and "space.rank" in run.data.params
    assert client.get_experiment(run.info.experiment_id).name == "sweep-track"

    child = start_trial_run(settings.experiment_name(), "track-t000", space.variant, settings, parent)
    assert client.get_run(child).data.tags["mlflow.parentRunId"] == parent
    mark_run_failed(client, child)  # a dead worker's trial
    failed = client.get_run(child)
    assert failed.info.status == "FAILED" and failed.data.tags["optuna.state"] == "FAIL"

    sweep.finish_study_run(study, settings, parent)  # no finished trial yet: the study run stays RUNNING
    assert client.get_run(parent).info.status == "RUNNING"
    trial = study.ask()
    space.suggest(trial)
    study.tell(trial, 1.25)
    sweep.finish_study_run(study, settings, parent)
    done = client.get_run(parent)
    assert done.info.status == "FINISHED" and done.data.tags["best_trial"] == "0"
    assert done.data.metrics["best_value"] == 1.25 and done.data.metrics["finished_trials"] == 1
