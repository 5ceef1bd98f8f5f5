"""lit_domino.studies.sweep.objective: a trial's config, pruning granularity, evaluators, and one sweep through the
real train_variant + speculative decoding path."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.trial import TrialState

from lit_domino.studies import sweep


def test_trial_config_of_the_shipped_space():
    space = sweep.load_space()
    cfg = sweep.trial_config(sweep.SweepSettings(preset="smoke", max_steps=5), space,
                             {"rank": 17, "gru_hidden": 40, "lambda_kind": "cosine", "lambda_start": 0.5,
                              "lambda_ratio": 0.75})
    init = cfg["model"]["init_args"]
    assert init["head"] == {"rank": 17, "gru_hidden": 40}
    assert init["curriculum"] == {"kind": "cosine", "start": 0.5, "ratio": 0.75, "step_every": 0.25}
    assert cfg["trainer"]["max_steps"] == 5 and cfg["trainer"]["val_check_interval"] == 5  # validation happens


def test_resolve_evaluator():
    assert sweep.resolve_evaluator(None) is sweep.train_and_decode
    assert sweep.resolve_evaluator("sweep_fakes:fake_evaluator").__name__ == "fake_evaluator"
    for spec, message in [("no-colon", "module:function"), ("sweep_fakes:absent", "cannot import"),
                          ("sweep_fakes:ROOT", "not callable")]:
        with pytest.raises(sweep.SweepError, match=message):
            sweep.resolve_evaluator(spec)


# --------------------------------------------------------------------------- pruning granularity


def _fit_with_pruning(trial, **trainer_kwargs):
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(1, 1)

        def training_step(self, batch, i):
            return self.w(batch[0]).pow(2).mean()

        def validation_step(self, batch, i):
            self.log("val/tau_sim", 1.0 + self.global_step / 10)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    cb = sweep.PruningCallback(trial)
    data = lambda: DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=1)  # noqa: E731
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=1, callbacks=[cb], **trainer_kwargs)
    trainer.fit(Tiny(), data(), data())
    return cb


def test_pruning_reports_once_per_validation_at_the_right_step():
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.NopPruner())
    trial = study.ask()
    cb = _fit_with_pruning(trial, max_epochs=2)  # once per epoch: step = epoch
    assert [s for s, _ in cb.reported] == [0, 1]
    trial = study.ask()
    cb = _fit_with_pruning(trial, max_epochs=2, val_check_interval=2)  # every 2 steps: step = optimizer step
    assert [s for s, _ in cb.reported] == [2, 4, 6, 8]
    assert study.trials[trial.number].intermediate_values == pytest.approx({2: 1.2, 4: 1.4, 6: 1.6, 8: 1.8})
    pruning = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=5.0))
    with pytest.raises(optuna.TrialPruned, match="pruned at step 0"):
        _fit_with_pruning(pruning.ask(), max_epochs=3)
    with pytest.raises(ValueError, match="granularity"):
        sweep.PruningCallback(pruning.ask(), granularity="batch")


# --------------------------------------------------------------------------- the real path


class _PruneTrialOne(optuna.pruners.BasePruner):
    def prune(self, study, trial) -> bool:
        return trial.number == 1


def test_real_sweep_trains_and_decodes(tiny_target_dir, tmp_path):
    """Real train_variant (+ pruning callback) and real speculative decoding on a tiny random target."""
    import torch
    from mlflow.tracking import MlflowClient

    from lit_domino.runtime.tracking import default_tracking_uri

    torch.set_num_threads(1)
    settings = sweep.SweepSettings(
        study_name="real", storage=f"sqlite:///{tmp_path / 'real.db'}", preset="smoke", n_trials=2, sampler_seed=1,
        heartbeat=0, pruner=_PruneTrialOne(), max_steps=2, prompts_per_domain=1, max_new_tokens=8,
        overrides={"data.target": str(tiny_target_dir), "data.train_examples": {"math": 4, "code": 2, "chat": 2},
                   "data.val_examples": {"math": 2, "code": 1, "chat": 1}, "data.max_new_tokens": 16,
                   "data.batch_size": 4, "data.num_anchors": 4, "data.max_length": 128})
    space = sweep.load_space()
    study = sweep.run_worker(settings, space, echo=lambda *_: None)
    done, pruned = study.trials
    assert done.state == TrialState.COMPLETE and pruned.state == TrialState.PRUNED
    assert math.isfinite(done.value)
    assert list(done.intermediate_values) == [2]  # val/tau_sim reported at optimizer step 2
    client = MlflowClient(default_tracking_uri())
    parent = study.user_attrs[sweep.RUN_ATTR]
    run = client.get_run(done.user_attrs["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.tags["variant"] == "domino" and run.data.params["model.head.rank"] == str(done.params["rank"])
    for key in ("objective", "tau", "speedup", "embedded-math/tau", "embedded-chat/speedup", "val/tau_sim"):
        assert key in run.data.metrics, key
    # the objective is the trial's τ: the mean over the benchmarks of each one's decoded τ
    per_benchmark = [v for k, v in run.data.metrics.items() if k.startswith("embedded-") and k.endswith("/tau")]
    assert len(per_benchmark) == 3 and done.value == pytest.approx(run.data.metrics["objective"])
    assert done.value == pytest.approx(run.data.metrics["tau"])
    assert run.data.metrics["tau"] == pytest.approx(sum(per_benchmark) / 3)
    assert len(client.get_metric_history(run.info.run_id, "train/loss")) >= 1  # the training curve
    killed = client.get_run(pruned.user_attrs["mlflow_run_id"])
    assert killed.info.status == "KILLED" and killed.data.tags["optuna.state"] == "PRUNED"

    # the same configuration again: the cached drafter is reused, decoded, and logged as a new nested run
    study.enqueue_trial(done.params)
    settings.n_trials = 3
    study = sweep.run_worker(settings, space, echo=lambda *_: None)
    again = study.trials[2]
    assert again.state == TrialState.COMPLETE and again.value == pytest.approx(done.value, rel=0, abs=1e-9)
    run = client.get_run(again.user_attrs["mlflow_run_id"])
    assert run.info.run_id != done.user_attrs["mlflow_run_id"]
    assert run.data.tags["drafter_run_id"] == done.user_attrs["mlflow_run_id"]
    assert run.data.tags["mlflow.parentRunId"] == parent
