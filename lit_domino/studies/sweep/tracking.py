"""MLflow side of a sweep: the study's run (``sweep_role=study``) and, nested under it, one run per trial
(params ``trial.*``, metric ``objective``, tag ``optuna.state``), with their end states: FINISHED,
FAILED (a crashed trial), KILLED (a pruned trial, or Ctrl-C).

Runs go to the suite's store (``$MLFLOW_TRACKING_URI`` or ``<project>/mlflow.db``, the store
``train_variant`` writes to), experiment ``sweep-<study>``.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import optuna
import yaml
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from lit_domino.studies.sweep.space import SearchSpace
from lit_domino.studies.sweep.storage import redact, trial_counts
from lit_domino.runtime.tracking import (default_tracking_uri, ensure_experiment, flatten_config, log_params,
                                         open_client, run_tags)

if TYPE_CHECKING:
    from lit_domino.studies.sweep.objective import TrialOutcome
    from lit_domino.studies.sweep.settings import SweepSettings

log = logging.getLogger(__name__)

RUN_ATTR = "lit_domino:mlflow_run_id"
EXPERIMENT_ATTR = "lit_domino:mlflow_experiment"


def mlflow_client(uri: str | None = None) -> tuple[MlflowClient, str]:
    """An MLflow client on ``uri`` (None: the suite's store; created once, under its lock) and the URI."""
    uri = uri or default_tracking_uri()
    return open_client(uri), uri


def ensure_study_run(study: optuna.Study, settings: SweepSettings, space: SearchSpace) -> str:
    """The study's MLflow run (created once, its id kept as a study user attr), set RUNNING."""
    client, uri = mlflow_client()
    run_id = study.user_attrs.get(RUN_ATTR)
    if run_id:
        try:
            run = client.get_run(run_id)
            if run.info.status != "RUNNING":
                client.update_run(run_id, status="RUNNING")
            return run_id
        except Exception as err:  # the MLflow store was reset: start a new study run
            log.warning("study run %s not found in %s (%s); creating a new one", run_id, uri, err)
    exp_id = ensure_experiment(settings.experiment_name(), uri)
    run = client.create_run(exp_id, run_name=settings.study_name, tags={
        "sweep": settings.study_name, "sweep_role": "study", "variant": space.variant, "preset": settings.preset,
        "objective": settings.objective, "optuna.storage": redact(settings.storage_url()),
    })
    run_id = run.info.run_id
    log_params(client, run_id, {**flatten_config({"settings": settings.fingerprint()}),
                                **{f"space.{p.name}": json.dumps(p.to_dict()) for p in space.params}})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "space.yaml"
        path.write_text(yaml.safe_dump(space.to_dict(), sort_keys=False))
        client.log_artifact(run_id, str(path))
    study.set_user_attr(RUN_ATTR, run_id)
    study.set_user_attr(EXPERIMENT_ATTR, settings.experiment_name())
    return run_id


def finish_study_run(study: optuna.Study, settings: SweepSettings, parent: str | None,
                     client: MlflowClient | None = None) -> None:
    """End the study run FINISHED (with ``finished_trials``, ``best_value``, tag ``best_trial``) once the
    study holds ``n_trials`` finished trials and none is RUNNING or WAITING; else leave it as it is."""
    client = client or mlflow_client()[0]
    c = trial_counts(study)
    if c["RUNNING"] == 0 and c["WAITING"] == 0 and c["COMPLETE"] + c["PRUNED"] >= settings.n_trials:
        try:
            client.log_metric(parent, "finished_trials", c["COMPLETE"] + c["PRUNED"])
            if c["COMPLETE"]:
                client.log_metric(parent, "best_value", study.best_value, step=study.best_trial.number)
                client.set_tag(parent, "best_trial", str(study.best_trial.number))
        except Exception as err:
            log.warning("could not log the study summary to MLflow: %s", err)
        set_run_status(client, parent, "FINISHED")


def start_trial_run(experiment: str, run_name: str, variant: str, settings: SweepSettings,
                    parent_run_id: str | None) -> str:
    """A new trial run in ``experiment``, nested under the study run ``parent_run_id``; its id."""
    client, uri = mlflow_client()
    exp_id = ensure_experiment(experiment, uri)
    tags = run_tags(variant, settings.preset, settings.seed,
                    extra={"mlflow.parentRunId": parent_run_id} if parent_run_id else None)
    return client.create_run(exp_id, run_name=run_name, tags=tags).info.run_id


def set_run_status(client: MlflowClient, run_id: str | None, status: str, only_if_running: bool = True) -> None:
    """End run ``run_id`` with ``status`` (only a RUNNING one unless ``only_if_running=False``); never raises."""
    if not run_id:
        return
    try:
        run = client.get_run(run_id)
        if not only_if_running or run.info.status == "RUNNING":
            client.set_terminated(run_id, status)
    except Exception as err:
        log.warning("could not set MLflow run %s to %s: %s", run_id, status, err)


def mark_run_failed(client: MlflowClient, run_id: str | None) -> None:
    """The run of a trial whose worker died: tag ``optuna.state=FAIL`` and end it FAILED (if still RUNNING)."""
    if not run_id:
        return
    try:
        if client.get_run(run_id).info.status == "RUNNING":
            client.set_tag(run_id, "optuna.state", "FAIL")
    except Exception as err:
        log.warning("could not tag MLflow run %s: %s", run_id, err)
    set_run_status(client, run_id, "FAILED")


def log_trial(client: MlflowClient, run_id: str, *, study_name: str, number: int, params: Mapping[str, Any],
              state: str, outcome: TrialOutcome | None = None, value: float | None = None) -> None:
    """Tags (``sweep``, ``optuna.trial``, ``optuna.state``), params ``trial.*`` and, with an outcome, its
    metrics (plus ``objective``) and decoding rows on the trial's run. Tracking trouble is logged, never
    raised: it never loses a trial result."""
    try:
        client.set_tag(run_id, "sweep", study_name)
        client.set_tag(run_id, "optuna.trial", str(number))
        client.set_tag(run_id, "optuna.state", state)
        log_params(client, run_id, {f"trial.{k}": str(v) for k, v in params.items()})
        if outcome is not None:
            if outcome.from_cache and outcome.run_id:
                client.set_tag(run_id, "drafter_run_id", outcome.run_id)
            now = int(time.time() * 1000)
            metrics = [Metric(k, float(v), now, 0) for k, v in outcome.metrics.items()
                       if isinstance(v, (int, float)) and math.isfinite(float(v))]
            if value is not None and math.isfinite(value):
                metrics.append(Metric("objective", float(value), now, 0))
            for i in range(0, len(metrics), 500):
                client.log_batch(run_id, metrics=metrics[i:i + 500])
            if outcome.rows:
                client.log_dict(run_id, outcome.rows, "sweep/decode_rows.json")
    except Exception as err:
        log.warning("could not log trial %s to MLflow run %s: %s", number, run_id, err)
