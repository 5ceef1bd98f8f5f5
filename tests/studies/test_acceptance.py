"""The acceptance study's plan: which predictors each parallel drafter gets, and the table's rows (no training: the
end-to-end run is experiments/acceptance.py --preset smoke)."""

from __future__ import annotations

import pytest
import torch

from lit_domino.models import build_drafter, drafter_config
from lit_domino.studies import acceptance as study
from lit_domino.studies.acceptance_command import parse_args
from lit_domino.testing import lively_target


@pytest.fixture(scope="module")
def target():
    return lively_target(128, seed=0)


def random_drafter(target, kind):
    torch.manual_seed(0)
    kw = dict(num_layers=1) if kind == "backbone" else dict(num_layers=1, head=dict(rank=8))
    return build_drafter(drafter_config(kind, target, block_size=5, **kw), target)


def test_every_parallel_drafter_and_the_gru_head_are_in_the_study(target):
    assert study.STUDY_DRAFTERS == ("backbone", "domino", "dspark", "dflash2")
    assert parse_args([]).drafters == ",".join(study.STUDY_DRAFTERS)
    plans = {kind: study.predictor_variants(kind, random_drafter(target, kind)) for kind in study.STUDY_DRAFTERS}
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
