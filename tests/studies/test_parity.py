"""lit_domino.studies.parity.compare: a snapshot equals itself; a changed loss or token is reported."""

import copy

from lit_domino.studies.parity import compare

SNAP = {"domino": {"train_loss": [[1, 2.5], [3, 2.0]], "val": {"val/loss": 1.5},
                   "decode": {"embedded-math/0": {"tokens": [1, 2, 3], "tau": 2.0}}}}


def test_identical_snapshots_compare_equal():
    (row,) = compare(SNAP, copy.deepcopy(SNAP))
    assert row["max_abs_loss_diff"] == 0.0 and row["max_abs_val_diff"] == 0.0 and row["same_steps"]
    assert row["decodes_identical"] == "1/1"


def test_differences_are_reported():
    other = copy.deepcopy(SNAP)
    other["domino"]["train_loss"][1][1] = 2.25
    other["domino"]["decode"]["embedded-math/0"]["tokens"] = [1, 2, 4]
    (row,) = compare(SNAP, other)
    assert row["max_abs_loss_diff"] == 0.25 and row["decodes_identical"] == "0/1"
    assert compare(SNAP, {})[0] == {"variant": "domino", "missing_in": "after"}
