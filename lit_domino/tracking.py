"""MLflow helpers: where runs go, how they are named and tagged, and that a crash reads FAILED.

* Tracking URI: ``$MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<project root>/mlflow.db``
  (absolute, so every entry point from any working directory writes one store).
  Artifacts of experiments created here go next to the database, ``<root>/mlruns/``.
* :func:`make_mlflow_logger` — Lightning's ``MLFlowLogger`` with the suite's tags
  (``variant``, ``preset``, ``seed``, ``table``).
* :func:`flatten_config` / :func:`log_config` — the flattened config as params
  (``model.lr``, ``data.batch_size``, ... — ``init_args`` levels dropped) and the
  YAML as an artifact.
* :func:`mark_failed_on_error` (context manager) and :class:`MarkFailedOnError`
  (callback) — an exception ends the run as ``FAILED`` (``KILLED`` for Ctrl-C),
  never leaving it ``RUNNING``. Lightning's Trainer already finalizes its loggers
  with ``"failed"`` on an exception inside ``fit``; these cover everything around
  it (building classes, exporting, plain ``mlflow.start_run`` runs).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from typing import Any, Iterable, Iterator, Mapping, Optional

from lightning.pytorch.callbacks import Callback

from lit_domino.paths import project_root  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

TRACKING_ENV = "MLFLOW_TRACKING_URI"
DEFAULT_EXPERIMENT = "lit_domino"
MAX_PARAM_CHARS = 500


@dataclass
class TrackingConfig:
    """How a training run is tracked (the ``tracking:`` section of the training configs).

    Args:
        enabled: log to MLflow (``trainer.logger`` set explicitly wins over this).
        experiment: MLflow experiment (one per study or table).
        run_name: run name; None = ``<variant>-<preset>-s<seed>``.
        variant: ``variant`` tag; None = the module's variant name.
        preset: ``preset`` tag (set by the preset YAMLs).
        table: ``table`` tag: which results table the run belongs to (None = untagged).
        tracking_uri: None = ``$MLFLOW_TRACKING_URI`` or ``sqlite:///<project root>/mlflow.db``.
    """

    enabled: bool = True
    experiment: str = "train"
    run_name: Optional[str] = None
    variant: Optional[str] = None
    preset: Optional[str] = None
    table: Optional[str] = None
    tracking_uri: Optional[str] = None


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else ``sqlite:///<project root>/mlflow.db`` (absolute path)."""
    uri = os.environ.get(TRACKING_ENV)
    if uri:
        return uri
    return f"sqlite:///{project_root() / 'mlflow.db'}"


def _sqlite_path(tracking_uri: str) -> Path | None:
    if tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri[len("sqlite:///"):])
    return None


def default_artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """For a SQLite store, ``<db dir>/mlruns/<experiment>`` (a file URI); otherwise the server's default."""
    db = _sqlite_path(tracking_uri)
    if db is None:
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", experiment) or "experiment"
    return (db.resolve().parent / "mlruns" / safe).as_uri()


def ensure_experiment(name: str = DEFAULT_EXPERIMENT, tracking_uri: str | None = None) -> str:
    """The id of experiment ``name`` (created, with the default artifact location, if missing)."""
    from mlflow.tracking import MlflowClient

    tracking_uri = tracking_uri or default_tracking_uri()
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    return client.create_experiment(name, artifact_location=default_artifact_location(tracking_uri, name))


