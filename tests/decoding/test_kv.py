"""The one KV-cache rollback helper (transformers 5.x ``crop`` takes a negative count)."""

from __future__ import annotations

import pytest
import torch

from lit_domino.decoding.kv import cache_length, crop_cache
from lit_domino.testing import random_target


@pytest.fixture(scope="module")
def target():
    return random_target(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                         intermediate_size=64, seed=1)


def test_crop_keeps_the_prefix_and_decoding_continues_exactly(target):
    ids = torch.randint(0, 63, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = target.model(input_ids=ids, use_cache=True)
        cache = out.cache
        keys = [layer.keys.clone() for layer in cache.layers]
        assert cache_length(cache) == 12
        crop_cache(cache, 7)
        assert cache_length(cache) == 7
        for layer, k in zip(cache.layers, keys):
            torch.testing.assert_close(layer.keys, k[..., :7, :])
        # feeding a different continuation after the crop equals a fresh forward on the new sequence
        new = torch.tensor([[5, 9, 11]])
        cont = target.model(input_ids=new, cache=cache, use_cache=True).logits
        fresh = target.model(input_ids=torch.cat([ids[:, :7], new], 1)).logits[:, 7:]
        torch.testing.assert_close(cont, fresh, atol=1e-5, rtol=1e-5)
        assert cache_length(cache) == 10


def test_crop_to_same_length_is_a_no_op_and_bad_lengths_raise(target):
    with torch.no_grad():
        cache = target.model(input_ids=torch.tensor([[1, 2, 3, 4]]), use_cache=True).cache
    crop_cache(cache, 4)
    assert cache_length(cache) == 4
    crop_cache(cache, 0)
    assert cache_length(cache) == 0
    for bad in (-1, 1):
        with pytest.raises(ValueError, match="cannot crop"):
            crop_cache(cache, bad)
    assert cache_length(None) == 0
