"""LoopModule (DLoop loop-aware fine-tuning): S = 1 is ordinary training, no new parameters, seeded depths,
clear errors, and fine-tuned drafters decode losslessly with DLoop on."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lit_domino.decoding import DLoopConfig, generate
from lit_domino.lit import BackboneModule, DFlash2Module, DominoModule, DSparkModule, Eagle3Module
from lit_domino.lit.loop import LoopModule
from lit_domino.models import build_drafter, drafter_config
from lit_domino.models import DFlash2HeadConfig, DrafterMismatchError, DSparkHeadConfig
from lit_domino.interop import load_drafter
from lit_domino.models.objectives import LambdaSchedule
from lit_domino.testing import hf_greedy, lively_dflash2_, random_target

V, D, B = 64, 32, 5
K = B - 1
KINDS = ("backbone", "domino", "eagle3", "dspark", "dflash2")  # dspark: DeepSpec's sample_from_anchor, the rnn head


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: threads only contend


@pytest.fixture(scope="module")
def target():
    t = random_target(vocab_size=V, hidden_size=D, num_layers=4, num_heads=2, num_kv_heads=1, intermediate_size=64,
                      max_positions=96, seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # varied greedy continuations, sharp logits
        t.embed.weight.normal_(0.0, 0.3, generator=gen)
        for p in t.model.model.layers.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    t.model.generation_config.eos_token_id = None
    return t


def make_drafter(target, kind, seed=0):
    torch.manual_seed(seed)
    extra = {"domino": dict(head=dict(rank=8, gru_hidden=16)), "eagle3": dict(ttt_steps=K),
             "dspark": dict(head=dict(rank=8, head_type="rnn"), sample_from_anchor=True),
             "dflash2": dict(head=dict(rank=8, top_k=8, conv_group_size=8))}.get(kind, {})
    d = build_drafter(drafter_config(kind, target, block_size=B, num_layers=1, **extra), target)
    with torch.no_grad():  # W_up / W2 start at zero: a real correction
        if kind == "domino":
            d.head.up.weight.normal_(0.0, 0.3)
        if kind == "dspark":
            d.head.w2.weight.normal_(0.0, 0.3)
    return lively_dflash2_(d) if kind == "dflash2" else d


@pytest.fixture(scope="module")
def drafter_dirs(target, tmp_path_factory):
    out = {}
    for kind in KINDS:
        path = tmp_path_factory.mktemp(kind)
        make_drafter(target, kind).save_pretrained(path)
        out[kind] = path
    return out


def make_batch(target, layers, n=3, T=22, prompt=5, anchors=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V - 1, (n, T), generator=g)
    loss_mask = (torch.arange(T) >= prompt).long()[None].expand(n, T).clone()
    if anchors is None:
        anchors = torch.tensor([[prompt, 9, 14, 17]]).expand(n, 4).clone()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask,
            "features": target.forward_features(ids, layers), "anchors": anchors,
            "anchor_mask": torch.ones_like(anchors, dtype=torch.bool)}


def loop_module(target, path, **kw):
    m = LoopModule(init_from=path, target=target, **kw)
    m.build_drafter()
    return m


# --------------------------------------------------------------------------- S = 1 is ordinary training


@pytest.mark.parametrize("kind", KINDS)
def test_stage_one_only_reproduces_ordinary_training_loss(target, drafter_dirs, kind):
    path = drafter_dirs[kind]
    ordinary = {"backbone": lambda: BackboneModule(target=target, block_size=B),
                "domino": lambda: DominoModule(target=target, block_size=B,
                                               curriculum=LambdaSchedule("constant", start=0.3)),
                "eagle3": lambda: Eagle3Module(target=target, block_size=B, ttt_steps=K),
                "dspark": lambda: DSparkModule(target=target, block_size=B, sample_from_anchor=True,
                                               head=DSparkHeadConfig(rank=8, head_type="rnn")),
                "dflash2": lambda: DFlash2Module(target=target, block_size=B,
                                                 head=DFlash2HeadConfig(rank=8, top_k=8, conv_group_size=8))}[kind]()
    ordinary.drafter = load_drafter(path, target=target).train()
    loop = loop_module(target, path, max_stages=3,
                       **({"curriculum": {"kind": "constant", "start": 0.3}} if kind == "domino" else {}))
    layers = loop.drafter.config.feature_layers
    T = 22
    # EAGLE-3's ordinary TTT trains a chain at every position: the loop's anchors must then cover all of them
    anchors = torch.arange(1, T)[None].expand(3, T - 1).clone() if kind == "eagle3" else None
    batch = make_batch(target, layers, T=T, anchors=anchors)
    want = ordinary.forward_step(batch, "train").loss
    got = loop.forward_step(batch, "train", num_stages=1)
    if kind == "eagle3":
        torch.testing.assert_close(got.loss, want, atol=1e-5, rtol=1e-6)
    else:
        assert torch.equal(got.loss, want), (float(got.loss), float(want))
    deeper = loop.forward_step(batch, "train", num_stages=3)
    assert torch.equal(deeper.logs["loss_stage1"], got.loss)
    torch.testing.assert_close(deeper.loss, 0.5 * (got.loss + deeper.logs["loss_stageS"]))
    assert abs(float(deeper.loss - got.loss)) > 1e-4


# --------------------------------------------------------------------------- no parameters, seeded depth


@pytest.mark.parametrize("kind", KINDS)
def test_adds_no_parameters_and_exports_the_same_drafter(target, drafter_dirs, kind, tmp_path):
    m = loop_module(target, drafter_dirs[kind])
    orig = load_drafter(drafter_dirs[kind], target=target)
    assert sum(p.numel() for p in m.parameters()) == orig.num_parameters()
    assert set(m.state_dict()) == {f"drafter.{k}" for k in orig.state_dict()}
    assert m.drafter.config.to_dict() == orig.config.to_dict()
    loaded = load_drafter(m.save_drafter(tmp_path / "out"), target=target)
    for (k, a), b in zip(loaded.state_dict().items(), orig.state_dict().values()):
        assert torch.equal(a, b), k


def test_stage_depth_is_seeded_per_step(target, drafter_dirs):
    a = loop_module(target, drafter_dirs["backbone"], max_stages=4, seed=3)
    b = loop_module(target, drafter_dirs["backbone"], max_stages=4, seed=3)
    c = loop_module(target, drafter_dirs["backbone"], max_stages=4, seed=4)
    seq = [a.stage_depth(s) for s in range(40)]
    assert seq == [b.stage_depth(s) for s in range(40)]  # a resumed run (same seed, same step) draws the same
    assert seq != [c.stage_depth(s) for s in range(40)]
    assert set(seq) == {2, 3, 4}
    one = loop_module(target, drafter_dirs["backbone"], max_stages=1)
    assert {one.stage_depth(s) for s in range(10)} == {1}


# --------------------------------------------------------------------------- bad input


def test_bad_input_gives_clear_errors(target, drafter_dirs, tmp_path):
    path = drafter_dirs["backbone"]
    for kw, match in ((dict(max_stages=0), "max_stages"), (dict(min_stages=0), "min_stages"),
                      (dict(max_stages=2.5), "max_stages"), (dict(block_size=8), "block_size"),
                      (dict(max_stages=24), "max_position_embeddings"),  # 24 x 4 = 96 positions
                      (dict(stage_tokens=2), "drafts block_size - 1 = 4 tokens")):
        with pytest.raises(ValueError, match=match):
            LoopModule(init_from=path, target=target, **kw)
    with pytest.raises(FileNotFoundError, match="init_from"):
        LoopModule(init_from=tmp_path / "nothing", target=target)
    small = tmp_path / "small"
    build_drafter(drafter_config("small_lm", target, hidden_size=16, num_heads=2, num_kv_heads=1,
                                            head_dim=8, intermediate_size=32), target).save_pretrained(small)
    with pytest.raises(ValueError, match="holds a 'small_lm' drafter"):
        LoopModule(init_from=small, target=target)
    # a checkpoint of another target (the DrafterMismatchError of load_drafter / bind_target)
    other = random_target(vocab_size=V + 8, hidden_size=D, num_layers=4, num_heads=2, num_kv_heads=1,
                          intermediate_size=64, seed=5)
    with pytest.raises(DrafterMismatchError, match="vocab_size"):
        LoopModule(init_from=path, target=other).build_drafter()
    m = loop_module(target, path, max_stages=2)
    batch = make_batch(target, m.drafter.config.feature_layers)
    with pytest.raises(ValueError, match="block budget"):
        m.forward_step(batch, "train", num_stages=3)

    class DM:
        hparams = {"block_size": B, "max_length": 90}

    with pytest.raises(ValueError, match="max_length 90"):  # 90 + 2 x 4 > 96
        m._check_datamodule(DM())


# --------------------------------------------------------------------------- fit, export, lossless DLoop


class Batches(Dataset):
    def __init__(self, batch):
        self.batch = batch

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {k: v[i % v.shape[0]] for k, v in self.batch.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_fine_tuned_drafter_decodes_losslessly_with_dloop(target, drafter_dirs, kind, tmp_path):
    m = LoopModule(init_from=drafter_dirs[kind], target=target, max_stages=3, lr=1e-2, warmup_ratio=0.0,
                   detach_stage_context=kind == "domino")
    batch = make_batch(target, load_drafter(drafter_dirs[kind]).config.feature_layers, n=4, seed=1)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(m, DataLoader(Batches(batch), batch_size=2))
    assert trainer.global_step == 3
    tuned = load_drafter(m.save_drafter(tmp_path / "tuned"), target=target)
    before = load_drafter(drafter_dirs[kind], target=target)
    assert any(not torch.equal(a, b) for a, b in zip(tuned.state_dict().values(), before.state_dict().values()))
    g = torch.Generator().manual_seed(7)
    stages = []
    for i in range(4):
        prompt = torch.randint(3, V - 1, (int(torch.randint(3, 8, (), generator=g)),), generator=g).tolist()
        want = hf_greedy(target, prompt, 16)
        for dloop in (DLoopConfig(float("-inf"), 3), DLoopConfig(-2.0, 2)):
            res = generate(target, tuned, torch.tensor([prompt]), max_new_tokens=16, dloop=dloop,
                           block_size=(B, 3)[i % 2])
            assert res.tokens == want, (kind, i, dloop)
            stages += res.stages_per_round
        # N = 1 (here with g = -inf, which otherwise always loops) is plain speculative decoding, round for round
        plain = generate(target, tuned, torch.tensor([prompt]), max_new_tokens=16)
        one = generate(target, tuned, torch.tensor([prompt]), max_new_tokens=16, dloop=DLoopConfig(float("-inf"), 1))
        assert (one.tokens, one.accepted_per_round, one.drafted_per_round) == \
            (plain.tokens, plain.accepted_per_round, plain.drafted_per_round)
    assert 3 in stages
