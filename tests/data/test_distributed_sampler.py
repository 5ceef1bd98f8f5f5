"""The length-grouped sampler under DDP: ranks shard the same global batches, anchors differ per rank."""

from __future__ import annotations

import types

import pytest
import torch
from torch.utils.data import DistributedSampler

from lit_domino.training.datamodule import DrafterDataModule, EpochShuffleSampler, sample_anchors


def _lengths(n=437, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (20 + torch.randint(0, 200, (n,), generator=g)).tolist()


def _batches(sampler, bs):
    order = list(sampler)
    return [order[k : k + bs] for k in range(0, len(order), bs)]


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("n", [437, 480])  # a short last global batch, and none
def test_ranks_split_the_single_process_global_batches(grouped, n):
    lengths = _lengths(n) if grouped else None
    bs, R = 4, 3
    single = EpochShuffleSampler(n, seed=5, lengths=lengths, batch_size=bs * R)
    ranks = [EpochShuffleSampler(n, seed=5, lengths=lengths, batch_size=bs, num_replicas=R, rank=r) for r in range(R)]
    for epoch in (0, 1):
        for s in (single, *ranks):
            s.set_epoch(epoch)
        per_rank = [_batches(s, bs) for s in ranks]
        assert len({len(b) for b in per_rank}) == 1, "every rank must run the same number of steps"
        assert [len(s) for s in ranks] == [len(list(s)) for s in ranks]
        reference = _batches(single, bs * R)
        assert len(per_rank[0]) == len(reference)
        for step, global_batch in enumerate(reference):
            union = [i for r in range(R) for i in per_rank[r][step]]
            if len(global_batch) == bs * R:
                assert union == global_batch  # step k on R ranks = step k of one process with R·bs
            else:  # the short last batch, padded with the epoch's first items so the ranks stay in step
                assert union[: len(global_batch)] == global_batch
                assert len(union) % R == 0 and len(union) - len(global_batch) < R
        everything = [i for b in per_rank for batch in b for i in batch]
        assert set(everything) == set(range(n))
    if grouped:  # the grouped order survives: each rank's batches are nearly padding-free
        padded = sum(max(lengths[i] for i in b) * len(b) for b in per_rank[1])
        real = sum(lengths[i] for b in per_rank[1] for i in b)
        assert 1 - real / padded < 0.1


def test_one_replica_is_the_previous_order():
    """R = 1 gives the order the single-process sampler always gave (cached runs stay comparable)."""
    lengths = _lengths(101)
    s = EpochShuffleSampler(101, seed=2, lengths=lengths, batch_size=8)
    g = torch.Generator().manual_seed(2 * 10_007)
    assert list(EpochShuffleSampler(101, seed=2)) == torch.randperm(101, generator=g).tolist()
    assert sorted(s) == list(range(101)) and len(s) == 101


def test_lightning_keeps_it_and_bad_ranks_fail():
    """A DistributedSampler subclass: Lightning's use_distributed_sampler does not wrap (reshuffle) it."""
    from lightning.pytorch.trainer.connectors.data_connector import _DataConnector

    s = EpochShuffleSampler(10, seed=0, batch_size=2, num_replicas=2, rank=1)
    assert isinstance(s, DistributedSampler)
    loader = torch.utils.data.DataLoader(range(10), batch_size=2, sampler=s)
    fake = types.SimpleNamespace(_accelerator_connector=types.SimpleNamespace(use_distributed_sampler=True,
                                                                              is_distributed=True))
    assert not _DataConnector._requires_distributed_sampler(types.SimpleNamespace(trainer=fake), loader)
    with pytest.raises(ValueError, match="rank 2"):
        EpochShuffleSampler(10, seed=0, num_replicas=2, rank=2)


def test_anchor_draws_differ_per_rank_and_repeat_per_step():
    dm = DrafterDataModule(target="embedded:smoke", seed=3)
    mask = torch.ones(4, 64, dtype=torch.long)

    def draw(step, rank):
        return sample_anchors(mask, 6, dm.anchor_generator(step, rank))[0]

    assert torch.equal(draw(7, 1), draw(7, 1))  # reproducible (a resume redraws the same)
    assert not torch.equal(draw(7, 0), draw(7, 1))  # ranks differ
    assert not torch.equal(draw(7, 1), draw(8, 1))  # steps differ
    # rank 0 keeps the single-process draws
    legacy = torch.Generator().manual_seed(3 * 1_000_003 + 7 + 1_000_000_007)
    assert torch.equal(draw(7, 0), sample_anchors(mask, 6, legacy)[0])
