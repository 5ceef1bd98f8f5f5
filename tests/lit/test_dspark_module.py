"""DSparkModule: bad hyper-parameters fail at construction, naming the field; one training step through
Lightning on the dspark feature rule (the target's distribution in the features), then lossless decoding."""

import pytest
import torch

from lit_domino.decoding import generate
from lit_domino.lit import DSparkModule
from lit_domino.testing import hf_greedy

from .test_modules import SMALL, FixedData, target, trainer  # noqa: F401 (the fixture)


@pytest.mark.parametrize("kwargs,message", [
    (dict(rank=0), "rank must be a positive integer"),
    (dict(head_type="lstm"), "unknown DSpark head_type 'lstm'"),
    (dict(tv_weight=-1.0), "tv_weight must be a finite number >= 0"),
    (dict(confidence=False), "confidence_weight=1.0 asks for a confidence loss"),
])
def test_bad_hyper_parameters_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DSparkModule(target="embedded:smoke", **kwargs)


@pytest.mark.parametrize("head_type", ["gated", "rnn"])
def test_dspark_module_trains_a_step_and_decodes_losslessly(tmp_path, target, head_type):  # noqa: F811
    torch.manual_seed(0)
    module = DSparkModule(target=target, rank=8, head_type=head_type, **SMALL)
    layers = target.layer_ids("dspark", 2)
    data = FixedData(target, repeat=2, feature_layers=layers)
    trainer(tmp_path, max_steps=2).fit(module, datamodule=data)
    drafter, prompt = module.drafter, data.rows["input_ids"][0, :6]
    assert drafter.config.feature_layers == layers and drafter.config.head.head_type == head_type
    assert drafter.head.w2.weight.abs().sum() > 0  # W2 (zero at init) moved
    assert generate(target, drafter, prompt, max_new_tokens=10).tokens == hf_greedy(target, prompt.tolist(), 10)
