"""GPU checks, skipped without CUDA (CI has none; run them on a GPU box with ``pytest tests/test_cuda.py``).

Every drafter decodes losslessly on the GPU (fp32 target; real sessions, forced acceptances,
DLoop on and off, block sizes 4/8/16), sampling is reproducible there, and every variant
trains in bf16-mixed through Lightning with the frozen target moved to the GPU.
"""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lit_domino.training.datamodule import collate, sample_anchors
from lit_domino.decoding import DLoopConfig, generate
from lit_domino.lit import BackboneModule, DominoModule, Eagle3Module, SmallLMModule
from lit_domino.models import DominoHeadConfig, build_drafter, drafter_config, kinds
from lit_domino.testing import OracleMix, hf_greedy, lively_target, random_target

KINDS = kinds()

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

VOCAB = 128


@pytest.fixture(scope="module")
def target():
    t = lively_target(VOCAB, seed=0)
    t.model.to("cuda")
    return t


def cuda_drafter(target, kind, block_size=16):
    torch.manual_seed(0)
    small = dict(head=dict(rank=16, gru_hidden=32)) if kind == "domino" else {}
    cfg = drafter_config(kind, target, block_size=block_size, num_layers=1, **small)
    return build_drafter(cfg, target).to("cuda")


@pytest.mark.parametrize("kind", KINDS)
def test_every_drafter_is_lossless_on_cuda(target, kind):
    g = torch.Generator().manual_seed(KINDS.index(kind))
    drafter, n, accepted = cuda_drafter(target, kind), 24, []
    for i in range(8):
        prompt = torch.randint(3, VOCAB - 1, (int(torch.randint(3, 9, (), generator=g)),), generator=g).tolist()
        expected = hf_greedy(target, prompt, n)
        reference = prompt + hf_greedy(target, prompt, n + 3 * 15 + 1)
        block_size = (4, 8, 16)[i % 3]
        dloop = DLoopConfig(threshold=-4.0, max_stages=3) if i % 2 else None
        ids = torch.tensor([prompt], device="cuda")
        for d in (drafter, OracleMix(drafter, reference, seed=i)):
            res = generate(target, d, ids, max_new_tokens=n, block_size=block_size, dloop=dloop)
            assert res.tokens == expected, (kind, i, block_size, dloop, type(d).__name__)
            accepted += res.accepted_per_round
    assert 0 in accepted and max(accepted) >= 3


def test_sampling_on_cuda_is_reproducible(target):
    drafter = cuda_drafter(target, "domino", block_size=4)
    ids = torch.tensor([[5, 9, 11, 4]], device="cuda")
    a, b = (generate(target, drafter, ids, max_new_tokens=16, temperature=0.8, seed=3) for _ in range(2))
    assert a.tokens == b.tokens and len(a.tokens) == 16


@pytest.mark.parametrize("pool_size", [None, 16])
def test_compiled_domino_on_cuda_decodes_what_eager_does(target, pool_size):
    """``compile=True`` on CUDA (CUDA graphs: the target's verify, the block forward, Domino's rollout) gives the
    eager path's tokens and rounds, first call and replay, and the head's decode tables are static inputs
    (read in place by the graphs, not copied in at every replay)."""
    drafter = cuda_drafter(target, "domino", block_size=8)
    torch.nn.init.normal_(drafter.head.up.weight, std=0.5)  # a correction that changes picks
    ids = torch.tensor([[5, 9, 11, 4, 7]], device="cuda")
    eager = generate(target, drafter, ids, max_new_tokens=24, pool_size=pool_size)
    for _ in range(2):
        compiled = generate(target, drafter, ids, max_new_tokens=24, pool_size=pool_size, compile=True)
        assert compiled.tokens == eager.tokens and compiled.accepted_per_round == eager.accepted_per_round
    tables = drafter.head.decode_tables(drafter.embed.weight)
    assert all(getattr(t, "_dynamo_static_input_type", None) for t in vars(tables).values())


class _Rows(Dataset):
    """Learnable sequences ``x_p = 3 + (s + 2p) mod 50``: 6 prompt tokens, then the response."""

    def __init__(self, n=32, T=40):
        start = torch.arange(n)[:, None] % 50
        self.ids = 3 + (start + 2 * torch.arange(T)[None]) % 50
        self.loss_mask = (torch.arange(T) >= 6).long()

    def __len__(self):
        return self.ids.shape[0]

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "loss_mask": self.loss_mask, "index": i}


class _Data(L.LightningDataModule):
    """Online features from the (GPU) target, anchors drawn per batch: the DataModule batch contract."""

    def __init__(self, target, feature_layers):
        super().__init__()
        self.target, self.feature_layers = target, feature_layers

    def load_target(self):
        return self.target

    def train_dataloader(self):
        return DataLoader(_Rows(), batch_size=8, shuffle=True, collate_fn=lambda items: collate(items, 0))

    def on_after_batch_transfer(self, batch, dataloader_idx):
        with torch.no_grad():
            batch["features"] = self.target.forward_features(batch["input_ids"], self.feature_layers,
                                                             batch["attention_mask"]).float()
        g = torch.Generator().manual_seed(int(batch["index"][0]))
        anchors, mask = sample_anchors(batch["loss_mask"].cpu(), 4, g)
        batch["anchors"], batch["anchor_mask"] = anchors.to(batch["input_ids"].device), mask.to(batch["input_ids"].device)
        return batch


VARIANTS = {
    "backbone": lambda t: BackboneModule(target=t, num_layers=1, block_size=4, lr=1e-2, warmup_ratio=0.0),
    "domino": lambda t: DominoModule(target=t, num_layers=1, block_size=4, head=DominoHeadConfig(rank=16, gru_hidden=32),
                                     lr=1e-2, warmup_ratio=0.0),
    "eagle3": lambda t: Eagle3Module(target=t, ttt_steps=3, num_layers=1, lr=1e-2, warmup_ratio=0.0),
    "small_lm": lambda t: SmallLMModule(target=t, num_layers=1, block_size=4, lr=1e-2, warmup_ratio=0.0),
}


def learnable_target():
    """A quiet random target (its features keep the token identity) with a trained-size embedding."""
    t = random_target(vocab_size=64, hidden_size=32, num_layers=4, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, max_positions=128, seed=0)
    with torch.no_grad():
        t.embed.weight.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(0))
    return t


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_variant_trains_in_bf16_on_gpu(tmp_path, variant):
    fit_bf16(tmp_path, variant, "gpu")


def fit_bf16(tmp_path, variant, accelerator):
    target = learnable_target()  # on the CPU: fit's on_fit_start moves it to the accelerator
    module = VARIANTS[variant](target)
    losses, devices = [], set()

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(float(outputs["loss"]))
            devices.update({pl_module.target.device.type, next(pl_module.drafter.parameters()).device.type})

    trainer = L.Trainer(accelerator=accelerator, devices=1, precision="bf16-mixed", max_epochs=15, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        callbacks=[Record()], default_root_dir=tmp_path, limit_val_batches=0)
    layers = target.layer_ids("eagle3") if variant == "eagle3" else [1, 3]
    trainer.fit(module, datamodule=_Data(target, layers))
    assert devices == {"cuda" if accelerator == "gpu" else "cpu"}  # (fit moves the module back to the CPU)
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-4:]) / 4 < 0.5 * losses[0], f"{variant}: {losses[0]:.3f} -> {losses[-4:]}"
