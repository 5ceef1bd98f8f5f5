"""MLflow helpers: where runs go, how they are named and tagged, and that a crash reads FAILED.

* The store (where it is, created once under a lock, experiments, saved views):
  :mod:`~lit_domino.runtime.tracking_store` (:func:`open_client` is the suite's one way to an ``MlflowClient``);
  a config as params: :mod:`~lit_domino.runtime.tracking_params`. Their names are importable from here too.
* :func:`make_mlflow_logger` — Lightning's ``MLFlowLogger`` with the suite's tags
  (``variant``, ``preset``, ``seed``, ``table``).
* :func:`mark_failed_on_error` (context manager) and :class:`MarkFailedOnError`
  (callback) — an exception ends the run as ``FAILED`` (``KILLED`` for Ctrl-C, with a
  one-line hint that rerunning the same command resumes), never leaving it ``RUNNING``.
  Lightning's Trainer finalizes its loggers with ``"failed"`` on any exception inside
  ``fit``, Ctrl-C included; the callback turns that into ``KILLED`` for an interrupt,
  and the context manager covers everything around ``fit`` (building classes,
  exporting, plain ``mlflow.start_run`` runs).
* :func:`ensure_run` — a run id that the current store does not know (a deleted
  ``mlflow.db``, another ``MLFLOW_TRACKING_URI``) is replaced by a recreated run, with a
  warning, instead of failing with ``MlflowException: Run ... not found``.
* Resumed trainings: :func:`training_finished` tells an interrupted run (continued) from
  the run of a completed training (never reopened: a rebuild starts a new run,
  :func:`mark_superseded` links the two with the ``supersedes`` / ``superseded_by`` tags);
  :class:`ResumableRun` (callback) drops the points an interrupted process logged after the
  checkpoint a resume continues from, so each step is in the run's history once, and tags
  the run of a training that completed.

Importing this module is cheap (no Lightning, no MLflow until a helper needs them):
worker processes import it first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import dataclass

from typing import Any, Iterable, Iterator, Mapping, Optional

from lit_domino.runtime.paths import project_root  # noqa: F401  (re-exported)
# The store (where, created once under a lock, experiments, saved views) lives apart; its names stay importable here.
from lit_domino.runtime.tracking_store import (DEFAULT_EXPERIMENT, EXPERIMENT_KIND_TAG, MODEL_TRAINING,  # noqa: F401
                                               SAVED_VIEW_PREFIX, TRACKING_ENV, default_artifact_location,
                                               default_tracking_uri, ensure_experiment, ensure_store, open_client,
                                               save_runs_view, store_lock)
from lit_domino.runtime.tracking_params import (MAX_PARAM_CHARS, OUTPUT_KEYS, flatten_config, log_config,  # noqa: F401
                                                log_params)

log = logging.getLogger(__name__)



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


def ensure_run(run_id: str | None, experiment: str = DEFAULT_EXPERIMENT, run_name: str | None = None, *,
               tags: Mapping[str, Any] | None = None, params: Mapping[str, Any] | None = None,
               metrics: Mapping[str, float] | None = None, tracking_uri: str | None = None) -> str:
    """``run_id`` if the store has it, else the id of a run recreated in its place (with a warning).

    A cached artifact remembers the MLflow run that trained it; after ``mlflow.db`` is
    deleted, or with another ``MLFLOW_TRACKING_URI``, that run is gone and logging into
    it would raise ``MlflowException: Run ... not found``. The replacement run is made in
    ``experiment`` (named ``run_name``, tagged ``tags`` and ``recreated_from=<run_id>``,
    with ``params`` and ``metrics`` — what the artifact's report says — logged) and left
    FINISHED; a later call for the same missing id reuses it, so reruns do not multiply
    runs. A deleted (trashed) run is restored. ``run_id`` None: a new run is made.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    uri = ensure_store(tracking_uri)
    client = MlflowClient(uri)
    exp_id = ensure_experiment(experiment, uri)
    if run_id:
        try:
            run = client.get_run(run_id)
        except MlflowException as err:
            if getattr(err, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
                raise
        else:
            if run.info.lifecycle_stage == "deleted":
                client.restore_run(run_id)
            return run_id
        with store_lock(uri):
            found = client.search_runs([exp_id], filter_string=f"tags.recreated_from = '{run_id}'", max_results=1)
            if found:
                new_id = found[0].info.run_id
                log.warning("MLflow run %s is not in %s; logging into run %s, which replaced it earlier",
                            run_id, uri, new_id)
                return new_id
            new_id = _create_run(client, exp_id, run_name, {**dict(tags or {}), "recreated_from": run_id},
                                 params, metrics)
        log.warning("MLflow run %s is not in %s (deleted store, or another MLFLOW_TRACKING_URI?); "
                    "recreated it as run %s of experiment %r", run_id, uri, new_id, experiment)
        return new_id
    return _create_run(client, exp_id, run_name, dict(tags or {}), params, metrics)


def _create_run(client, exp_id: str, run_name: str | None, tags: Mapping[str, Any], params, metrics) -> str:
    run = client.create_run(exp_id, run_name=run_name, tags={k: str(v) for k, v in tags.items()})
    new_id = run.info.run_id
    if params:
        log_params(client, new_id, {k: str(v) for k, v in params.items()})
    for key, value in (metrics or {}).items():
        if value is not None:
            client.log_metric(new_id, key, float(value))
    client.set_terminated(new_id, "FINISHED")
    return new_id


SUPERSEDES_TAG = "supersedes"
"""Tag of a run that rebuilt a finished training: the id of the finished run it replaces."""
SUPERSEDED_BY_TAG = "superseded_by"
"""Tag of a finished run whose artifact was rebuilt by another run: that run's id."""
TRAINED_TAG = "training_complete"
"""Tag set when a run's training completed (``fit`` reached its end): the run is never reopened, even where a
later stage set another status (a sweep's decoding failure: FAILED; decoding after training: RUNNING)."""


def training_finished(run_id: str, tracking_uri: str | None = None) -> bool | None:
    """Whether the training of run ``run_id`` completed: it is ``FINISHED`` or tagged :data:`TRAINED_TAG`
    (False: an interrupted run, ``RUNNING``/``KILLED``/``FAILED``); None when the store does not have the
    run or it was deleted (trashed)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(ensure_store(tracking_uri))
    try:
        run = client.get_run(run_id)
    except MlflowException as err:
        if getattr(err, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
            raise
        return None
    if run.info.lifecycle_stage == "deleted":
        return None
    return run.info.status == "FINISHED" or run.data.tags.get(TRAINED_TAG) == "true"


def mark_superseded(client, old_run_id: str, new_run_id: str) -> None:
    """Tag the finished run ``old_run_id`` ``superseded_by=<new_run_id>`` (the new run carries
    ``supersedes=<old_run_id>`` from its creation); a failure is a warning, never the training's end."""
    try:
        client.set_tag(old_run_id, SUPERSEDED_BY_TAG, new_run_id)
    except Exception as err:  # noqa: BLE001 (a tag is not worth a failed training)
        log.warning("could not tag MLflow run %s superseded by run %s: %s", old_run_id, new_run_id, err)


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
    supersedes: str | None = None,
):
    """An ``MLFlowLogger`` on the suite's store, tagged ``variant``/``preset``/``seed``/``table``.

    ``run_id`` continues an existing run (a resumed training) instead of starting one; with
    :class:`ResumableRun` among the trainer's callbacks, the points logged after the
    checkpoint the training resumes from are dropped first. ``supersedes``: the finished run
    this new one rebuilds (tagged ``supersedes``; see :func:`mark_superseded`).
    """
    from lightning.pytorch.loggers import MLFlowLogger

    tracking_uri = ensure_store(tracking_uri)
    if run_id is None:
        ensure_experiment(experiment, tracking_uri)
    extra = {**dict(tags or {}), **({SUPERSEDES_TAG: supersedes} if supersedes and run_id is None else {})}
    logger = MLFlowLogger(
        experiment_name=experiment,
        run_name=run_name,
        tracking_uri=tracking_uri,
        tags=run_tags(variant, preset, seed, table, extra),
        artifact_location=default_artifact_location(tracking_uri, experiment),
        run_id=run_id,
    )
    logger._lit_domino_resumed = run_id is not None
    # the config is logged once, under its dotted names (log_config, by the CLI); Lightning would log the module's
    # and the DataModule's hyper-parameters again under their bare names (``head/rank`` beside ``model.head.rank``)
    logger.log_hyperparams = lambda params: None
    return logger


# --------------------------------------------------------------------------- failures


RESUME_HINT = "Interrupted: rerun the same command to resume (finished artifacts are reused, trainings continue " \
              "from their last checkpoint)."
"""The one line printed when Ctrl-C ends a run."""


def _interrupt_of(exc: BaseException | None) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt behind ``exc``: itself, or the one Lightning turned into ``SystemExit(1)``."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _status_for(exc: BaseException) -> str:
    return "KILLED" if _interrupt_of(exc) is not None else "FAILED"


def hint_resume(exc: BaseException) -> None:
    """Print :data:`RESUME_HINT` to stderr once per interrupt (nothing for other exceptions)."""
    interrupt = _interrupt_of(exc)
    if interrupt is not None and not getattr(interrupt, "_lit_domino_hinted", False):
        interrupt._lit_domino_hinted = True
        print(RESUME_HINT, file=sys.stderr, flush=True)


def end_loggers(loggers: Iterable, exc: BaseException) -> None:
    """Mark every started MLflow run of ``loggers`` FAILED (KILLED for Ctrl-C).

    A run Lightning already ended FAILED during this interrupt is corrected to KILLED."""
    from lightning.pytorch.loggers import MLFlowLogger

    status = _status_for(exc)
    for logger in loggers or ():
        if isinstance(logger, MLFlowLogger) and getattr(logger, "_initialized", False):
            try:
                client = logger.experiment
                run = client.get_run(logger.run_id)
                if run.info.status == "RUNNING" or (status == "KILLED" and run.info.status == "FAILED"):
                    client.set_terminated(logger.run_id, status)
            except Exception as err:  # never mask the original exception
                log.warning("could not mark MLflow run %s failed: %s", getattr(logger, "_run_id", None), err)


def _finalize_as_killed(logger) -> None:
    """Make the logger's next ``finalize("failed")`` (Lightning's, after ``on_exception``) end the run KILLED."""
    if getattr(logger, "_lit_domino_killed", False):
        return
    original = logger.finalize
    logger._lit_domino_killed = True

    def finalize(status: str = "success") -> None:
        logger.finalize = original
        logger._lit_domino_killed = False
        return original("KILLED" if status == "failed" else status)

    logger.finalize = finalize


@contextlib.contextmanager
def mark_failed_on_error(loggers: Iterable | None = None) -> Iterator[None]:
    """On an exception inside the block, end the MLflow runs as FAILED (KILLED for Ctrl-C) and re-raise.

    Covers the given Lightning loggers (or a callable returning them, resolved at
    failure time) and any active plain ``mlflow`` run (``mlflow.end_run(status="FAILED")``).
    Ctrl-C also prints :data:`RESUME_HINT` (once).
    """
    try:
        yield
    except BaseException as exc:
        current = loggers() if callable(loggers) else loggers
        end_loggers(current or (), exc)
        try:
            mlflow = sys.modules.get("mlflow")
            if mlflow is not None and mlflow.active_run() is not None:
                mlflow.end_run(status=_status_for(exc))
        except Exception as err:
            log.warning("could not end the active MLflow run: %s", err)
        hint_resume(exc)
        raise


@contextlib.contextmanager
def mlflow_run(experiment: str = DEFAULT_EXPERIMENT, run_name: str | None = None, *,
               tags: Mapping[str, Any] | None = None, tracking_uri: str | None = None):
    """A plain ``mlflow.start_run`` on the suite's store: FINISHED on success, FAILED on an exception."""
    import mlflow

    tracking_uri = ensure_store(tracking_uri)
    with _global_tracking_uri(tracking_uri):
        exp_id = ensure_experiment(experiment, tracking_uri)
        with mark_failed_on_error():
            str_tags = {k: str(v) for k, v in (tags or {}).items()}
            run = mlflow.start_run(experiment_id=exp_id, run_name=run_name, tags=str_tags)
            yield run
            mlflow.end_run(status="FINISHED")


@contextlib.contextmanager
def _global_tracking_uri(uri: str):
    """``mlflow.set_tracking_uri(uri)`` for the block, then the process's MLflow state as it was: MLflow keeps
    the URI in a module global and also writes it into ``MLFLOW_TRACKING_URI``; left behind, a later client in
    this process and the subprocesses it starts would read two different stores."""
    import mlflow
    from mlflow.tracking._tracking_service import utils

    before, env = getattr(utils, "_tracking_uri", None), os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        utils._tracking_uri = before
        if env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = env


def _mark_failed_callback_class():
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers import MLFlowLogger

    class MarkFailedOnError(Callback):
        """Callback: on any exception in a Trainer stage, the trainer's MLflow runs end FAILED (KILLED for Ctrl-C).

        For Ctrl-C, Lightning then finalizes its loggers with ``"failed"`` and exits with
        ``SystemExit(1)``; this callback makes that finalization read KILLED and prints
        :data:`RESUME_HINT`."""

        def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
            end_loggers(trainer.loggers, exception)
            if _interrupt_of(exception) is not None:
                for logger in trainer.loggers:
                    if isinstance(logger, MLFlowLogger):
                        _finalize_as_killed(logger)
                hint_resume(exception)

    MarkFailedOnError.__module__, MarkFailedOnError.__qualname__ = __name__, "MarkFailedOnError"
    return MarkFailedOnError


# --------------------------------------------------------------------------- resumed runs


def drop_metrics_from(client, run_id: str, step: int) -> int | None:
    """Delete the metric points of ``run_id`` at steps ``>= step`` (every key); returns how many.

    MLflow has no API for this; on a SQL store (SQLite, the default, or a database) the rows are
    deleted and each key's latest value (what ``get_run`` shows) recomputed, in one transaction.
    Returns None for other stores (a tracking server, a file store): nothing deleted.
    """
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = client._tracking_client.store
    if not isinstance(store, SqlAlchemyStore):
        return None
    from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric

    try:
        session_scope = store.ManagedSessionMaker(read_only=False)
    except TypeError:  # MLflow before read replicas: every session writes
        session_scope = store.ManagedSessionMaker()
    with session_scope as session:
        late = session.query(SqlMetric).filter(SqlMetric.run_uuid == run_id, SqlMetric.step >= step)
        keys = sorted(k for (k,) in late.with_entities(SqlMetric.key).distinct())
        count = late.delete(synchronize_session=False)
        for key in keys:
            session.query(SqlLatestMetric).filter(SqlLatestMetric.run_uuid == run_id,
                                                  SqlLatestMetric.key == key).delete(synchronize_session=False)
            # MLflow's rule for the latest value: the largest (step, timestamp, value)
            latest = (session.query(SqlMetric).filter(SqlMetric.run_uuid == run_id, SqlMetric.key == key)
                      .order_by(SqlMetric.step.desc(), SqlMetric.timestamp.desc(), SqlMetric.value.desc()).first())
            if latest is not None:
                session.add(SqlLatestMetric(run_uuid=run_id, key=key, value=latest.value, timestamp=latest.timestamp,
                                            step=latest.step, is_nan=latest.is_nan))
    return count


def _skip_logged_steps(logger, client, run_id: str) -> None:
    """Make ``logger`` leave out the points of steps its run has already logged (per key): each step once,
    where the store cannot drop the points of the discarded trajectory."""
    last = {key: max(m.step for m in client.get_metric_history(run_id, key))
            for key in client.get_run(run_id).data.metrics}
    original = logger.log_metrics

    def log_metrics(metrics, step=None):
        fresh = {k: v for k, v in metrics.items() if k not in last or (step or 0) > last[k]}
        if fresh:
            original(fresh, step)

    logger.log_metrics = log_metrics


def _resumable_run_callback_class():
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers import MLFlowLogger

    class ResumableRun(Callback):
        """Callback: the MLflow run of a resumable training holds each step once and says when it completed.

        * At train start (after the checkpoint is restored) of a run ``make_mlflow_logger`` continued
          (``run_id``): an interrupted process logged points after its last checkpoint, and the resumed
          training logs those steps again from that checkpoint. The first points come from a trajectory
          that was thrown away (the checkpoint is what the weights continue from), so the points at steps
          ``>=`` the restored ``global_step`` are deleted (:func:`drop_metrics_from`; Lightning logs the
          batch of optimizer step ``g`` at step ``g - 1``, the next batch after a checkpoint at ``g`` at
          step ``g``). Without a checkpoint (interrupted before the first) every point goes. On a store
          that cannot delete points, the steps already logged are skipped instead (the discarded
          trajectory's values stay), with a warning. The run reads ``RUNNING`` again while it trains.
        * At train end (``fit`` reached its end, not an exception): the run is tagged :data:`TRAINED_TAG`.
        """

        def _runs(self, trainer):
            if trainer.is_global_zero:
                yield from (lg for lg in trainer.loggers if isinstance(lg, MLFlowLogger))

        def on_train_start(self, trainer, pl_module) -> None:
            for logger in self._runs(trainer):
                if not getattr(logger, "_lit_domino_resumed", False):
                    continue
                logger._lit_domino_resumed = False  # once per fit
                client, run_id, step = logger.experiment, logger.run_id, int(trainer.global_step)
                client.update_run(run_id, status="RUNNING")
                dropped = drop_metrics_from(client, run_id, step)
                if dropped is None:
                    log.warning("MLflow run %s: this store cannot delete metric points; the steps the interrupted "
                                "training logged after its checkpoint (step %d) keep their first values and are not "
                                "logged again", run_id, step)
                    _skip_logged_steps(logger, client, run_id)
                elif dropped:
                    log.info("MLflow run %s resumes at step %d: dropped %d metric points the interrupted training "
                             "logged after its checkpoint", run_id, step, dropped)

        def on_train_end(self, trainer, pl_module) -> None:
            for logger in self._runs(trainer):
                logger.experiment.set_tag(logger.run_id, TRAINED_TAG, "true")

    ResumableRun.__module__, ResumableRun.__qualname__ = __name__, "ResumableRun"
    return ResumableRun


def __getattr__(name: str):
    # the callbacks subclass Lightning's Callback: defined on first use, so that importing
    # this module does not import Lightning (seconds on a busy machine)
    if name == "MarkFailedOnError":
        cls = globals()["MarkFailedOnError"] = _mark_failed_callback_class()
        return cls
    if name == "ResumableRun":
        cls = globals()["ResumableRun"] = _resumable_run_callback_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
