import numpy as np
import pytest
import torch

from lit_domino.training.datamodule import DrafterDataModule, EpochShuffleSampler, RegenSequences, sample_anchors

pytestmark = pytest.mark.usefixtures("one_thread")  # ~5x faster on 2 busy cores

SMALL = dict(train_examples={"math": 8, "code": 4}, val_examples={"math": 4}, max_new_tokens=16,
             regen_batch_size=8, batch_size=4, num_anchors=5, block_size=4, max_length=200)


def test_rows_read_from_arrow_equal_the_python_rows():
    """RegenSequences reads rows as NumPy views of the Arrow buffers: across chunks, after a ``select`` (an indices
    mapping) and a ``shuffle``, truncated at max_length, they equal the rows as Python lists, in torch.tensor's
    int64."""
    import datasets

    rng = np.random.default_rng(0)

    def part(n):
        ids = [rng.integers(0, 100, int(rng.integers(1, 12))).tolist() for _ in range(n)]
        return datasets.Dataset.from_dict({"input_ids": ids, "loss_mask": [[int(x % 2) for x in r] for r in ids]},
                                          features=datasets.Features({"input_ids": datasets.List(datasets.Value("int32")),
                                                                      "loss_mask": datasets.List(datasets.Value("int64"))}))

    whole = datasets.concatenate_datasets([part(5), part(7), part(4)])  # three Arrow chunks
    for ds in (whole, whole.select([15, 0, 6, 6, 11]), whole.shuffle(seed=1), whole.select(range(3, 9))):
        rows = RegenSequences(ds, max_length=8)
        assert len(rows) == len(ds)
        for i in range(len(ds)):
            item, ref = rows[i], ds[i]
            assert torch.equal(item["input_ids"], torch.tensor(ref["input_ids"][:8]))
            assert torch.equal(item["loss_mask"], torch.tensor(ref["loss_mask"][:8]))
            assert item["input_ids"].dtype == item["loss_mask"].dtype == torch.int64 and item["index"] == i
    with pytest.raises(IndexError):
        RegenSequences(whole, 8).input_ids[len(whole)]


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


def test_length_grouped_shuffle_covers_everything_with_little_padding():
    g = torch.Generator().manual_seed(0)
    lengths = (40 + torch.randint(0, 60, (1000,), generator=g) * (1 + 5 * (torch.rand(1000, generator=g) < 0.2))).tolist()
    bs = 16

    def padded_fraction(order):
        batches = [order[k: k + bs] for k in range(0, len(order), bs)]
        padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
        return 1 - sum(lengths) / padded

    grouped = EpochShuffleSampler(1000, seed=3, lengths=lengths, batch_size=bs)
    plain = EpochShuffleSampler(1000, seed=3)
    epoch0 = list(grouped)
    assert sorted(epoch0) == list(range(1000)) and list(grouped) == epoch0  # a permutation, reproducible
    grouped.set_epoch(1)
    assert sorted(grouped) == list(range(1000)) and list(grouped) != epoch0  # a new order each epoch
    assert padded_fraction(epoch0) < 0.1 < 0.4 < padded_fraction(list(plain))
    # batches are shuffled, not sorted: lengths do not rise through the epoch
    maxima = [max(lengths[i] for i in epoch0[k: k + bs]) for k in range(0, 992, bs)]
    assert maxima != sorted(maxima) and maxima.index(max(maxima)) < len(maxima) - 2
    with pytest.raises(ValueError, match="lengths"):
        EpochShuffleSampler(10, seed=0, lengths=[1, 2], batch_size=2)


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


# --------------------------------------------------------------------------- cache state, corrupt caches


def _state():
    import random

    import numpy as np

    return torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()


def _batches(dm, n=3):
    it = iter(dm.train_dataloader())
    return [dm.on_after_batch_transfer(next(it), 0) for _ in range(n)]


def test_cold_and_warm_cache_give_the_same_random_state_and_batches(tiny_target_dir, tmp_path, monkeypatch,
                                                                    one_thread):
    """Same seed and config: a cold data cache (regeneration and features built) and a warm one
    (read back) leave the global RNGs the same, so a drafter trained next is the same."""
    import random

    import numpy as np

    monkeypatch.setenv("LIT_DOMINO_CACHE", str(tmp_path))  # a cold cache of its own
    kw = {**SMALL, "regen_temperature": 0.7, "seed": 12}  # sampled answers: the regeneration draws randomness
    runs = []
    for _ in range(2):  # cold, then warm
        torch.manual_seed(12)
        random.seed(12)
        np.random.seed(12)
        dm = DrafterDataModule(target=str(tiny_target_dir), feature_layers=[1, 3], **kw)
        dm.prepare_data()
        dm.setup("fit")
        runs.append((_state(), _batches(dm)))
    (cold_state, cold), (warm_state, warm) = runs
    assert torch.equal(cold_state[0], warm_state[0])
    assert cold_state[1] == warm_state[1] and (cold_state[2] == warm_state[2]).all()
    for a, b in zip(cold, warm):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k


def test_truncated_feature_cache_is_rebuilt(tiny_target_dir, tmp_path, monkeypatch, caplog, one_thread):
    monkeypatch.setenv("LIT_DOMINO_CACHE", str(tmp_path))
    dm = DrafterDataModule(target=str(tiny_target_dir), feature_layers=[2], **SMALL)
    dm.setup("fit")
    feats = np.array(dm.train_set.features)
    [path] = [p for p in (tmp_path / "features").iterdir() if (p / "features.npy").exists()
              and np.load(p / "features.npy", mmap_mode="r").shape == feats.shape]
    data = (path / "features.npy").read_bytes()
    (path / "features.npy").write_bytes(data[: len(data) // 2])
    with caplog.at_level("WARNING"):
        again = DrafterDataModule(target=str(tiny_target_dir), feature_layers=[2], **SMALL)
        again.setup("fit")
    assert str(path) in caplog.text
    assert np.array_equal(np.array(again.train_set.features), feats)


def test_failed_feature_build_leaves_no_stub_folder(tiny_target_dir, tiny_target, tmp_path, monkeypatch,
                                                   one_thread):
    monkeypatch.setenv("LIT_DOMINO_CACHE", str(tmp_path))
    dm = DrafterDataModule(target=str(tiny_target_dir), feature_layers=[0], **SMALL)

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(dm.load_target(), "forward_features", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        dm.prepare_data()
    left = [p.name for p in (tmp_path / "features").iterdir() if not p.name.startswith(".")]
    assert left == []  # no stub folder (only the hidden lock file beside where it would be)


def test_regeneration_bars_follow_the_trainers_progress_setting(tiny_target_dir, monkeypatch):
    """`--no-progress` (a trainer without a progress bar) also silences the regeneration bars."""
    from lit_domino.training import datamodule as dm_module

    seen = []

    def fake_regenerate(target, cfg, progress=True):
        seen.append(progress)
        raise RuntimeError("stop here")

    monkeypatch.setattr(dm_module, "regenerate", fake_regenerate)
    dm = DrafterDataModule(target=str(tiny_target_dir), train_examples={"math": 2}, val_examples={"math": 1},
                           block_size=4, feature_layers=[1, 3])

    class Trainer:
        progress_bar_callback = None

    dm.trainer = Trainer()
    with pytest.raises(RuntimeError, match="stop here"):
        dm.prepare_data()
    dm.trainer = None
    with pytest.raises(RuntimeError, match="stop here"):
        dm.prepare_data()
    assert seen == [False, True]
