"""lit_domino.training.experiment: a crashed train_variant leaves a checkpoint and the rerun resumes from it."""

import json

import lightning as L
import torch
import pytest

from lit_domino.training import configs, experiment


class _Crash(L.Callback):
    """Raise at the start of epoch ``epoch`` (after the previous epoch's checkpoint was written)."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            raise RuntimeError("simulated crash")


class _CountSteps(L.Callback):
    def __init__(self):
        self.batches = 0

    def on_train_batch_end(self, *args):
        self.batches += 1


def test_crashed_training_resumes_from_its_checkpoint(tiny_target_dir, tmp_path, one_thread):
    from mlflow.tracking import MlflowClient

    from lit_domino.runtime.tracking import default_tracking_uri

    cfg = configs.load_config("backbone", "smoke", overrides={
        "data.target": str(tiny_target_dir), "data.train_examples": {"math": 4, "code": 2, "chat": 2},
        "data.val_examples": {"math": 2, "code": 1, "chat": 1}, "data.max_new_tokens": 16, "data.batch_size": 4,
        "data.num_anchors": 4, "data.max_length": 128, "trainer.max_epochs": 2})
    with pytest.raises(RuntimeError, match="simulated crash"):
        experiment.train_variant(cfg, callbacks=[_Crash(epoch=1)], progress=False, root=tmp_path)
    path = experiment.drafter_artifact(cfg, root=tmp_path)
    last = path / "checkpoints" / "last.ckpt"
    assert last.is_file(), "a crash after epoch 0 must leave checkpoints/last.ckpt to resume from"
    run_id = (path / "checkpoints" / "mlflow_run_id").read_text().strip()
    client = MlflowClient(default_tracking_uri())
    assert client.get_run(run_id).info.status == "FAILED"

    counter = _CountSteps()
    done = experiment.train_variant(cfg, callbacks=[counter], progress=False, root=tmp_path)
    steps = done.report["optimizer_steps"]
    assert steps >= 2 and steps % 2 == 0
    assert counter.batches == steps // 2  # only epoch 1 ran again: the rerun resumed, it did not restart
    assert done.run_id == run_id and client.get_run(run_id).info.status == "FINISHED"
    assert not list((path / "checkpoints").glob("*.ckpt"))  # resume state is dropped once the drafter is exported
    assert json.loads((path / "report.json").read_text())["optimizer_steps"] == steps


def test_training_interrupted_before_its_first_checkpoint_continues_its_mlflow_run(tiny_target_dir, tmp_path,
                                                                                    one_thread):
    """One MLflow run per trained artifact: a rerun after a crash at step 0 reuses the run, it does not add one."""
    from mlflow.tracking import MlflowClient

    from lit_domino.runtime.tracking import default_tracking_uri

    cfg = configs.load_config("backbone", "smoke", overrides={
        "data.target": str(tiny_target_dir), "data.train_examples": {"math": 4, "code": 2, "chat": 2},
        "data.val_examples": {"math": 2, "code": 1, "chat": 1}, "data.max_new_tokens": 16, "data.batch_size": 4,
        "data.num_anchors": 4, "data.max_length": 128, "trainer.max_epochs": 1})
    with pytest.raises(RuntimeError, match="simulated crash"):
        experiment.train_variant(cfg, experiment="interrupted-early", callbacks=[_Crash(epoch=0)], progress=False,
                                 root=tmp_path)
    path = experiment.drafter_artifact(cfg, root=tmp_path)
    assert not (path / "checkpoints" / "last.ckpt").exists()
    run_id = (path / "checkpoints" / "mlflow_run_id").read_text().strip()
    done = experiment.train_variant(cfg, experiment="interrupted-early", progress=False, root=tmp_path)
    client = MlflowClient(default_tracking_uri())
    assert done.run_id == run_id and client.get_run(run_id).info.status == "FINISHED"
    exp = client.get_experiment_by_name("interrupted-early")
    assert [r.info.run_id for r in client.search_runs([exp.experiment_id])] == [run_id]


class _CrashAtStep(L.Callback):
    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError("simulated crash")


def test_training_interrupted_mid_epoch_resumes_to_the_uninterrupted_weights(tiny_target_dir, tmp_path, one_thread):
    """last.ckpt every 2 steps, a crash at step 3 of a 4-step epoch: the resumed training continues with the
    next unseen batch (it does not replay the epoch) and ends with the weights of an uninterrupted one."""
    from safetensors.torch import load_file

    cfg = configs.load_config("backbone", "smoke", overrides={
        "data.target": str(tiny_target_dir), "data.train_examples": {"math": 8, "code": 4, "chat": 4},
        "data.val_examples": {"math": 2, "code": 1, "chat": 1}, "data.max_new_tokens": 16, "data.batch_size": 4,
        "data.num_anchors": 4, "data.max_length": 128, "trainer.max_epochs": 2, "tracking.enabled": False,
        "checkpoint.resume_every_n_steps": 2})
    whole = experiment.train_variant(cfg, progress=False, root=tmp_path / "whole")
    with pytest.raises(RuntimeError, match="simulated crash"):
        experiment.train_variant(cfg, callbacks=[_CrashAtStep(3)], progress=False, root=tmp_path / "split")
    counter = _CountSteps()
    resumed = experiment.train_variant(cfg, callbacks=[counter], progress=False, root=tmp_path / "split")
    steps = whole.report["optimizer_steps"]
    assert resumed.report["optimizer_steps"] == steps and counter.batches == steps - 2  # from the step-2 checkpoint
    a, b = load_file(str(whole.drafter_dir / "model.safetensors")), load_file(str(resumed.drafter_dir / "model.safetensors"))
    for name in a:
        assert torch.equal(a[name], b[name]), name
