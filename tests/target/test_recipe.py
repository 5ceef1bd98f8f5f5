"""The embedded target's build: exact resume mid-epoch, summed training time, a lock, no stub
folders, the caller's random state untouched (on a config small enough to train in seconds)."""

from __future__ import annotations

import threading
import time

import lightning as L
import pytest
import torch

from lit_domino.runtime import cache
from lit_domino.target import recipe as tt

CFG = tt.TinyTargetConfig(
    name="unit", vocab_size=300, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16,
    intermediate_size=64, max_positions=128, examples_per_domain=(("math", 4), ("code", 2), ("chat", 2)),
    seq_len=96, batch_size=4, max_steps=14, eval_examples=2,
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory, one_thread):
    return tt.build_tokenizer(CFG, root=tmp_path_factory.mktemp("tok"))


class _Interrupt(L.Callback):
    """Fails the training after optimizer step ``at`` (a crash, a SIGTERM, a power cut...)."""

    def __init__(self, at: int):
        self.at = at

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.at:
            raise RuntimeError(f"interrupted at step {self.at}")


class _Sleep(L.Callback):
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == 1:
            time.sleep(1.0)


def test_sampler_reproduces_the_shuffled_loader_of_earlier_builds():
    """Builds made before the resumable sampler (DataLoader(shuffle=True, generator)) keep their batches."""
    from torch.utils.data import DataLoader, TensorDataset

    n, bs = 23, 4
    old = DataLoader(TensorDataset(torch.arange(n)), batch_size=bs, shuffle=True, drop_last=True,
                     generator=torch.Generator().manual_seed(5))
    sampler = tt.EpochSampler(n, seed=5)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        mine = list(sampler)[: (n // bs) * bs]
        it = iter(old)  # as Lightning's loop draws it: len(old) batches, the sampler never run dry
        assert [i for _ in range(len(old)) for i in next(it)[0].tolist()] == mine


def test_interrupted_build_resumes_exactly(tokenizer, tmp_path, one_thread):
    windows = tt.pack_windows([tokenizer(tt.render(e), add_special_tokens=False)["input_ids"]
                               for e in tt.corpus_examples(CFG)], CFG.seq_len, tokenizer.bos_token_id)
    per_epoch = len(windows) // CFG.batch_size
    # 4 batches an epoch: checkpoints at steps 3, 6, 9, 12; step 6 is mid-epoch 1, step 12 ends epoch 2
    assert per_epoch == 4, per_epoch

    reference, _ = tt.train_model(CFG, tokenizer, tmp_path / "straight", progress=False, checkpoint_every=3)

    work = tmp_path / "interrupted"
    with pytest.raises(RuntimeError, match="step 7"):  # after the checkpoint of step 6, mid-epoch
        tt.train_model(CFG, tokenizer, work, progress=False, checkpoint_every=3, callbacks=[_Sleep(), _Interrupt(7)])
    carried = torch.load(work / "ckpt" / "last.ckpt", weights_only=False)["lit_domino"]["train_seconds"]
    assert carried >= 1.0  # the first segment's time (it slept a second) is in the checkpoint
    with pytest.raises(RuntimeError, match="step 13"):  # resumed at step 6; then from step 12's checkpoint
        tt.train_model(CFG, tokenizer, work, progress=False, checkpoint_every=3, callbacks=[_Interrupt(13)])
    resumed, stats = tt.train_model(CFG, tokenizer, work, progress=False, checkpoint_every=3)

    for (name, a), b in zip(reference.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"{name} differs after resuming")
    assert stats["train_segments"] == 3
    assert stats["train_seconds"] >= carried  # summed over the segments, not the last one only


def test_build_leaves_the_callers_random_state_alone(tokenizer, tmp_path, one_thread):
    torch.manual_seed(123)
    before = torch.get_rng_state()
    cfg = tt.with_overrides(CFG, max_steps=2)
    tt.train_model(cfg, tokenizer, tmp_path, progress=False)
    assert torch.equal(torch.get_rng_state(), before)


def test_failed_build_leaves_no_stub_folder(tmp_path, monkeypatch, tokenizer):
    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(tt, "train_model", broken)
    monkeypatch.setattr(tt, "build_tokenizer", lambda cfg, root=None: tokenizer)
    with pytest.raises(RuntimeError, match="out of memory"):
        tt.build_tiny_target(CFG, root=tmp_path, progress=False)
    assert not tt.target_dir(CFG, tmp_path).exists()


def test_tokenizer_is_trained_once_by_concurrent_builders(tmp_path, monkeypatch):
    """Two builders of one tokenizer at once: one trains it, the other waits and reuses it."""
    real, calls = tt.train_tokenizer, []

    def slow(*args, **kwargs):
        calls.append(1)
        time.sleep(0.5)  # both builders would be inside without the lock
        return real(*args, **kwargs)

    monkeypatch.setattr(tt, "train_tokenizer", slow)
    cfg = tt.with_overrides(CFG, examples_per_domain=(("math", 3),))
    out = []
    threads = [threading.Thread(target=lambda: out.append(tt.build_tokenizer(cfg, root=tmp_path))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(out) == 2 and len(calls) == 1
    assert out[0].get_vocab() == out[1].get_vocab()
    tok_dirs = [p for p in (tmp_path / "tokenizer").iterdir() if not p.name.startswith(".")]
    assert len(tok_dirs) == 1 and cache.is_complete(tok_dirs[0])


def test_progress_bar_counts_steps_not_epochs(tokenizer, tmp_path, one_thread):
    """Training by max_steps only (max_epochs -1): Lightning's own bar read "Epoch 0/-2" and restarted every
    epoch; the target's bar is one bar over the optimizer steps."""

    class _Seen(L.Callback):
        def on_train_end(self, trainer, *args):
            bar = trainer.progress_bar_callback
            self.bar = (type(bar), bar.train_progress_bar.total, bar.train_progress_bar.n,
                        bar.train_progress_bar.desc)

    seen = _Seen()
    cfg = tt.with_overrides(CFG, max_steps=5)  # more steps than the windows of one epoch
    tt.train_model(cfg, tokenizer, tmp_path, progress=True, callbacks=[seen])
    kind, total, n, desc = seen.bar
    assert kind is tt.StepProgressBar and total == n == 5
    assert "Epoch" not in desc and "steps" in desc
