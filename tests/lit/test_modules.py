"""The LightningModules on a tiny random target and synthetic, learnable batches."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, Dataset

from lit_domino.decoding import generate
from lit_domino.lit import BackboneModule, DominoModule, Eagle3Module, SmallLMModule
from lit_domino.models import DominoHeadConfig
from lit_domino.models.objectives import LambdaSchedule
from lit_domino.testing import hf_greedy, random_target

V, D, LAYERS = 64, 32, 4
FEATURE_LAYERS = [1, 3]


@pytest.fixture(scope="module")
def target():
    t = random_target(vocab_size=V, hidden_size=D, num_layers=LAYERS, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, max_positions=128, seed=0)
    with torch.no_grad():  # a trained LM's (tied) embedding is larger than the 0.02 init: logits can get sharp
        t.embed.weight.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(0))
    return t


def make_rows(target, n_seq=4, T=24, prompt=6, num_anchors=4, seed=0, feature_layers=FEATURE_LAYERS):
    """Learnable sequences ``x_p = 3 + (s + p·step) mod 50`` (step 1 or 2), prompt then response."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, 50, (n_seq, 1), generator=g)
    step = torch.randint(1, 3, (n_seq, 1), generator=g)
    pos = torch.arange(T)[None]
    input_ids = 3 + (start + pos * step) % 50
    attention_mask = torch.ones(n_seq, T, dtype=torch.long)
    loss_mask = (pos >= prompt).long().expand(n_seq, T).clone()
    anchors = torch.linspace(prompt, T - 6, num_anchors).long()[None].expand(n_seq, num_anchors).clone()
    anchor_mask = torch.ones(n_seq, num_anchors, dtype=torch.bool)
    with torch.no_grad():
        features = target.forward_features(input_ids, feature_layers, attention_mask)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask,
            "features": features, "anchors": anchors, "anchor_mask": anchor_mask}


class Rows(Dataset):
    def __init__(self, rows, length):
        self.rows, self.length = rows, length
        self.n = rows["input_ids"].shape[0]

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return {k: v[i % self.n] for k, v in self.rows.items()}


class FixedData(L.LightningDataModule):
    """A DataModule with the batch contract of docs/ARCHITECTURE.md, built from :func:`make_rows`."""

    def __init__(self, target, n_seq=4, batch_size=4, repeat=1, shuffle=False, val=False, feature_layers=None):
        super().__init__()
        self.target, self.feature_layers = target, feature_layers or FEATURE_LAYERS
        self.rows = make_rows(target, n_seq=n_seq, feature_layers=self.feature_layers)
        self.batch_size, self.repeat, self.shuffle, self.val = batch_size, repeat, shuffle, val

    def load_target(self):
        return self.target

    def train_dataloader(self):
        n = self.rows["input_ids"].shape[0]
        return DataLoader(Rows(self.rows, n * self.repeat), batch_size=self.batch_size, shuffle=self.shuffle)

    def val_dataloader(self):
        return DataLoader(Rows(self.rows, self.rows["input_ids"].shape[0]), batch_size=self.batch_size)


def trainer(tmp_path, max_steps=-1, max_epochs=1, callbacks=(), logger=False, val=False, log_every_n_steps=50):
    return L.Trainer(
        accelerator="cpu", devices=1, max_epochs=max_epochs, max_steps=max_steps, logger=logger,
        enable_progress_bar=False, enable_model_summary=False, callbacks=list(callbacks),
        limit_val_batches=1.0 if val else 0, num_sanity_val_steps=0, default_root_dir=tmp_path,
        gradient_clip_val=1.0, enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        deterministic=True, log_every_n_steps=log_every_n_steps,
    )


SMALL = dict(num_layers=1, block_size=4, lr=1e-2, warmup_ratio=0.0, min_lr_ratio=0.1)

