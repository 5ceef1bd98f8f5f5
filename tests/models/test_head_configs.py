"""The methods' head sections (DominoHeadConfig, DSparkHeadConfig, DFlash2HeadConfig): each field declared and
checked once, in the dataclass, at construction (before any target or drafter exists); a config copy with a bad
head value and a bad value set afterwards are refused the same way."""

import dataclasses

import pytest

from lit_domino.models import DFlash2HeadConfig, DominoHeadConfig, DSparkHeadConfig, drafter_config
from lit_domino.testing import random_target

HEADS = {"domino": DominoHeadConfig, "dspark": DSparkHeadConfig, "dflash2": DFlash2HeadConfig}


@pytest.mark.parametrize("cls,field,value,message", [
    (DominoHeadConfig, "rank", 0, r"head\.rank must be a positive integer \(the Domino correction's rank r\), got 0"),
    (DominoHeadConfig, "gru_hidden", 2.5, r"head\.gru_hidden must be a positive integer .*got 2\.5"),
    (DominoHeadConfig, "rank", True, r"head\.rank must be a positive integer .*got True"),
    (DSparkHeadConfig, "rank", -1, r"head\.rank must be a positive integer \(the DSpark Markov head's rank r\)"),
    (DSparkHeadConfig, "head_type", "lstm", r"head\.head_type: unknown DSpark head type 'lstm'; choose one of "
                                            r"vanilla, gated, rnn"),
    (DSparkHeadConfig, "confidence", "yes", r"head\.confidence must be true or false, got 'yes'"),
    (DFlash2HeadConfig, "top_k", 0, r"head\.top_k must be a positive integer \(the selector's candidates\), got 0"),
    (DFlash2HeadConfig, "conv_kernel_size", "2", r"head\.conv_kernel_size must be a positive integer"),
    (DFlash2HeadConfig, "conv_group_size", None, r"head\.conv_group_size must be a positive integer .*got None"),
])
def test_a_bad_head_field_fails_at_construction_naming_it(cls, field, value, message):
    with pytest.raises(ValueError, match=message):
        cls(**{field: value})
    with pytest.raises(ValueError, match=message):  # a copy is constructed, so checked too
        dataclasses.replace(cls(), **{field: value})


@pytest.fixture(scope="module")
def target():
    return random_target(vocab_size=256, hidden_size=64, num_layers=4, seed=0)


@pytest.mark.parametrize("kind", HEADS)
def test_the_defaults_are_valid_and_a_value_set_later_is_caught_by_the_config(kind, target):
    head = HEADS[kind]()
    assert head.validate() is head
    config = drafter_config(kind, target, head={"rank": 8})
    assert config.head == dataclasses.replace(head, rank=8)
    config.head.rank = 0  # mutated after construction: the method config re-checks its head
    with pytest.raises(ValueError, match=r"head\.rank must be a positive integer"):
        config.validate()
