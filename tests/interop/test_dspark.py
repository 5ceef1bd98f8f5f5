"""The ``dspark`` format (vLLM's speculators layout): our DSpark drafter loads into speculators'
``DSparkDraftModel`` with equal logits and confidence logits on teacher-forced blocks, and a random
``DSparkDraftModel`` imports here with equal ones and decodes losslessly (every Markov head type, both anchor
conventions: speculators' ``sample_from_anchor`` block of B-1 slots is our block of B); foreign settings are
refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig
from speculators.proposals.greedy import GreedyTokenProposalConfig

from lit_domino.decoding import DLoopConfig, generate
from lit_domino.interop import ForeignConfigError, export_drafter
from lit_domino.interop.common import qwen3_config
from lit_domino.models import build_drafter, drafter_config
from lit_domino.interop import load_drafter
from lit_domino.models.dspark import HEAD_TYPES
from lit_domino.target.load import Target
from lit_domino.testing import hf_greedy

from .conftest import lively

B = 6


@pytest.fixture(scope="module")
def saved_target(target, tmp_path_factory):
    """The target saved as a model directory and named by its path (speculators reads its verifier from it)."""
    path = tmp_path_factory.mktemp("verifier")
    target.model.save_pretrained(path)
    return Target(model=target.model, tokenizer=None, mask_token_id=target.mask_token_id, name=str(path))


def ours_of(target, head_type, sample_from_anchor=False, **head):
    torch.manual_seed(0)
    cfg = drafter_config("dspark", target, block_size=B, num_layers=2, sample_from_anchor=sample_from_anchor,
                         head=dict(rank=8, head_type=head_type, **head))
    return lively(build_drafter(cfg, target), seed=2)


def speculators_model(target, layers, head_type, sample_from_anchor=False, **extra) -> DSparkDraftModel:
    tl = qwen3_config(drafter_config("dspark", target), 2)
    tl._attn_implementation = "eager"
    cfg = DSparkSpeculatorConfig(  # their block: B-1 slots when the anchor samples (the same B-1 drafts)
        transformer_layer_config=tl, draft_vocab_size=target.vocab_size, block_size=B - int(sample_from_anchor),
        aux_hidden_state_layer_ids=layers, mask_token_id=target.mask_token_id, sample_from_anchor=sample_from_anchor,
        markov_rank=8, markov_head_type=head_type, **extra,
        speculators_config=SpeculatorsConfig(
            algorithm="dspark", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=B - 1)],
            default_proposal_method="greedy", verifier=VerifierConfig(name_or_path=target.name,
                                                                      architectures=["Qwen3ForCausalLM"])))
    torch.manual_seed(3)
    return DSparkDraftModel(cfg).eval()


def blocks(model, target, drafter, T=30, seed=0):
    """speculators' teacher-forced training forward on one sequence (its own random anchors) -> (anchors [A],
    corrected logits [A, B, V], confidence logits [A, B]), with the target's embedding / LM head in it."""
    ids = torch.randint(0, target.vocab_size - 1, (1, T), generator=torch.Generator().manual_seed(seed))
    feats = target.forward_features(ids, drafter.config.feature_layers)  # fused layers + the distribution layer
    d = target.hidden_size
    with torch.no_grad():
        model.embed_tokens.weight.copy_(target.embed.weight)
        model.lm_head.weight.copy_(target.lm_head.weight)
        model.verifier_lm_head.weight.copy_(target.lm_head.weight)
        A, S = 4, model.block_size  # S slots: B, or B-1 when the anchor samples
        torch.manual_seed(seed)
        hidden, logits, _, _, idx = model._backbone_forward(
            feats[..., :-d], ids, torch.ones_like(ids), feats[..., -d:], torch.zeros_like(ids), max_anchors=A)
        tokens = ids[0, idx].view(A, S)
        prev = tokens if model.config.sample_from_anchor else torch.cat([tokens[:, :1], tokens[:, :-1]], 1)
        h = hidden.view(A, S, -1)
        e = model.markov_head.prev_embeddings(prev)
        logits = logits.view(A, S, -1) + model.markov_head.block_bias(prev_token_ids=prev, hidden_states=h, prev_emb=e)
        conf = model.confidence_head(torch.cat([h, e], -1)) if model.confidence_head is not None else None
    return ids, feats, idx.view(A, S)[:, 0], logits, conf


