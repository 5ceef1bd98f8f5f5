"""DSparkModule: bad hyper-parameters fail at construction, naming the field; one training step through
Lightning on the dspark feature rule (the target's distribution in the features), then lossless decoding."""

import pytest
import torch

from lit_domino.decoding import generate
from lit_domino.lit import DSparkModule
from lit_domino.models import DSparkHeadConfig
from lit_domino.testing import hf_greedy

from .test_modules import SMALL, FixedData, target, trainer  # noqa: F401 (the fixture)


@pytest.mark.parametrize("kwargs,message", [
    (dict(head={"rank": 0}), r"head\.rank must be a positive integer"),
    (dict(head={"head_type": "lstm"}), "head.head_type: unknown DSpark head type 'lstm'"),
    (dict(head={"confidence": "no"}), r"head\.confidence must be true or false"),
    (dict(head_type="rnn"), r"head_type moved to head\.head_type"),
    (dict(tv_weight=-1.0), "tv_weight must be a finite number >= 0"),
    (dict(head={"confidence": False}), "confidence_weight=1.0 asks for a confidence loss"),
    (dict(sample_from_anchor="yes"), "sample_from_anchor must be true or false"),
])
def test_bad_hyper_parameters_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DSparkModule(target="embedded:smoke", **kwargs)


def test_the_head_is_set_in_one_place(target):  # noqa: F811
    """``drafter_options`` cannot set the head past the module's own ``head`` (it could drop the confidence head
    under a confidence loss); without the confidence head, confidence_weight 0 trains the drafter."""
    with pytest.raises(ValueError, match=r"drafter_options \['head'\]: set by DSparkModule's own argument"):
        DSparkModule(target=target, drafter_options={"head": {"rank": 8, "confidence": False}}, **SMALL)
    with pytest.raises(ValueError, match=r"drafter_options \['sample_from_anchor'\]"):
        DSparkModule(target=target, drafter_options={"sample_from_anchor": True}, **SMALL)
    module = DSparkModule(target=target, head=DSparkHeadConfig(rank=8, confidence=False), confidence_weight=0.0,
                          **SMALL)
    assert module.build_drafter().confidence is None and module.drafter.config.head.rank == 8


@pytest.mark.parametrize("head_type,anchor", [("gated", False), ("rnn", False), ("rnn", True)])
def test_dspark_module_trains_a_step_and_decodes_losslessly(tmp_path, target, head_type, anchor):  # noqa: F811
    torch.manual_seed(0)
    module = DSparkModule(target=target, head=DSparkHeadConfig(rank=8, head_type=head_type),
                          sample_from_anchor=anchor, **SMALL)
    layers = target.layer_ids("dspark", 2)
    data = FixedData(target, repeat=2, feature_layers=layers)
    trainer(tmp_path, max_steps=2).fit(module, datamodule=data)
    drafter, prompt = module.drafter, data.rows["input_ids"][0, :6]
    assert drafter.config.feature_layers == layers and drafter.config.head.head_type == head_type
    assert drafter.config.sample_from_anchor is anchor
    assert drafter.head.w2.weight.abs().sum() > 0  # W2 (zero at init) moved
    assert generate(target, drafter, prompt, max_new_tokens=10).tokens == hf_greedy(target, prompt.tolist(), 10)


def test_the_paper_preset_is_deepspecs_dspark():
    """DeepSpec's dspark_qwen3_8b: block 7 sampled from the anchor (= our B = 8 with sample_from_anchor), 5 layers,
    the vanilla rank-256 head with its confidence head on [H; W1 x], 0.1/0.9/1.0, γ = 4, lr 6e-4, 512 anchors."""
    from lit_domino.training.configs import load_config, method_feature_rule

    cfg = load_config("dspark", "paper", 0)
    m, data = cfg["model"]["init_args"], cfg["data"]
    head = m["head"]
    assert (m["num_layers"], head["rank"], head["head_type"], m["sample_from_anchor"]) == (5, 256, "vanilla", True)
    assert (head["confidence"], head["confidence_with_markov"], m["gamma"], m["lr"]) == (True, True, 4.0, 6e-4)
    assert (m["ce_weight"], m["tv_weight"], m["confidence_weight"]) == (0.1, 0.9, 1.0)
    assert (data["block_size"], data["num_anchors"]) == (8, 512)
    assert method_feature_rule(DSparkModule) == "dspark"  # the DFlash layers + the last one, from the method
    module = DSparkModule(**{**m, "block_size": data["block_size"]})  # the module takes them (nothing loads yet)
    assert module.drafter_options()["sample_from_anchor"] is True and len(module.position_weights) == 8
