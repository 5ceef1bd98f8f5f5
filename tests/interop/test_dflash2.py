"""The ``dflash2`` format (vLLM's speculators layout): our DFlash 2 drafter loads into speculators'
``DFlash2DraftModel`` with equal unary logits and selector scores on teacher-forced blocks (and the same training
loss up to the normalisation), a random ``DFlash2DraftModel`` imports here with equal ones and decodes losslessly,
and foreign settings are refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.losses import eager
from speculators.models.dflash2 import DFlash2DraftModel, DFlash2SpeculatorConfig
from speculators.proposals.greedy import GreedyTokenProposalConfig

from lit_domino.decoding import generate
from lit_domino.interop import ForeignConfigError, export_drafter
from lit_domino.interop.common import qwen3_config
from lit_domino.interop import load_drafter
from lit_domino.models import build_drafter, drafter_config
from lit_domino.models.objectives import LossSettings, position_weights
from lit_domino.target.load import Target
from lit_domino.testing import hf_greedy

from .conftest import lively

B, TOP_K = 6, 8
HEAD = dict(rank=8, top_k=TOP_K, conv_kernel_size=2, conv_group_size=8)


@pytest.fixture(scope="module")
def saved_target(target, tmp_path_factory):
    """The target saved as a model directory and named by its path (speculators reads its verifier from it)."""
    path = tmp_path_factory.mktemp("verifier")
    target.model.save_pretrained(path)
    return Target(model=target.model, tokenizer=None, mask_token_id=target.mask_token_id, name=str(path))


def ours_of(target):
    torch.manual_seed(0)
    cfg = drafter_config("dflash2", target, block_size=B, num_layers=2, head=HEAD)
    return lively(build_drafter(cfg, target), seed=2)


def speculators_model(target, layers, window=None, **extra) -> DFlash2DraftModel:
    """A random DFlash2DraftModel (2 layers); ``window`` = (layer types, W): its windowed layers."""
    tl = qwen3_config(drafter_config("dflash2", target), 2)
    tl._attn_implementation = "eager"
    if window is not None:
        tl.layer_types, tl.sliding_window, tl.use_sliding_window = list(window[0]), window[1], True
    fields = dict(selector_rank=HEAD["rank"], selector_top_k=TOP_K, conv_kernel_size=2, conv_group_size=8)
    fields.update(extra)
    cfg = DFlash2SpeculatorConfig(
        transformer_layer_config=tl, draft_vocab_size=target.vocab_size, block_size=B,
        aux_hidden_state_layer_ids=layers, mask_token_id=target.mask_token_id, **fields,
        speculators_config=SpeculatorsConfig(
            algorithm="dflash2", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=B - 1)],
            default_proposal_method="greedy", verifier=VerifierConfig(name_or_path=target.name,
                                                                      architectures=["Qwen3ForCausalLM"])))
    torch.manual_seed(3)
    model = DFlash2DraftModel(cfg).eval()
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():  # trained-looking convolutions and selector (speculators inits them as identity / small)
        for name, p in model.named_parameters():
            if "conv" in name or "candidate_selector" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


def bind_verifier(model, target):
    """The target's embedding and LM head in the speculators model; its verifier norm the identity, since our
    distribution layer's features are HF's final-normed hidden states already."""
    with torch.no_grad():
        model.embed_tokens.weight.copy_(target.embed.weight)
        model.lm_head.weight.copy_(target.lm_head.weight)
        model.verifier_lm_head.weight.copy_(target.lm_head.weight)
    model.verifier_norm = torch.nn.Identity()


def sequence(target, drafter, T=30, seed=0):
    ids = torch.randint(0, target.vocab_size - 1, (1, T), generator=torch.Generator().manual_seed(seed))
    return ids, target.forward_features(ids, drafter.config.feature_layers)


def their_blocks(model, target, ids, feats, A=4, seed=0):
    """speculators' teacher-forced forward on one sequence (its own random anchors) -> (anchors [A], unary logits
    [A, B, V], candidates [A, B, c], selector scores [A, B, c])."""
    d = target.hidden_size
    bind_verifier(model, target)
    with torch.no_grad():
        torch.manual_seed(seed)
        hidden, unary, _, _, idx = model._backbone_forward(
            feats[..., :-d], ids, torch.ones_like(ids), feats[..., -d:], torch.zeros_like(ids), max_anchors=A)
        prev = model._predecessor_ids(ids, idx)
        cand, scores = model.candidate_selector.select(unary, hidden, prev.reshape(1, -1))
    return idx.view(A, B)[:, 0], unary.view(A, B, -1), cand.view(A, B, -1), scores.view(A, B, -1)


def assert_equal_blocks(drafter, model, target):
    ids, feats = sequence(target, drafter)
    anchors, unary, cand, scores = their_blocks(model, target, ids, feats)
    with torch.no_grad():
        out = drafter.forward_train(ids, feats, anchors[None], torch.ones_like(anchors[None], dtype=torch.bool))
    torch.testing.assert_close(out.logits[0, :, 1:], unary[:, 1:], rtol=1e-4, atol=1e-4)  # slot 0 predicts nothing
    assert torch.equal(out.final_logits[0].topk(TOP_K, -1).indices.sort(-1).values[:, 1:],
                       cand.sort(-1).values[:, 1:])
    torch.testing.assert_close(out.final_logits[0].gather(-1, cand)[:, 1:], scores[:, 1:], rtol=1e-4, atol=1e-4)
    return float((out.logits[0, :, 1:] - unary[:, 1:]).abs().max()), \
        float((out.final_logits[0].gather(-1, cand)[:, 1:] - scores[:, 1:]).abs().max())


def test_export_loads_in_speculators_with_equal_logits(tmp_path, saved_target, one_thread):
    drafter = ours_of(saved_target)
    out = export_drafter(drafter, tmp_path / "d2", format="dflash2", target=saved_target)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dflash2" and cfg["sample_from_anchor"] is False
    assert cfg["aux_hidden_state_layer_ids"] == [j + 1 for j in drafter.config.feature_layers[:-1]]
    assert (cfg["selector_rank"], cfg["selector_top_k"], cfg["conv_group_size"]) == (8, TOP_K, 8)
    model = DFlash2DraftModel.from_pretrained(out, attn_implementation="eager").eval()
    assert_equal_blocks(drafter, model, saved_target)
    assert load_drafter(out, target=saved_target).config == drafter.config


WINDOWS = {"full": None,
           "sliding": ((["sliding_attention", "sliding_attention"], 3), True),  # speculators' trainer default
           "sliding-causal": ((["full_attention", "sliding_attention"], 4), False)}


@pytest.mark.parametrize("windows", list(WINDOWS))
def test_random_speculators_checkpoint_imports_equal_and_decodes_losslessly(tmp_path, saved_target, windows,
                                                                             one_thread):
    layers = drafter_config("dflash2", saved_target).feature_layers[:-1]
    spec = WINDOWS[windows]
    extra = {} if spec is None else {"window": spec[0], "sliding_window_non_causal": spec[1]}
    model = speculators_model(saved_target, [j + 1 for j in layers], **extra)
    model.save_pretrained(tmp_path / "spec")
    drafter = load_drafter(tmp_path / "spec", target=saved_target)
    assert drafter.kind == "dflash2" and drafter.config.head.top_k == TOP_K
    assert drafter.config.feature_layers == layers + [saved_target.num_layers - 1]
    if spec is not None:
        types, window = spec[0]
        assert drafter.config.sliding_layers == [i for i, t in enumerate(types) if t == "sliding_attention"]
        assert (drafter.config.sliding_window, drafter.config.sliding_non_causal) == (window, spec[1])
    assert_equal_blocks(drafter, model, saved_target)
    # and back: our export of it loads in speculators with the same windows
    back = DFlash2DraftModel.from_pretrained(export_drafter(drafter, tmp_path / "back", format="dflash2"),
                                             attn_implementation="eager").eval()
    assert back.sliding_window_indices == model.sliding_window_indices
    assert_equal_blocks(drafter, back, saved_target)
    for prompt in ([5, 6, 7, 8], [9, 3, 4, 1, 2]):
        expected = hf_greedy(saved_target, prompt, 16)
        for opts in ({}, {"static_cache": True}):
            assert generate(saved_target, drafter, torch.tensor([prompt]), max_new_tokens=16, **opts).tokens == \
                expected


def test_training_loss_is_speculators_up_to_the_normalisation(tmp_path, saved_target, one_thread):
    """speculators' DFlash 2 loss (eager KL, fixed-exp-decay γ = 4, α = 1) is Σ w·term / #labels; ours is
    Σ w·term / Σ w: equal after rescaling by Σ w / #labels, on the same anchors."""
    drafter = ours_of(saved_target)
    model = DFlash2DraftModel.from_pretrained(
        export_drafter(drafter, tmp_path / "d2", format="dflash2", target=saved_target), attn_implementation="eager")
    ids, feats = sequence(saved_target, drafter, seed=1)
    anchors, *_ = their_blocks(model.eval(), saved_target, ids, feats, A=4, seed=7)
    d = saved_target.hidden_size
    torch.manual_seed(7)  # the same anchors again
    with torch.no_grad():  # (its flex attention has no CPU backward)
        _, theirs, _ = model(feats[..., :-d], ids, torch.ones_like(ids), feats[..., -d:], torch.zeros_like(ids),
                             loss_config={"kl_div": (eager.kl_div_loss, 1.0)}, tv_loss_fn=eager.tv_loss,
                             max_anchors=4)
    out = drafter.forward_train(ids, feats, anchors[None], torch.ones_like(anchors[None], dtype=torch.bool))
    w = position_weights(B, 4.0)
    ours, _ = drafter.block_loss(out, LossSettings(w, chunk_size=None))
    scale = w.sum() * len(anchors) / ((B - 1) * len(anchors))
    torch.testing.assert_close(ours * scale, theirs, rtol=1e-4, atol=1e-5)


