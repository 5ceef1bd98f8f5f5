"""Selecting an objective from a config: ``model.objective`` (YAML, ``--set``) reaches the module; a bad one is
one line before anything trains; an objective that needs the target's distribution reads the ``dspark``
features (the backbone and Domino) or is refused where no feature rule carries it (EAGLE-3); a config that
names no objective keeps the cache key it had before objectives existed."""

from pathlib import Path

import pytest
import torch

from lit_domino.training.cli import ConfigError, check_config
from lit_domino.training.configs import available_variants, load_config, resolve_feature_rule
from lit_domino.training.experiment import drafter_artifact, training_key


@pytest.mark.parametrize("variant,override,message", [
    ("backbone", {"model.objective.name": "kll"}, "objective: unknown objective 'kll' (did you mean kl?)"),
    ("domino", {"model.objective": {"name": "kl", "tempreture": 2}},
     "objective.tempreture: the 'kl' objective has no setting 'tempreture'; did you mean objective.temperature?"),
    ("dflash2", {"model.objective": {"name": "dpace", "dpace_alpha": 2}},
     "objective.dpace_alpha must be a number in [0.0, 1.0], got 2"),
    ("eagle3", {"model.objective": "kl"}, "objective: 'kl' needs the target's distribution p at every labelled "
                                          "position, which the 'dspark' feature rule carries"),
    ("small_lm", {"model.objective": "ce"}, "objective: SmallLMModule trains on its own loss only"),
    ("dspark", {"model.objective": "kl", "model.tv_weight": 0.5}, "ce_weight/tv_weight weigh DeepSpec's CE + TV"),
])
def test_a_bad_objective_is_one_line_before_anything_trains(variant, override, message):
    with pytest.raises(ConfigError) as err:
        check_config(load_config(variant, "smoke", 0, override), trainer=False)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_train_command_refuses_it_in_one_line(capsys):
    from lit_domino.training.train import main

    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--variant", "backbone", "--preset", "smoke", "--set", "model.objective.name=lk_lamda"],
             run=False)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert err.startswith("train: error: objective: unknown objective 'lk_lamda' (did you mean lk_lambda"), err


def test_a_good_objective_reaches_the_module_from_yaml():
    from lit_domino.training.cli import _ParseOnlyCLI, cli_args

    cfg = load_config("domino", "smoke", 0, {"model.objective": {"name": "lk_lambda", "variant": "specforge"}})
    cli = _ParseOnlyCLI(args=cli_args(cfg), run=False)
    assert cli.model.objective.describe() == "lk_lambda[variant=specforge]"
    assert cli.model.hparams.objective["variant"] == "specforge"
    assert cli.datamodule.hparams.feature_rule == "dspark"  # p: DFlash's layers, then the target's last


def test_an_objective_that_needs_p_reads_the_dspark_features():
    from lit_domino.lit import BackboneModule, DominoModule, DSparkModule, Eagle3Module

    assert resolve_feature_rule({}, BackboneModule, "kl")["feature_rule"] == "dspark"
    assert resolve_feature_rule({}, DominoModule, {"name": "dpace", "label": "target"})["feature_rule"] == "dspark"
    assert resolve_feature_rule({}, BackboneModule, "accept_until_fail")["feature_rule"] == "dflash"
    assert resolve_feature_rule({}, BackboneModule, None)["feature_rule"] == "dflash"
    assert resolve_feature_rule({}, DSparkModule, "ce")["feature_rule"] == "dspark"
    assert resolve_feature_rule({}, Eagle3Module, "ce")["feature_rule"] == "eagle3"
    with pytest.raises(ConfigError, match="data.feature_rule: .*'dflash' features"):
        resolve_feature_rule({"feature_rule": "dspark"}, BackboneModule)  # without the objective: its own rule


def test_the_module_hands_its_drafter_the_dflash_layers_and_attaches_p():
    """Backbone + KL on a 4-layer target: the data holds DFlash's layers and layer 3 (the target's last); the
    drafter reads the first, the loss the last; a data layer list that does not end at the last is refused."""
    from lit_domino.lit import BackboneModule
    from lit_domino.testing import random_target

    target = random_target(vocab_size=64, hidden_size=16, num_layers=4, seed=0)
    module = BackboneModule(target=target, block_size=4, objective="kl", loss_chunk_size=8)
    drafter = module.build_drafter(feature_layers=[2, 3])
    assert drafter.config.feature_layers == [2] and module.hparams.feature_layers == [2, 3]
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(0, 60, (2, 12), generator=g), "features": torch.randn(2, 12, 32, generator=g),
             "loss_mask": torch.ones(2, 12, dtype=torch.long), "attention_mask": torch.ones(2, 12, dtype=torch.long),
             "anchors": torch.tensor([[1, 5], [2, 6]]), "anchor_mask": torch.ones(2, 2, dtype=torch.bool)}
    out = module.forward_step(batch, "train")
    out.loss.backward()
    assert torch.isfinite(out.loss) and drafter.fc.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match=r"feature layers \[1, 2\] do not end with the target's last layer \(3\)"):
        BackboneModule(target=target, block_size=4, objective="kl").build_drafter(feature_layers=[1, 2])


# Hashes of these configs' drafter artifacts computed with main's code at 0e9d003 (before objectives existed):
# a config that names no objective must keep its key (its cached drafters stay valid).
KEYS_BEFORE_OBJECTIVES = {"backbone": "backbone-s0-40187e7ad986", "domino": "domino-s0-59e556282be2"}


@pytest.mark.parametrize("variant", sorted(KEYS_BEFORE_OBJECTIVES))
def test_a_config_without_an_objective_keeps_its_cache_key(variant):
    cfg = {"seed_everything": 0,
           "model": {"class_path": f"lit_domino.lit.{variant.title()}Module",
                     "init_args": {"num_layers": 1, "lr": 2e-3, "loss_chunk_size": None}},
           "data": {"target": "org/model", "block_size": 8, "batch_size": 4},
           "trainer": {"max_epochs": 1, "enable_progress_bar": False}, "tracking": {"variant": variant}}
    assert drafter_artifact(cfg, root=Path("/r")).name == KEYS_BEFORE_OBJECTIVES[variant]
    cfg["model"]["init_args"]["objective"] = {"name": "kl"}
    assert drafter_artifact(cfg, root=Path("/r")).name != KEYS_BEFORE_OBJECTIVES[variant]


def test_no_shipped_config_names_an_objective():
    """Every variant's composed config (any preset) leaves the objective out: its training key is as before."""
    for variant in available_variants():
        if variant.startswith("loop") or variant.startswith("studies"):
            continue
        assert "objective" not in str(training_key(load_config(variant, "smoke", 0))), variant
