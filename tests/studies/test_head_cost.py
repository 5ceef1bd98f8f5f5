"""lit_domino.studies.head_cost: the papers' proportions, equal backbones in the pair (Domino's and DSpark's),
rows per head and pool, and bad input."""

from __future__ import annotations

import pytest
import torch

from lit_domino.studies.head_cost import DrafterSize, build_pair, measure


def test_papers_proportions():
    assert DrafterSize.papers(4096, 151936) == DrafterSize(4096, 151936, 256, 1024)  # Qwen3-8B's Domino head
    assert DrafterSize.papers(128, 4096) == DrafterSize(128, 4096, 64, 128)  # the embedded default's
    assert DrafterSize.parse("1024:32768") == DrafterSize(1024, 32768, 64, 256)
    for bad in ("1024", "a:b", "100:4096", "128:1"):
        with pytest.raises(ValueError, match="d:V|multiple of 16"):
            DrafterSize.parse(bad)


def test_pair_shares_the_backbone():
    _, pair = build_pair(DrafterSize.papers(32, 256), block_size=4, device=torch.device("cpu"), num_layers=2)
    backbone = pair["backbone"].state_dict()
    assert sum(k.startswith("layers.") and k.endswith("q_proj.weight") for k in backbone) == 2
    for kind in ("domino", "dspark"):
        other = pair[kind].state_dict()
        assert set(backbone) < set(other) and any(k.startswith("head.") for k in set(other) - set(backbone))
        assert all(torch.equal(backbone[k], other[k]) for k in backbone), kind
    assert pair["dspark"].config.head.rank == DrafterSize.papers(32, 256).rank
    convs = {k: v for k, v in pair["dflash2"].state_dict().items() if k not in backbone}
    assert all(torch.equal(backbone[k], pair["dflash2"].state_dict()[k]) for k in backbone)  # loaded into it
    assert any(".attention_conv." in k for k in convs) and any(k.startswith("selector.") for k in convs)


def test_measure_rows():
    rows = measure([DrafterSize.papers(32, 256)], [None, 16], block_size=4, rounds=3, accept=1, prompt_len=16)
    assert [(r["head"], r["pool_size"]) for r in rows] == [("domino", None), ("domino", 16), ("dspark", None),
                                                           ("dflash2", None)]
    assert rows[0]["backbone_ms"] == rows[1]["backbone_ms"] == rows[2]["backbone_ms"] == rows[3]["backbone_ms"] > 0
    for r in rows:
        assert r["ratio"] > 0  # the median of the paired per-round ratios
        assert r["head_ms"] == pytest.approx(r["drafter_ms"] - r["backbone_ms"])
        assert (r["hidden"], r["vocab"], r["block_size"], r["num_layers"]) == (32, 256, 4, 1)
    only = measure([DrafterSize.papers(32, 256)], [16], block_size=4, rounds=2, accept=1, prompt_len=16,
                   heads=("dspark",))
    assert [(r["head"], r["pool_size"]) for r in only] == [("dspark", None)]  # a pool is Domino's only


@pytest.mark.parametrize("kw, match", [({"block_size": 1}, "block_size"), ({"accept": 3}, "accept"),
                                       ({"rounds": 0}, "rounds"), ({"pools": [257]}, "pool"),
                                       ({"heads": ("medusa",)}, "unknown head 'medusa'"),
                                       ({"num_layers": 0}, "num-layers")])
def test_measure_bad_input(kw, match):
    pools = kw.pop("pools", [None])
    with pytest.raises(ValueError, match=match):
        measure([DrafterSize.papers(32, 256)], pools, **{"block_size": 4, **kw})