def run_tags(variant: str | None = None, preset: str | None = None, seed: int | None = None,
             table: str | None = None, extra: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The suite's run tags (None values left out)."""
    tags = {"variant": variant, "preset": preset, "seed": seed, "table": table, **dict(extra or {})}
    return {k: str(v) for k, v in tags.items() if v is not None}


def make_mlflow_logger(
    experiment: str = DEFAULT_EXPERIMENT,
    run_name: str | None = None,
    *,
    variant: str | None = None,
    preset: str | None = None,
    seed: int | None = None,
    table: str | None = None,
    tags: Mapping[str, Any] | None = None,
    tracking_uri: str | None = None,
    run_id: str | None = None,
):
    """An ``MLFlowLogger`` on the suite's store, tagged ``variant``/``preset``/``seed``/``table``.

    ``run_id`` continues an existing run (a resumed training) instead of starting one.
    """
    from lightning.pytorch.loggers import MLFlowLogger

    tracking_uri = tracking_uri or default_tracking_uri()
    if run_id is None:
        ensure_experiment(experiment, tracking_uri)
    return MLFlowLogger(
        experiment_name=experiment,
        run_name=run_name,
        tracking_uri=tracking_uri,
        tags=run_tags(variant, preset, seed, table, tags),
        artifact_location=default_artifact_location(tracking_uri, experiment),
        run_id=run_id,
    )


def flatten_config(config: Mapping[str, Any], prefix: str = "", sep: str = ".") -> dict[str, str]:
    """Nested config → ``{"model.lr": "0.0006", ...}``; ``init_args`` levels dropped, ``class_path`` kept."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        key = str(key)
        if key == "init_args":
            name = prefix
        else:
            name = f"{prefix}{sep}{key}" if prefix else key
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, name, sep))
        else:
            flat[name] = str(value)[:MAX_PARAM_CHARS]
    return flat


def log_params(client, run_id: str, params: Mapping[str, str]) -> None:
    """Log params in batches; a value that differs from one already logged (a resumed run) is skipped with a warning."""
    from mlflow.entities import Param

    items = [Param(k[:250], str(v)[:MAX_PARAM_CHARS]) for k, v in params.items()]
    existing = client.get_run(run_id).data.params
    fresh = [p for p in items if p.key not in existing]
    changed = [p.key for p in items if p.key in existing and existing[p.key] != p.value]
    if changed:
        log.warning("params already logged with other values are kept as they were: %s", changed)
    for i in range(0, len(fresh), 100):
        client.log_batch(run_id, params=fresh[i : i + 100])


def log_config(logger, config: Mapping[str, Any], yaml_text: str | None = None,
               artifact_name: str = "config.yaml") -> None:
    """Flattened ``config`` as params and ``yaml_text`` as an artifact of ``logger``'s run (an ``MLFlowLogger``)."""
    client, run_id = logger.experiment, logger.run_id
    log_params(client, run_id, flatten_config(config))
    if yaml_text is not None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / artifact_name
            path.write_text(yaml_text)
            client.log_artifact(run_id, str(path))


# --------------------------------------------------------------------------- failures


def _status_for(exc: BaseException) -> str:
    return "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"


def end_loggers(loggers: Iterable, exc: BaseException) -> None:
    """Mark every started MLflow run of ``loggers`` FAILED (KILLED for Ctrl-C)."""
    from lightning.pytorch.loggers import MLFlowLogger

    for logger in loggers or ():
        if isinstance(logger, MLFlowLogger) and getattr(logger, "_initialized", False):
            try:
                client = logger.experiment
                run = client.get_run(logger.run_id)
                if run.info.status == "RUNNING":
                    client.set_terminated(logger.run_id, _status_for(exc))
            except Exception as err:  # never mask the original exception
                log.warning("could not mark MLflow run %s failed: %s", getattr(logger, "_run_id", None), err)


@contextlib.contextmanager
def mark_failed_on_error(loggers: Iterable | None = None) -> Iterator[None]:
    """On an exception inside the block, end the MLflow runs as FAILED (KILLED for Ctrl-C) and re-raise.

    Covers the given Lightning loggers (or a callable returning them, resolved at
    failure time) and any active plain ``mlflow`` run (``mlflow.end_run(status="FAILED")``).
    """
    try:
        yield
    except BaseException as exc:
        current = loggers() if callable(loggers) else loggers
        end_loggers(current or (), exc)
        try:
            import mlflow

            if mlflow.active_run() is not None:
                mlflow.end_run(status=_status_for(exc))
        except Exception as err:
            log.warning("could not end the active MLflow run: %s", err)
        raise


@contextlib.contextmanager
def mlflow_run(experiment: str = DEFAULT_EXPERIMENT, run_name: str | None = None, *,
               tags: Mapping[str, Any] | None = None, tracking_uri: str | None = None):
    """A plain ``mlflow.start_run`` on the suite's store: FINISHED on success, FAILED on an exception."""
    import mlflow

    tracking_uri = tracking_uri or default_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)
    exp_id = ensure_experiment(experiment, tracking_uri)
    with mark_failed_on_error():
        str_tags = {k: str(v) for k, v in (tags or {}).items()}
        run = mlflow.start_run(experiment_id=exp_id, run_name=run_name, tags=str_tags)
        yield run
        mlflow.end_run(status="FINISHED")


class MarkFailedOnError(Callback):
    """Callback: on any exception in a Trainer stage, the trainer's MLflow runs end FAILED (KILLED for Ctrl-C)."""

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        end_loggers(trainer.loggers, exception)
