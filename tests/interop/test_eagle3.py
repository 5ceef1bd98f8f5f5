"""The ``eagle3`` format (vLLM's speculators layout): our EAGLE-3 drafter loads into speculators'
``Eagle3DraftModel`` with equal logits, and a random ``Eagle3DraftModel`` imports here with equal logits."""

from __future__ import annotations

import json

import pytest
import torch
from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
from speculators.proposals.greedy import GreedyTokenProposalConfig

from lit_domino.interop import ForeignConfigError, export_drafter
from lit_domino.interop.common import qwen3_config
from lit_domino.models import DrafterMismatchError
from lit_domino.interop import load_drafter
from lit_domino.target.load import Target
from lit_domino.testing import random_target


@pytest.fixture(scope="module")
def saved_target(target, tmp_path_factory):
    """The target saved as a model directory and named by its path (speculators loads its verifier from it)."""
    path = tmp_path_factory.mktemp("verifier")
    target.model.save_pretrained(path)
    return Target(model=target.model, tokenizer=None, mask_token_id=target.mask_token_id, name=str(path))


def speculators_logits(model, target, ids, feats):
    """speculators' forward, one TTT step: its index t pairs token x_{t+1} with feature f_t, our position t+1."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():
        model(hidden_states=feats[None, :-1], input_ids=ids[None, 1:], document_ids=torch.zeros(1, ids.numel() - 1,
              dtype=torch.long), ttt_steps=1)
    hook.remove()
    return seen[0][0]  # [T-1, V]: predictions of x_2 .. x_T


def our_logits(drafter, ids, feats):
    with torch.no_grad():
        out = drafter.forward_train(ids[None], feats[None])
    return out.logits[0][0, 1:]  # step 0 at positions 1..T-1


def features(target, drafter, T=14, seed=0):
    ids = torch.randint(0, target.vocab_size - 1, (T,), generator=torch.Generator().manual_seed(seed))
    return ids, target.forward_features(ids[None], drafter.config.feature_layers)[0]


def test_export_loads_in_speculators_with_equal_logits(tmp_path, saved_target, eagle, one_thread):
    out = export_drafter(eagle, tmp_path / "e3", format="eagle3", target=saved_target)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["draft_vocab_size"] == 128
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == saved_target.name
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # their ids index hidden_states: ours + 1
    model = Eagle3DraftModel.from_pretrained(out, attn_implementation="eager").eval()
    ids, feats = features(saved_target, eagle)
    torch.testing.assert_close(our_logits(eagle, ids, feats), speculators_logits(model, saved_target, ids, feats),
                               rtol=1e-4, atol=1e-4)
    again = load_drafter(out, target=saved_target)
    assert again.config.ttt_steps == eagle.config.ttt_steps and again.config.block_size == 6
    torch.testing.assert_close(our_logits(again, ids, feats), our_logits(eagle, ids, feats))


def random_speculators(target, layers, seed=5, **flags) -> Eagle3DraftModel:
    base = type("C", (), {})()
    for k, v in dict(vocab_size=target.vocab_size, hidden_size=32, intermediate_size=64, num_heads=4,
                     num_kv_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0,
                     max_position_embeddings=256).items():
        setattr(base, k, v)
    tl = qwen3_config(base, 1)
    tl._attn_implementation = "eager"
    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=tl, draft_vocab_size=target.vocab_size, eagle_aux_hidden_state_layer_ids=layers,
        **flags, speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy", verifier=VerifierConfig(name_or_path=target.name,
                                                                      architectures=["Qwen3ForCausalLM"])))
    torch.manual_seed(seed)
    model = Eagle3DraftModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        model.embed_tokens.weight.copy_(target.embed.weight)  # a drafter of this target shares its embedding/head
        model.lm_head.weight.copy_(target.lm_head.weight)
    return model


def test_random_speculators_checkpoint_imports_with_equal_logits(tmp_path, saved_target, eagle, one_thread):
    model = random_speculators(saved_target, [2, 3, 4])  # hidden_states 2, 3, 4: our decoder layers 1, 2, 3
    model.save_pretrained(tmp_path / "theirs")
    ours = load_drafter(tmp_path / "theirs", target=saved_target)
    assert ours.kind == "eagle3" and ours.config.block_size == 4 and ours.config.feature_layers == [1, 2, 3]
    ids, feats = features(saved_target, ours, seed=1)
    torch.testing.assert_close(our_logits(ours, ids, feats), speculators_logits(model, saved_target, ids, feats),
                               rtol=1e-4, atol=1e-4)
    other = random_target(vocab_size=128, hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2, seed=9)
    with pytest.raises(DrafterMismatchError, match="lm_head.weight differs|embed_tokens.weight differs"):
        load_drafter(tmp_path / "theirs", target=other)


@pytest.mark.parametrize("flag", ["norm_before_residual", "norm_output", "fc_norm"])
def test_eagle3_variants_are_refused_naming_the_field(tmp_path, saved_target, eagle, flag):
    random_speculators(saved_target, [1, 2, 3], **{flag: True}).save_pretrained(tmp_path / flag)
    with pytest.raises(ForeignConfigError, match=f"{flag}=True"):
        load_drafter(tmp_path / flag)
