"""lit_domino.runtime.tracking: default store, config flattening, runs marked FAILED/KILLED."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_domino.runtime import tracking


def test_default_tracking_uri(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = tracking.default_tracking_uri()
    path = Path(uri[len("sqlite:///"):])
    assert uri.startswith("sqlite:///") and path.is_absolute()
    assert path == tracking.project_root() / "mlflow.db" and (path.parent / "pyproject.toml").is_file()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////elsewhere/x.db")
    assert tracking.default_tracking_uri() == "sqlite:////elsewhere/x.db"
    assert tracking.default_artifact_location("sqlite:////elsewhere/x.db", "a b") == "file:///elsewhere/mlruns/a_b"


def test_flatten_config_drops_init_args():
    cfg = {"model": {"class_path": "m.Domino", "init_args": {"lr": 0.1, "curriculum": {"kind": "linear"}}},
           "data": {"batch_size": 4, "val_examples": {}}, "seed_everything": 0}
    assert tracking.flatten_config(cfg) == {
        "model.class_path": "m.Domino", "model.lr": "0.1", "model.curriculum.kind": "linear",
        "data.batch_size": "4", "data.val_examples": "{}", "seed_everything": "0"}


def test_the_runs_output_folders_are_not_params():
    """Where a run writes (machine paths) is not a setting: left out of the params, kept in config.yaml."""
    cfg = {"trainer": {"max_epochs": 2, "default_root_dir": "/home/u/artifacts/drafters/x"},
           "checkpoint": {"dirpath": "/home/u/artifacts/drafters/x/checkpoints", "save_last": True},
           "export": {"dirpath": "/home/u/artifacts/drafters/x/drafter"}}
    assert tracking.flatten_config(cfg) == {"trainer.max_epochs": "2", "checkpoint.save_last": "True"}



@pytest.mark.parametrize("exc, status", [(RuntimeError("x"), "FAILED"), (KeyboardInterrupt(), "KILLED")])
def test_mark_failed_on_error(exc, status):
    from mlflow.tracking import MlflowClient

    logger = tracking.make_mlflow_logger("tracking-test", "r", variant="backbone", table="t1")
    run_id = logger.run_id  # starts the run
    with pytest.raises(type(exc)):
        with tracking.mark_failed_on_error([logger]):
            raise exc
    run = MlflowClient(tracking.default_tracking_uri()).get_run(run_id)
    assert run.info.status == status and run.data.tags["table"] == "t1"
