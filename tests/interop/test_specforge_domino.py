"""The ``specforge-domino`` format: our Domino loads into SpecForge's ``DominoDraftModel`` with equal final
logits on teacher-forced blocks, and a random ``DominoDraftModel`` imports here with equal final logits."""

from __future__ import annotations

import json

import pytest
import torch
from specforge.modeling.draft.domino import DominoDraftModel

from lit_domino.interop import ForeignConfigError, export_drafter
from lit_domino.interop.dflash import layout_config
from lit_domino.interop import load_drafter
from tests.interop.conftest import lively

B = 8


def teacher_forced(target, drafter, T: int = 24, seed: int = 0):
    """Our training forward on one sequence with 3 anchors: (final logits [3, B, V], block tokens, hidden)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.vocab_size - 1, (1, T), generator=g)
    feats = target.forward_features(ids, drafter.config.feature_layers)
    anchors = torch.tensor([[2, 9, 15]])
    with torch.no_grad():
        out = drafter.forward_train(ids, feats, anchors, torch.ones_like(anchors, dtype=torch.bool))
    return out


def specforge_final(model, target, out):
    """SpecForge's ``apply_logits_head`` on our blocks' hidden states, base logits and true block tokens."""
    with torch.no_grad():
        base = target.lm_head(out.hidden)  # [1, A, B, V]
        return model.apply_logits_head(base, prev_token_embeddings=target.embed(out.block_tokens),
                                       hidden_states=out.hidden)


def test_export_loads_in_specforge_with_equal_final_logits(tmp_path, target, domino, one_thread):
    out_dir = export_drafter(domino, tmp_path / "dom", format="specforge-domino")
    dc = json.loads((out_dir / "config.json").read_text())["dflash_config"]
    assert dc == {"target_layer_ids": domino.config.feature_layers, "block_size": B,
                  "mask_token_id": target.mask_token_id, "projector_type": "domino", "emb_dim": 8,
                  "gru_hidden_dim": 16, "shift_label": False, "pure_draft_prefix_len": 0}
    model = DominoDraftModel.from_pretrained(out_dir).eval()
    assert model.suffix_start == 1 and model.block_size == B
    out = teacher_forced(target, domino)
    assert not torch.allclose(out.final_logits, out.logits)  # the head does change the logits
    torch.testing.assert_close(specforge_final(model, target, out), out.final_logits, rtol=1e-4, atol=1e-4)
    # the backbone part is DFlash's forward too: SpecForge's hidden states of a decoding block equal ours
    again = load_drafter(out_dir, target=target)
    assert again.kind == "domino" and again.config.head.rank == 8
    torch.testing.assert_close(teacher_forced(target, again).final_logits, out.final_logits)


def test_random_specforge_domino_imports_with_equal_final_logits(tmp_path, target, domino, one_thread):
    cfg = layout_config(domino, {"fingerprint": target.fingerprint()},
                        {"projector_type": "domino", "emb_dim": 4, "gru_hidden_dim": 12, "shift_label": False,
                         "pure_draft_prefix_len": 0}, architecture="DominoDraftModel")
    torch.manual_seed(4)
    model = DominoDraftModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    model.save_pretrained(tmp_path / "theirs")
    ours = load_drafter(tmp_path / "theirs", target=target)
    assert (ours.kind, ours.config.head.rank, ours.config.head.gru_hidden) == ("domino", 4, 12)
    out = teacher_forced(target, ours, seed=2)
    torch.testing.assert_close(out.final_logits, specforge_final(model, target, out), rtol=1e-4, atol=1e-4)
    # decoding (the head's rollout) picks what SpecForge's own causal sampler picks on the same block
    session = ours.new_session()
    ids = torch.randint(0, 127, (10,), generator=torch.Generator().manual_seed(5))
    session.extend(ids, target.forward_features(ids[None], ours.config.feature_layers)[0])
    drafted = session.draft(torch.tensor([3]), B - 1)
    hidden = session.stages[-1].hidden[None]  # [1, B, d]
    block = torch.full((1, B), ours.config.mask_token_id)
    block[0, 0] = 3

    class _T:  # the two target parts SpecForge's sampler reaches for
        lm_head = target.lm_head
        model = type("M", (), {"embed_tokens": target.embed})()

    with torch.no_grad():
        theirs = model._sample_draft_tokens(_T, hidden, block)
    assert drafted.tokens.tolist() == theirs[0].tolist()


@pytest.mark.parametrize("key,value,field", [
    ("shift_label", True, "dflash_config.shift_label"),
    ("pure_draft_prefix_len", 1, "dflash_config.pure_draft_prefix_len"),
    ("projector_type", "dspark", "dflash_config.projector_type"),
    ("final_logit_softcapping", 30.0, "dflash_config.final_logit_softcapping"),
    ("selector_rank", 8, "dflash_config.selector_rank"),
])
def test_foreign_domino_conventions_are_refused_naming_the_field(tmp_path, domino, key, value, field):
    out_dir = export_drafter(domino, tmp_path / "dom", format="specforge-domino")
    cfg = json.loads((out_dir / "config.json").read_text())
    cfg["dflash_config"][key] = value
    (out_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ForeignConfigError, match=f"{field}="):
        load_drafter(out_dir)
