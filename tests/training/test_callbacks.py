"""SpeculativeEvalCallback: real speculative decoding during training, logged to MLflow with plots."""

from __future__ import annotations

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


def _recording_generate(monkeypatch) -> list:
    """The callback's decodes, recorded: ``(drafter or None, result)`` in call order."""
    from lit_domino.training import callbacks

    calls, real = [], callbacks.generate

    def record(target, drafter, *args, **kwargs):
        out = real(target, drafter, *args, **kwargs)
        calls.append((drafter, out))
        return out

    monkeypatch.setattr(callbacks, "generate", record)
    return calls


def test_evaluate_speculative_metric_names(monkeypatch):
    from statistics import fmean

    m = TinyModule()
    calls = _recording_generate(monkeypatch)
    metrics, per_domain = evaluate_speculative(m.target, m.drafter, PROMPTS, max_new_tokens=6)
    from lit_domino.decoding import generate

    assert [d is None for d, _ in calls[:2]] == [False, True]  # the untimed warm-ups: drafter, then AR
    decodes, spec_all, base_all = calls[2:], [], []
    for d in ("math", "code"):  # per domain: the drafter on every prompt, then our AR baseline on every prompt
        n = len(PROMPTS[d])
        mine, decodes = decodes[:2 * n], decodes[2 * n:]
        spec, base = [r for dr, r in mine[:n] if dr is m.drafter], [r for dr, r in mine[n:] if dr is None]
        assert len(spec) == len(base) == n
        spec_all, base_all = spec_all + spec, base_all + base
        # the callback's τ is the engine's, prompt by prompt (the papers' mean of means), decoded again here
        again = [generate(m.target, m.drafter, torch.tensor([p]), max_new_tokens=6, seed=i)
                 for i, p in enumerate(PROMPTS[d])]
        assert [r.tokens for r in again] == [r.tokens for r in spec]
        assert metrics[f"{d}/tau"] == pytest.approx(fmean(r.tau for r in again))
        # speedup: our AR baseline's mean time per output token over the drafter's, on the same prompts
        assert metrics[f"{d}/speedup"] == pytest.approx(fmean(r.tpot_ms for r in base) / fmean(r.tpot_ms for r in spec))
        assert metrics[f"{d}/tpot_ms"] == pytest.approx(fmean(r.tpot_ms for r in spec))
    assert not decodes
    assert metrics["tau"] == pytest.approx(fmean(r.tau for r in spec_all))  # pooled over prompts
    assert metrics["speedup"] == pytest.approx(fmean(r.tpot_ms for r in base_all) / fmean(r.tpot_ms for r in spec_all))
    assert set(per_domain) == {"math", "code"}


def test_a_drafter_that_is_always_right_scores_the_block_size():
    """Forced acceptance (every draft the target's greedy token): τ = B and every position accepted; B tokens a
    round over two full rounds (the first output token comes from the prefill)."""
    from lit_domino.testing import OracleMix, hf_greedy

    m, B = TinyModule(), 4
    prompt, n = PROMPTS["math"][0], 1 + 2 * B
    always = OracleMix(m.drafter, prompt + hf_greedy(m.target, prompt, n + B), p=1.0, every_token=True)
    metrics, per_domain = evaluate_speculative(m.target, always, {"math": [prompt], "code": [prompt]},
                                               max_new_tokens=n, measure_speedup=False)
    for d in ("math", "code"):
        assert metrics[f"{d}/tau"] == B and metrics[f"{d}/accepted_per_round"] == B - 1
        assert [metrics[f"{d}/acc_rate_pos_{k:02d}"] for k in range(1, B)] == [1.0] * (B - 1)
    assert metrics["tau"] == B and "speedup" not in metrics and "math/speedup" not in metrics
    # the random drafter this wraps is not: the forcing is what the metrics saw
    plain, _ = evaluate_speculative(m.target, m.drafter, {"math": [prompt]}, max_new_tokens=n, measure_speedup=False)
    assert plain["math/tau"] < B


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
