"""The MLflow store: where it is (``$MLFLOW_TRACKING_URI``, else ``sqlite:///<project root>/mlflow.db``), created
once under a file lock beside a SQLite database (:func:`ensure_store`: two processes migrating a fresh store's schema
at once crash one of them), the suite's one way to a client (:func:`open_client`), experiments in MLflow's
model-training mode (:func:`ensure_experiment`) and saved views of the runs table (:func:`save_runs_view`).

Importing this module is cheap (MLflow is imported where a helper needs it)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path
from typing import Any, Mapping

from lit_domino.runtime.paths import project_root

log = logging.getLogger(__name__)

TRACKING_ENV = "MLFLOW_TRACKING_URI"
DEFAULT_EXPERIMENT = "lit_domino"

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
"""The experiment tag of MLflow 3 for an experiment's kind: GenAI (traces, evaluations) or model training. MLflow
3.17's UI takes its mode from its GenAI / Model training switch instead (remembered by the browser; docs/mlflow.md
says to pick Model training); earlier 3.x UIs and MLflow's own tools read the tag."""
MODEL_TRAINING = "custom_model_development"
""":data:`EXPERIMENT_KIND_TAG`'s value for model training (runs, metrics, compare), set on every experiment here."""
SAVED_VIEW_PREFIX = "mlflow.sharedViewState."
"""Experiment tags of the runs table's saved views (MLflow 3's "Views" menu): ``<prefix><view id>``."""


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else ``sqlite:///<project root>/mlflow.db`` (absolute path)."""
    uri = os.environ.get(TRACKING_ENV)
    if uri:
        return uri
    return f"sqlite:///{project_root() / 'mlflow.db'}"


def _sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URL (None: another store, or an in-memory one)."""
    if tracking_uri.startswith("sqlite:///"):
        path = tracking_uri[len("sqlite:///"):].split("?", 1)[0]
        return Path(path) if path and path != ":memory:" else None
    return None


def default_artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """For a SQLite store, ``<db dir>/mlruns/<experiment>`` (a file URI); otherwise the server's default."""
    db = _sqlite_path(tracking_uri)
    if db is None:
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", experiment) or "experiment"
    return (db.resolve().parent / "mlruns" / safe).as_uri()


_READY_STORES: set[str] = set()


def store_lock(tracking_uri: str):
    """A file lock beside a SQLite store (``<db>.lock``); a no-op for other stores. Held around what must happen
    once per store: its creation, an experiment's, a study run's find-or-create."""
    db = _sqlite_path(tracking_uri)
    if db is None:
        return contextlib.nullcontext()
    from filelock import FileLock

    db = db.expanduser()
    db.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(db) + ".lock")


def ensure_store(tracking_uri: str | None = None) -> str:
    """Create (migrate) the tracking store once, under a file lock; returns its URI.

    Two processes opening a fresh SQLite store at once both run MLflow's schema
    migrations and one of them crashes (``alembic ... CommandError``); under the lock the
    first creates the schema and the others find it made. Call it in a parent before
    starting parallel workers, or let each worker call it (every helper here does).
    """
    uri = tracking_uri or default_tracking_uri()
    if uri in _READY_STORES:
        return uri
    from mlflow.tracking import MlflowClient

    with store_lock(uri):
        MlflowClient(uri).search_experiments(max_results=1)  # creates or verifies the schema
    _READY_STORES.add(uri)
    return uri


def open_client(tracking_uri: str | None = None):
    """An ``MlflowClient`` on the store (None: :func:`default_tracking_uri`), made once the store is
    (:func:`ensure_store`). Use it rather than ``MlflowClient(uri)``: MLflow builds a SQLite store's schema when its
    first client opens it, and two processes doing that at once crash one of them."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(ensure_store(tracking_uri))


def ensure_experiment(name: str = DEFAULT_EXPERIMENT, tracking_uri: str | None = None) -> str:
    """The id of experiment ``name`` (created, with the default artifact location, if missing).

    Safe with parallel workers: on a SQLite store it is created under the store's lock,
    elsewhere a concurrent creation is read back."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    tracking_uri = ensure_store(tracking_uri)
    client = MlflowClient(tracking_uri)
    with store_lock(tracking_uri):
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                client.restore_experiment(exp.experiment_id)
            if EXPERIMENT_KIND_TAG not in exp.tags:  # made before the tag, or by MLflow itself
                client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
            return exp.experiment_id
        try:
            return client.create_experiment(name, artifact_location=default_artifact_location(tracking_uri, name),
                                            tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING})
        except MlflowException:  # created by another process meanwhile (a server store)
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id


def save_runs_view(client, experiment_id: str, view_id: str, name: str, state: Mapping[str, Any]) -> bool:
    """Store a saved view of the runs table in experiment ``experiment_id`` (the UI's "Views" menu, and the link
    ``#/experiments/<id>/runs?viewStateShareKey=<view_id>``); returns whether it was written.

    ``state``: the UI's search and table state, e.g. ``{"selectedColumns": ["metrics.`tau`"], "columnOrder":
    [...], "searchFilter": "tags.table = 'main'"}``. A view already there is left alone: a user who overrode it in the
    UI keeps theirs."""
    import json
    import time

    key = SAVED_VIEW_PREFIX + view_id
    if key in client.get_experiment(experiment_id).tags:
        return False
    now = int(time.time() * 1000)
    client.set_experiment_tag(experiment_id, key, json.dumps(
        {"name": name, "createdAt": now, "updatedAt": now, "state": json.dumps(dict(state))}))
    return True
