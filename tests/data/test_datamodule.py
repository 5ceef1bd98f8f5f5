import pytest
import torch

from lit_domino.data.datamodule import DrafterDataModule, sample_anchors

SMALL = dict(train_examples={"math": 8, "code": 4}, val_examples={"math": 4}, max_new_tokens=16,
             regen_batch_size=8, batch_size=4, num_anchors=5, block_size=4, max_length=200)


def test_anchors_only_where_a_and_next_are_response():
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]])
    anchors, mask = sample_anchors(loss_mask, num_anchors=6, generator=torch.Generator().manual_seed(0))
    assert anchors.shape == mask.shape == (2, 6)
    assert sorted(anchors[0][mask[0]].tolist()) == [2, 3, 6]
    assert anchors[1][mask[1]].tolist() == [8]
    for row in range(2):
        for a in anchors[row][mask[row]].tolist():
            assert loss_mask[row, a] == 1 and loss_mask[row, a + 1] == 1


def test_anchor_draws_are_seeded_and_redrawn():
    lm = torch.ones(3, 64, dtype=torch.long)
    a1, _ = sample_anchors(lm, 8, torch.Generator().manual_seed(1))
    a2, _ = sample_anchors(lm, 8, torch.Generator().manual_seed(1))
    a3, _ = sample_anchors(lm, 8, torch.Generator().manual_seed(2))
    assert torch.equal(a1, a2) and not torch.equal(a1, a3)


@pytest.mark.parametrize("features", ["cached", "online"])
def test_batch_shapes_and_features(tiny_target_dir, tiny_target, features):
    dm = DrafterDataModule(target=str(tiny_target_dir), features=features, feature_layers=[1, 3], **SMALL)
    dm.prepare_data()
    dm.setup("fit")
    batch = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    b, T = batch["input_ids"].shape
    assert b == 4
    assert batch["features"].shape == (b, T, 2 * tiny_target.hidden_size)
    assert batch["anchors"].shape == batch["anchor_mask"].shape == (b, 5)
    assert batch["loss_mask"].shape == batch["attention_mask"].shape == (b, T)
    # features are the target's own hidden states of the named layers (fp16 cache → loose tolerance)
    ref = tiny_target.forward_features(batch["input_ids"], [1, 3], batch["attention_mask"])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(batch["features"][real], ref[real], atol=2e-2, rtol=2e-2)
    assert (batch["features"][~real] == 0).all() or features == "online"
    for r in range(b):
        for a in batch["anchors"][r][batch["anchor_mask"][r]].tolist():
            assert batch["loss_mask"][r, a] == 1 and batch["loss_mask"][r, a + 1] == 1


def test_datamodule_bad_input(tiny_target_dir):
    with pytest.raises(ValueError, match="block_size"):
        DrafterDataModule(target=str(tiny_target_dir), block_size=1)
    with pytest.raises(ValueError, match="features"):
        DrafterDataModule(target=str(tiny_target_dir), features="sometimes")
    dm = DrafterDataModule(target=str(tiny_target_dir), feature_layers=[9], **{k: v for k, v in SMALL.items()})
    with pytest.raises(ValueError, match="out of range"):
        dm.feature_layers
