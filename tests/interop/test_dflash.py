"""The ``dflash`` format: our backbone loads into z-lab's ``DFlashDraftModel`` with equal logits, and a random
``DFlashDraftModel`` built with its own class imports here with equal logits."""

from __future__ import annotations

import json

import pytest
import torch
from dflash.model import DFlashDraftModel

import lit_domino
from lit_domino.interop import SIDECAR_NAME, ExportError, export_drafter
from lit_domino.models import DrafterMismatchError
from lit_domino.interop import load_drafter
from lit_domino.testing import random_target
from tests.interop.conftest import context


def dflash_block_logits(model, target, ids, feats, anchor, B):
    """DFlash's own forward on [anchor, MASK x (B-1)] after context ``ids``: logits of block positions 1..B-1."""
    T = ids.numel()
    block = torch.full((1, B), model.mask_token_id)
    block[0, 0] = anchor
    noise = target.embed(block)
    pos = torch.arange(T + B)[None]
    with torch.no_grad():
        hidden = model(position_ids=pos, noise_embedding=noise, target_hidden=feats[None])
        return model.compute_logits(hidden[:, 1:], target.lm_head)[0]


def our_block_logits(drafter, ids, feats, anchor, B):
    session = drafter.new_session()
    session.extend(ids, feats)
    return session.draft(torch.tensor([anchor]), B - 1).logits


def test_export_loads_in_dflash_with_equal_logits(tmp_path, target, backbone, one_thread):
    out = lit_domino.export_drafter(backbone, tmp_path / "bb", format="dflash")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["num_target_layers"] == target.num_layers
    assert cfg["dflash_config"] == {"target_layer_ids": backbone.config.feature_layers, "block_size": 8,
                                    "mask_token_id": target.mask_token_id}
    side = json.loads((out / SIDECAR_NAME).read_text())
    assert side["target"]["name"] == target.name and side["target"]["fingerprint"] == target.fingerprint()
    assert "shift_label false" in side["label_convention"]
    model = DFlashDraftModel.from_pretrained(out).eval()
    assert model.target_layer_ids == backbone.config.feature_layers and model.block_size == 8
    ids, feats = context(target, backbone)
    ref = dflash_block_logits(model, target, ids, feats, 5, 8)
    torch.testing.assert_close(our_block_logits(backbone, ids, feats, 5, 8), ref, rtol=1e-4, atol=1e-4)
    # and back: the exported directory loads here, bound to its target, with the same logits
    again = load_drafter(out, target=target)
    assert again.kind == "backbone" and again.config.target_fingerprint == target.fingerprint()
    torch.testing.assert_close(our_block_logits(again, ids, feats, 5, 8), ref, rtol=1e-4, atol=1e-4)


def test_random_dflash_checkpoint_imports_with_equal_logits(tmp_path, target, backbone, one_thread):
    cfg = lit_domino.interop.dflash.layout_config(backbone, {"fingerprint": target.fingerprint()})
    cfg.num_hidden_layers = 2  # a shape of their own: two draft layers
    cfg.layer_types = ["full_attention"] * 2
    torch.manual_seed(3)
    model = DFlashDraftModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    model.save_pretrained(tmp_path / "theirs")  # no sidecar: a checkpoint trained elsewhere
    ours = load_drafter(tmp_path / "theirs", target=target)
    assert ours.kind == "backbone" and ours.config.num_layers == 2
    assert ours.config.target_fingerprint == {"hidden_size": 32, "vocab_size": 128, "num_layers": 4,
                                              "mask_token_id": target.mask_token_id}
    ids, feats = context(target, ours, seed=1)
    torch.testing.assert_close(our_block_logits(ours, ids, feats, 7, 8),
                               dflash_block_logits(model, target, ids, feats, 7, 8), rtol=1e-4, atol=1e-4)


def test_export_refuses_kinds_it_cannot_express(tmp_path, domino, eagle):
    with pytest.raises(ExportError, match="'domino' drafter cannot be written as 'dflash'.*specforge-domino"):
        export_drafter(domino, tmp_path / "d", format="dflash")
    with pytest.raises(ExportError, match="'eagle3' drafter cannot be written as 'specforge-domino'.*eagle3"):
        export_drafter(eagle, tmp_path / "e", format="specforge-domino")
    with pytest.raises(ValueError, match="unknown export format 'gguf'"):
        export_drafter(eagle, tmp_path / "e", format="gguf")


def test_exported_dir_against_another_target_is_refused(tmp_path, backbone):
    out = export_drafter(backbone, tmp_path / "bb", format="dflash")
    other = random_target(vocab_size=128, hidden_size=48, num_layers=4, num_heads=4, num_kv_heads=2, seed=1)
    with pytest.raises(DrafterMismatchError, match="hidden_size: drafter was built for 32, target has 48"):
        load_drafter(out, target=other)
    shallow = random_target(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, seed=1)
    with pytest.raises(DrafterMismatchError, match=r"feature layers \[2\] do not exist"):
        load_drafter(out, target=shallow)
