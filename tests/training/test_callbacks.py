"""SpeculativeEvalCallback: real speculative decoding during training, logged to MLflow with plots."""

from __future__ import annotations

import math
import os

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lit_domino.training.callbacks import SpeculativeEvalCallback, evaluate_speculative
from lit_domino.models import build_drafter, drafter_config
from lit_domino.testing import random_target

VOCAB = 96
PROMPTS = {"math": [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]], "code": [[20, 21, 22], [30, 31]]}


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: threads only contend


class TinyModule(L.LightningModule):
    """The contract the callback relies on: ``.drafter`` bound to ``.target``."""

    def __init__(self):
        super().__init__()
        self.target = random_target(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                                    intermediate_size=64, seed=0)
        self.target.model.generation_config.eos_token_id = None
        torch.manual_seed(0)
        cfg = drafter_config("backbone", self.target, num_layers=1, block_size=4)
        self.drafter = build_drafter(cfg, self.target)

    def training_step(self, batch, batch_idx):
        return sum(p.pow(2).sum() for p in self.drafter.parameters()) * 1e-6

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", torch.tensor(1.0))

    def configure_optimizers(self):
        return torch.optim.SGD(self.drafter.parameters(), lr=1e-3)


def loader():
    return DataLoader(TensorDataset(torch.zeros(2, 1)), batch_size=1)


def test_evaluate_speculative_metric_names():
    m = TinyModule()
    metrics, per_domain = evaluate_speculative(m.target, m.drafter, PROMPTS, max_new_tokens=6)
    from lit_domino.decoding import generate

    everything = []
    for d in ("math", "code"):  # the callback's τ is the engine's, prompt by prompt (the papers' mean of means)
        results = [generate(m.target, m.drafter, torch.tensor([p]), max_new_tokens=6, seed=i)
                   for i, p in enumerate(PROMPTS[d])]
        everything += results
        assert metrics[f"{d}/tau"] == pytest.approx(sum(r.tau for r in results) / len(results))
        assert 1.0 <= metrics[f"{d}/tau"] <= 4.0  # B = 4: at most 3 drafts + the bonus per round
        assert 0.0 <= metrics[f"{d}/acc_rate_pos_01"] <= 1.0
        assert math.isfinite(metrics[f"{d}/speedup"]) and metrics[f"{d}/speedup"] > 0
    assert metrics["tau"] == pytest.approx(sum(r.tau for r in everything) / len(everything))  # pooled over prompts
    assert set(per_domain) == {"math", "code"}


def test_callback_logs_metrics_and_plots_to_mlflow(tmp_path):
    from lightning.pytorch.loggers import MLFlowLogger
    from mlflow.tracking import MlflowClient

    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = MLFlowLogger(experiment_name="test_callbacks", tracking_uri=uri,
                          artifact_location=(tmp_path / "mlruns").as_uri())
    cb = SpeculativeEvalCallback(PROMPTS, num_prompts=2, max_new_tokens=6, every_n_epochs=2, dloop="-0.5:2")
    trainer = L.Trainer(max_epochs=3, logger=logger, callbacks=[cb], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=1,
                        accelerator="cpu", devices=1, log_every_n_steps=1)
    module = TinyModule()
    trainer.fit(module, loader(), loader())
    assert module.drafter.training  # the drafter is handed back in training mode
    client = MlflowClient(uri)
    run = client.get_run(logger.run_id)
    for name in ("tau", "speedup", "math/tau", "code/speedup", "math/acc_rate_pos_01"):
        assert name in run.data.metrics, name
    history = client.get_metric_history(logger.run_id, "math/tau")
    assert len(history) == 2  # epoch 2 (every_n_epochs) and fit end (epoch 3)
    arts = [a.path for a in client.list_artifacts(logger.run_id, "spec_eval")]
    assert sum(a.endswith(".png") for a in arts) == 4 and any("acceptance" in a for a in arts)


def test_callback_rejects_bad_arguments():
    with pytest.raises(ValueError, match="prompts"):
        SpeculativeEvalCallback({})
    with pytest.raises(ValueError, match="no prompts"):
        SpeculativeEvalCallback({"math": []})
    with pytest.raises(ValueError, match="empty prompt"):
        SpeculativeEvalCallback({"math": [[]]})
    with pytest.raises(ValueError, match="every_n_epochs"):
        SpeculativeEvalCallback(PROMPTS, every_n_epochs=0)
    with pytest.raises(ValueError, match="never positive"):
        SpeculativeEvalCallback(PROMPTS, dloop="0.3:2")
    with pytest.raises(ValueError, match="'/'"):
        SpeculativeEvalCallback({"a/b": [[1, 2]]})