def our_blocks(drafter, ids, feats, anchors):
    with torch.no_grad():
        out = drafter.forward_train(ids, feats, anchors[None], torch.ones_like(anchors[None], dtype=torch.bool))
    return out.final_logits[0], (out.confidence[0] if out.confidence is not None else None)


def assert_equal_blocks(drafter, model, target):
    ids, feats, anchors, logits, conf = blocks(model, target, drafter)
    mine, my_conf = our_blocks(drafter, ids, feats, anchors)
    # our index k >= 1 predicts x_{a+k}: their slot k, or slot k-1 when the anchor samples
    theirs = slice(1, None) if not drafter.config.sample_from_anchor else slice(None)
    torch.testing.assert_close(mine[:, 1:], logits[:, theirs], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(my_conf[:, 1:], conf[:, theirs], rtol=1e-4, atol=1e-4)


CASES = [(h, False) for h in HEAD_TYPES] + [("rnn", True), ("gated", True)]
"""Every head type in the suite's default layout; DeepSpec's sample_from_anchor with the state-carrying heads."""


@pytest.mark.parametrize("head_type,anchor", CASES)
def test_export_loads_in_speculators_with_equal_logits(tmp_path, saved_target, head_type, anchor, one_thread):
    drafter = ours_of(saved_target, head_type, sample_from_anchor=anchor)
    out = export_drafter(drafter, tmp_path / "ds", format="dspark", target=saved_target)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dspark" and cfg["sample_from_anchor"] is anchor
    assert cfg["block_size"] == B - int(anchor)
    assert cfg["aux_hidden_state_layer_ids"] == [j + 1 for j in drafter.config.feature_layers[:-1]]
    model = DSparkDraftModel.from_pretrained(out, attn_implementation="eager").eval()
    assert_equal_blocks(drafter, model, saved_target)
    again = load_drafter(out, target=saved_target)
    assert again.config == drafter.config


@pytest.mark.parametrize("head_type,anchor", CASES)
def test_random_speculators_checkpoint_imports_with_equal_logits(tmp_path, saved_target, head_type, anchor,
                                                                 one_thread):
    layers = drafter_config("dspark", saved_target).feature_layers[:-1]
    model = speculators_model(saved_target, [j + 1 for j in layers], head_type, sample_from_anchor=anchor)
    with torch.no_grad():  # a visible Markov bias
        torch.nn.init.normal_(model.markov_head.markov_w2.weight, std=1.0)
        torch.nn.init.normal_(model.markov_head.markov_w1.weight, std=1.0)
    model.save_pretrained(tmp_path / "spec")
    drafter = load_drafter(tmp_path / "spec", target=saved_target)
    assert drafter.kind == "dspark" and drafter.config.head.head_type == head_type
    assert drafter.config.sample_from_anchor is anchor and drafter.config.block_size == B
    assert drafter.config.feature_layers == layers + [saved_target.num_layers - 1]
    assert_equal_blocks(drafter, model, saved_target)
    for p in ([5, 6, 7, 8], [9, 3, 4]):  # the imported checkpoint decodes losslessly in our engine
        assert generate(saved_target, drafter, torch.tensor([p]), max_new_tokens=12, dloop=DLoopConfig(-6.0, 2),
                        static_cache=True).tokens == hf_greedy(saved_target, p, 12)


def test_foreign_settings_are_refused_by_name(tmp_path, saved_target, one_thread):
    layers = [j + 1 for j in drafter_config("dspark", saved_target).feature_layers[:-1]]
    model = speculators_model(saved_target, layers, "vanilla", sample_from_anchor=True)
    model.save_pretrained(tmp_path / "anchor")
    cfg = json.loads((tmp_path / "anchor" / "config.json").read_text())
    for key, value, match in (("markov_rank", 0, "markov_rank=0"), ("draft_vocab_size", 64, "draft_vocab_size=64"),
                              ("sample_from_anchor", "yes", "sample_from_anchor='yes'")):
        bad = tmp_path / key
        bad.mkdir()
        (bad / "model.safetensors").write_bytes((tmp_path / "anchor" / "model.safetensors").read_bytes())
        (bad / "config.json").write_text(json.dumps({**cfg, key: value}))
        with pytest.raises(ForeignConfigError, match=match):
            load_drafter(bad)