VARIANTS = {
    "backbone": lambda t: BackboneModule(target=t, **SMALL),
    "domino": lambda t: DominoModule(target=t, head=DominoHeadConfig(rank=16, gru_hidden=32), **SMALL),
    "domino_ttt": lambda t: DominoModule(target=t, head=DominoHeadConfig(rank=16, gru_hidden=32),
                                         causal_inputs="training_time_test",
                                         curriculum=LambdaSchedule("linear", ratio=0.5), **SMALL),
    "eagle3": lambda t: Eagle3Module(target=t, ttt_steps=3, num_layers=1, lr=1e-2, warmup_ratio=0.0),
    "small_lm": lambda t: SmallLMModule(target=t, num_layers=1, block_size=4, lr=1e-2, warmup_ratio=0.0),
}


class LossRecorder(Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_variant_trains_on_after_decoding(tmp_path, target, variant):
    """``generate`` runs the drafter in ``torch.inference_mode``: what it leaves cached on the drafter (RoPE
    tables) must not break the next training step (the eval callback decodes mid-training), and the next
    decode uses the updated weights."""
    torch.manual_seed(0)
    module = VARIANTS[variant](target)
    data = FixedData(target, repeat=2, feature_layers=target.layer_ids("eagle3") if variant == "eagle3" else None)
    trainer(tmp_path, max_steps=1).fit(module, datamodule=data)
    drafter, prompt = module.drafter, data.rows["input_ids"][0, :6]
    greedy = hf_greedy(target, prompt.tolist(), 10)
    assert generate(target, drafter, prompt, max_new_tokens=10).tokens == greedy
    drafter.train()
    batch = next(iter(data.train_dataloader()))
    module.forward_step(batch, "train").loss.backward()  # raises if an inference tensor was saved for backward
    with torch.no_grad():
        for p in drafter.parameters():
            if p.grad is not None:
                p -= 0.5 * p.grad
    assert generate(target, drafter, prompt, max_new_tokens=10).tokens == greedy


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_variant_overfits_a_fixed_batch(tmp_path, target, variant):
    torch.manual_seed(0)
    module = VARIANTS[variant](target)
    rec = LossRecorder()
    t = trainer(tmp_path, callbacks=[rec], val=True)
    layers = target.layer_ids("eagle3") if variant == "eagle3" else None
    t.fit(module, datamodule=FixedData(target, repeat=50, val=True, feature_layers=layers))
    first, last = rec.losses[0], sum(rec.losses[-5:]) / 5
    assert len(rec.losses) == 50
    assert last < 0.4 * first and last < 0.35 * math.log(V), f"{variant}: loss {first:.3f} -> {last:.3f}"
    logged = t.callback_metrics
    assert "val/tau_sim" in logged and "val/acc_pos_01" in logged and "val/tau_prefix" in logged
    assert 1.0 <= float(logged["val/tau_sim"]) <= module.metric_block_size
    assert float(logged["val/tau_prefix"]) > 2.5  # the learnt drafter's blocks are mostly accepted
    # the target is shared with the DataModule, not a submodule: never in checkpoints or the optimizer
    assert module.target is t.datamodule.target
    assert not any(k.startswith(("target", "_target")) for k in module.state_dict())
    target_params = {id(p) for p in target.model.parameters()}
    opt_params = [p for g in t.optimizers[0].param_groups for p in g["params"]]
    assert not any(id(p) in target_params for p in opt_params)


def test_eagle_head_only_at_labels_equals_the_full_loss(target):
    """Eagle3Module applies the LM head only where a TTT step has a label: same loss, same chains."""
    from lit_domino.lit.eagle import chain_view
    from lit_domino.models.objectives import ttt_loss

    module = VARIANTS["eagle3"](target)
    module.build_drafter(target.layer_ids("eagle3"))
    batch = make_rows(target, feature_layers=target.layer_ids("eagle3"))
    batch["loss_mask"][1, :12] = 0  # rows with different prompt lengths
    out = module.forward_step(batch, "val")
    full = module.drafter.forward_train(batch["input_ids"], batch["features"], batch["loss_mask"],
                                        batch["attention_mask"])
    loss, _ = ttt_loss(full.logits, full.labels, 0.8)
    torch.testing.assert_close(out.loss, loss)
    preds, labels = chain_view([l.argmax(-1) for l in full.logits], full.labels)
    scored = labels != -100
    assert torch.equal(out.labels, labels) and torch.equal(out.preds[scored], preds[scored])


def test_domino_logs_curriculum_and_lambda_falls(tmp_path, target):
    module = DominoModule(target=target, head=DominoHeadConfig(rank=8, gru_hidden=16), **SMALL)
    lams = []

    class Grab(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            lams.append(float(trainer.callback_metrics["train/lambda"]))
            assert {"train/loss_base", "train/loss_final", "train/loss"} <= set(trainer.callback_metrics)

    trainer(tmp_path, callbacks=[Grab()], log_every_n_steps=1).fit(module, datamodule=FixedData(target, repeat=8))
    assert lams[0] == 1.0 and lams == sorted(lams, reverse=True) and lams[-1] == pytest.approx(1 / 8)


def test_domino_zero_up_projection_final_equals_base(target):
    module = DominoModule(target=target, head=DominoHeadConfig(rank=8, gru_hidden=16), **SMALL)
    module.build_drafter(FEATURE_LAYERS)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in module.drafter.head.parameters():
            p.normal_(0, 0.5)  # a trained-looking head ...
        module.drafter.head.up.weight.zero_()  # ... whose up-projection is zero
    batch = make_rows(target)
    for causal in ("teacher_forced", "training_time_test"):
        module.hparams.causal_inputs = causal
        module.curriculum = LambdaSchedule("constant", start=0.3)
        out = module.forward_step(batch, "train")
        assert float(out.logs["loss_final"]) == pytest.approx(float(out.logs["loss_base"]), abs=1e-6)
        assert float(out.loss) == pytest.approx(float(out.logs["loss_base"]), abs=1e-6)


def test_bad_hyperparameters_fail_clearly(target):
    with pytest.raises(ValueError, match=r"head\.rank must be a positive integer .*got 0"):
        DominoModule(target=target, head={"rank": 0})  # a mapping (a checkpoint's hparams) is checked the same
    with pytest.raises(ValueError, match=r"head\.gru_hidden must be a positive integer .*got True"):
        DominoModule(target=target, head=DominoHeadConfig(gru_hidden=True))
    with pytest.raises(ValueError, match=r"rank moved to head\.rank: pass head=DominoHeadConfig"):
        DominoModule(target=target, rank=8)  # the former flat argument names its new place
    with pytest.raises(ValueError, match=r"head: unknown DominoHeadConfig field\(s\) \['rnak'\]"):
        DominoModule(target=target, head={"rnak": 8})
    with pytest.raises(ValueError, match=r"drafter_options \['head'\]: set by DominoModule's own argument"):
        DominoModule(target=target, drafter_options={"head": {"rank": 8}})  # one place per setting
    with pytest.raises(ValueError, match="block_size"):
        BackboneModule(target=target, block_size=1)
    with pytest.raises(ValueError, match="gamma"):
        BackboneModule(target=target, gamma=0.0)
    with pytest.raises(ValueError, match="causal_inputs"):
        DominoModule(target=target, causal_inputs="sometimes")


class Crash(Callback):
    """Kills the run (an exception) at a given epoch/batch, after earlier epochs were checkpointed."""

    def __init__(self, epoch, batch):
        self.epoch, self.batch = epoch, batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.current_epoch == self.epoch and batch_idx == self.batch:
            raise RuntimeError("simulated kill")


def _fit(tmp_path, target, name, callbacks=(), ckpt_path=None):
    L.seed_everything(0, workers=True)
    module = DominoModule(target=target, head=DominoHeadConfig(rank=8, gru_hidden=16), **SMALL)
    ckpt = ModelCheckpoint(dirpath=tmp_path / name, save_last=True, every_n_epochs=1)
    t = trainer(tmp_path / name, max_epochs=3, callbacks=[ckpt, *callbacks], val=True)
    t.fit(module, datamodule=FixedData(target, n_seq=8, batch_size=2, shuffle=True, val=True), ckpt_path=ckpt_path)
    return module


def test_resume_from_last_checkpoint_equals_uninterrupted(tmp_path, target):
    ref = _fit(tmp_path, target, "straight")
    with pytest.raises(RuntimeError, match="simulated kill"):
        _fit(tmp_path, target, "killed", callbacks=[Crash(epoch=1, batch=2)])
    assert (tmp_path / "killed" / "last.ckpt").is_file()
    resumed = _fit(tmp_path, target, "killed", ckpt_path="last")
    assert resumed.trainer.global_step == ref.trainer.global_step == 12
    a, b = ref.drafter.state_dict(), resumed.drafter.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory):
    """One SQLite MLflow store in a tmp dir for this module's tracking tests (creating one takes seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def test_crashed_run_is_marked_failed_in_mlflow(tmp_path, target, mlflow_uri):
    from mlflow.tracking import MlflowClient

    from lit_domino.runtime.tracking import make_mlflow_logger

    class Boom(BackboneModule):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    uri = mlflow_uri
    logger = make_mlflow_logger("crash-test", "boom", variant="backbone", preset="smoke", seed=0, tracking_uri=uri)
    with pytest.raises(RuntimeError, match="boom"):
        trainer(tmp_path, logger=logger).fit(Boom(target=target, **SMALL), datamodule=FixedData(target))
    run = MlflowClient(uri).get_run(logger.run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["variant"] == "backbone" and run.data.tags["preset"] == "smoke"


def test_plain_mlflow_run_marked_failed(mlflow_uri):
    from mlflow.tracking import MlflowClient

    from lit_domino.runtime.tracking import mlflow_run

    uri = mlflow_uri
    with pytest.raises(ValueError, match="bad"):
        with mlflow_run("plain", "r", tracking_uri=uri) as run:
            raise ValueError("bad")
    assert MlflowClient(uri).get_run(run.info.run_id).info.status == "FAILED"


def test_a_checkpoint_keeps_the_head_as_plain_types_and_a_flat_one_is_refused(tmp_path, target):
    """The head travels in the hparams as a plain dict (``torch.load(weights_only=True)`` reads it) and rebuilds
    the same module; a checkpoint written with the head's fields flat (before the head section) is refused
    naming the new key, not read with the default head."""
    import lightning

    module = DominoModule(target=target, head=DominoHeadConfig(rank=8, gru_hidden=16), **SMALL)
    module.build_drafter(FEATURE_LAYERS)
    ckpt = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
            "pytorch-lightning_version": lightning.__version__}
    torch.save(ckpt, tmp_path / "new.ckpt")
    hparams = torch.load(tmp_path / "new.ckpt", weights_only=True)["hyper_parameters"]
    assert hparams["head"] == {"rank": 8, "gru_hidden": 16}
    restored = DominoModule.load_from_checkpoint(tmp_path / "new.ckpt", target=target)
    assert restored.head_config == module.head_config and restored.drafter_options() == module.drafter_options()
    flat = {k: v for k, v in hparams.items() if k != "head"} | {"rank": 8, "gru_hidden": 16}
    torch.save({**ckpt, "hyper_parameters": flat}, tmp_path / "old.ckpt")
    with pytest.raises(ValueError, match=r"rank moved to head\.rank, gru_hidden moved to head\.gru_hidden: .*"
                                         r"written by an older lit_domino"):
        DominoModule.load_from_checkpoint(tmp_path / "old.ckpt", target=target)


def test_save_drafter_roundtrip(tmp_path, target):
    from lit_domino.interop import load_drafter

    module = BackboneModule(target=target, **SMALL)
    module.build_drafter(FEATURE_LAYERS)
    path = module.save_drafter(tmp_path / "drafter")
    loaded = load_drafter(path, target=target)
    for k, v in module.drafter.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k])
    assert loaded.config == module.drafter.config and loaded.kind == "backbone"
