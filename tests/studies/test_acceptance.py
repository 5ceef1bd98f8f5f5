"""The acceptance study's plan (:class:`AcceptancePlan`: the study file read and checked once), which predictors each
parallel drafter gets, and the table's rows (no training: the end-to-end run is experiments/acceptance.py --preset
smoke)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import yaml

from lit_domino.models import build_drafter, drafter_config
from lit_domino.studies import acceptance as study
from lit_domino.studies.acceptance_plan import STUDY_FILE, AcceptancePlan, study_plan
from lit_domino.testing import lively_target
from lit_domino.training.acceptance_settings import AcceptanceSettings
from lit_domino.training.configs import ConfigError


@pytest.fixture(scope="module")
def target():
    return lively_target(128, seed=0)


def random_drafter(target, kind):
    torch.manual_seed(0)
    kw = dict(num_layers=1) if kind == "backbone" else dict(num_layers=1, head=dict(rank=8))
    return build_drafter(drafter_config(kind, target, block_size=5, **kw), target)


def test_every_parallel_drafter_and_the_gru_head_are_in_the_study(target):
    drafters = study_plan("smoke").drafters
    assert drafters == ("backbone", "domino", "dspark", "dflash2")
    plans = {kind: study.predictor_variants(kind, random_drafter(target, kind)) for kind in drafters}
    assert plans["backbone"] == [("backbone", "backbone", {})]
    assert plans["dflash2"] == [("dflash2", "dflash2", {})]  # the add-on head on its block hidden states
    assert plans["domino"] == [("domino", "domino", {}), ("domino (GRU state)", "domino-gru", {"inputs": "gru"}),
                               ("domino (hidden + GRU)", "domino-hidden-gru", {"inputs": "hidden+gru"})]
    assert plans["dspark"] == [("dspark", "dspark", {}), ("dspark (add-on head)", "dspark-addon", {"own_head": False})]


def test_calibration_table_lists_each_predictor_and_its_positions():
    pos = dict(rounds=40, accept=0.5, auc=0.8, ece_before=0.1, ece_after=0.02, temperature=1.2, offset=0.0,
               survival_ece_before=0.2, survival_ece_after=0.03)
    rep = lambda auc: {"label": "hard", "pooled": dict(rounds=40, auc=auc, ece_before=0.1, ece_after=0.02,
                                                      survival_ece_before=0.2, survival_ece_after=0.03),
                       "positions": [dict(pos, position=1), dict(pos, position=2, rounds=3)]}
    md = study.calibration_table({"domino": rep(0.75), "domino (GRU state)": rep(0.81), "dflash2": rep(0.7)})
    rows = md.splitlines()[2:]
    assert [r.split(" | ")[0] for r in rows] == ["| **domino**", "| domino", "| **domino (GRU state)**",
                                                 "| domino (GRU state)", "| **dflash2**", "| dflash2"]
    assert "0.810 | 10.0 % | 2.0 %" in rows[2]  # pooled AUC, ECE before -> after
    assert all("| 2 |" not in r for r in rows)  # a position too few test rounds reached is left out


def test_the_plan_makes_the_predictors_settings_from_the_study_file():
    plan = study_plan("smoke", ["domino", "eagle3"], label="soft")
    section = yaml.safe_load(STUDY_FILE.read_text())["presets"]["smoke"]
    assert plan.drafters == ("domino",) and "eagle3" in plan.skipped  # eagle3 drafts token by token: never trained
    assert plan.domains == ("embedded-math", "embedded-code", "embedded-chat") and plan.skip == 16
    assert plan.given == tuple(section) and plan.prompts == section["prompts"]
    settings = plan.settings(64, inputs="gru")
    assert settings == AcceptanceSettings(label="soft", max_new_tokens=section["max_new_tokens"], inputs="gru",
                                          anchors_per_sequence=section["anchors_per_sequence"],
                                          stages=section["stages"], pool_size=64)
    # the DLoop study's rows key: the prompts and every setting but the drafter's pool, the label left to resolve
    key = study_plan("smoke").predictor_settings()
    assert list(key)[0] == "prompts" and key["pool_size"] is None and key["label"] == "hard"
    assert key == study.predictor_settings("smoke")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.prompts = 1


def write_study(tmp_path, **smoke) -> object:
    study_file = yaml.safe_load(STUDY_FILE.read_text())
    study_file["presets"]["smoke"] = {**study_file["presets"]["smoke"], **smoke}
    path = tmp_path / "acceptance.yaml"
    path.write_text(yaml.safe_dump(study_file))
    return path


@pytest.mark.parametrize("change, needle", [
    (dict(promts=3), "acceptance.yaml: presets.smoke: unknown keys ['promts']"),
    (dict(drafters=["domino"]), "unknown keys ['drafters']"),  # the study sets it (the file's top level, the CLI)
    (dict(prompts=0), "presets.smoke.prompts must be an integer >= 1, got 0"),
    (dict(stages="2"), "presets.smoke.stages must be an integer >= 1, got '2'"),
    (dict(threads=0), "presets.smoke.threads must be an integer >= 1"),
])
def test_a_bad_study_file_is_one_line_before_any_model(tmp_path, change, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        study_plan("smoke", study_file=write_study(tmp_path, **change))


def test_a_missing_setting_or_bad_domain_is_named(tmp_path):
    path = write_study(tmp_path)
    data = yaml.safe_load(path.read_text())
    del data["presets"]["smoke"]["stages"]
    data["domains"] = ["embedded-math", "nosuch"]
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="presets.smoke: missing stages"):
        study_plan("smoke", study_file=path)
    data["presets"]["smoke"]["stages"] = 2
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"domains: unknown \['nosuch'\]"):
        study_plan("smoke", study_file=path)
    with pytest.raises(ConfigError, match="label must be one of soft, hard"):
        study_plan("smoke", label="fuzzy")
    assert isinstance(study_plan("smoke", study_file=write_study(tmp_path)), AcceptancePlan)