def test_foreign_settings_are_refused_by_name(tmp_path, saved_target, one_thread):
    layers = [j + 1 for j in drafter_config("dflash2", saved_target).feature_layers[:-1]]
    speculators_model(saved_target, layers).save_pretrained(tmp_path / "ok")
    cfg = json.loads((tmp_path / "ok" / "config.json").read_text())
    V = saved_target.vocab_size
    for key, value, match in (("sample_from_anchor", True, "sample_from_anchor=True"),
                              ("draft_vocab_size", 64, "draft_vocab_size=64"),
                              ("selector_top_k", V + 1, f"selector_top_k={V + 1}"),
                              ("selector_rank", 0, "selector_rank=0"),
                              ("speculators_model_type", "mtp", "speculators_model_type='mtp'")):
        bad = tmp_path / key
        bad.mkdir()
        (bad / "model.safetensors").write_bytes((tmp_path / "ok" / "model.safetensors").read_bytes())
        (bad / "config.json").write_text(json.dumps({**cfg, key: value}))
        with pytest.raises(ForeignConfigError, match=match):
            load_drafter(bad)
    linear = tmp_path / "linear"
    linear.mkdir()
    (linear / "model.safetensors").write_bytes((tmp_path / "ok" / "model.safetensors").read_bytes())
    tl = {**cfg["transformer_layer_config"], "layer_types": ["linear_attention", "full_attention"]}
    (linear / "config.json").write_text(json.dumps({**cfg, "transformer_layer_config": tl}))
    with pytest.raises(ForeignConfigError, match="transformer_layer_config.layer_types="):
        load_drafter(linear)
