"""DFlash2Module: bad hyper-parameters fail at construction, naming the field; one training step through
Lightning on the dspark feature rule (the target's distribution in the features), then lossless decoding."""

import pytest
import torch

from lit_domino.decoding import generate
from lit_domino.lit import DFlash2Module
from lit_domino.models import DFlash2HeadConfig
from lit_domino.testing import hf_greedy

from .test_modules import SMALL, FixedData, target, trainer  # noqa: F401 (the fixture)


@pytest.mark.parametrize("kwargs,message", [
    (dict(head={"rank": 0}), r"head\.rank must be a positive integer"),
    (dict(head={"top_k": 0}), r"head\.top_k must be a positive integer"),
    (dict(top_k=8), r"top_k moved to head\.top_k"),
    (dict(selector_weight=-1.0), "selector_weight must be a finite number >= 0"),
])
def test_bad_hyper_parameters_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DFlash2Module(target="embedded:smoke", **kwargs)


def test_top_k_above_the_vocabulary_fails_before_training(target):  # noqa: F811
    module = DFlash2Module(target=target, head=DFlash2HeadConfig(rank=8, top_k=target.vocab_size + 1), **SMALL)
    with pytest.raises(ValueError, match=r"top_k .* \(the vocabulary size\)"):
        module.configure_model()


def test_dflash2_module_trains_a_step_and_decodes_losslessly(tmp_path, target):  # noqa: F811
    torch.manual_seed(0)
    module = DFlash2Module(target=target, head=DFlash2HeadConfig(rank=8, top_k=4, conv_group_size=8), **SMALL)
    layers = target.layer_ids("dspark", 2)
    data = FixedData(target, repeat=2, feature_layers=layers)
    trainer(tmp_path, max_steps=2).fit(module, datamodule=data)
    drafter, prompt = module.drafter, data.rows["input_ids"][0, :6]
    assert drafter.config.feature_layers == layers and drafter.config.head.top_k == 4
    assert drafter.layers[0].attention_conv.kernel_projection.weight.abs().sum() > 0  # zero at init: it moved
    assert generate(target, drafter, prompt, max_new_tokens=10).tokens == hf_greedy(target, prompt.tolist(), 10)
