"""The tree study (experiments/trees.py): its plan and bad input, and the measure → report path end to end on a tiny
random target with random drafters (no training: the real run is ``experiments/trees.py --preset smoke``)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import yaml
import torch

from lit_domino.decoding.cost import VerifyCost
from lit_domino.models import build_drafter, drafter_config
from lit_domino.runtime.command import UsageError
from lit_domino.studies import trees as ts
from lit_domino.studies import trees_command
from lit_domino.testing import lively_target

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 128


def test_plan_defaults_builders_per_drafter_and_the_small_lm_skipped():
    plan = ts.study_plan("smoke")
    assert plan.drafters == ["backbone", "domino", "dspark", "dflash2", "eagle3"]
    assert plan.builders == {"backbone": ["ddtree"], "domino": ["ddtree", "path"], "dspark": ["ddtree", "path"],
                                "dflash2": ["ddtree", "path"], "eagle3": ["path", "eagle"]}
    assert plan.budgets == [16, 32, 64] and plan.cost_cap == 64 and plan.top_k == 4
    # 1 AR + per drafter its chain and (3 budgets + cost-aware) per builder
    assert ts.method_count(plan) == 1 + (1 + 4) + (1 + 8) + (1 + 8) + (1 + 8) + (1 + 8)
    plan = ts.study_plan("smoke", drafters=["small_lm", "domino"], builders=["path"], budgets=[32, 8, 32], top_k=2)
    assert plan.drafters == ["domino"] and "small_lm" in plan.skipped
    assert plan.builders == {"domino": ["path"]} and plan.budgets == [8, 32] and plan.top_k == 2
    study = yaml.safe_load(ts.STUDY_FILE.read_text())
    assert ts.study_plan("default").prompts == study["presets"]["default"]["prompts"]  # the file's, per domain


@pytest.mark.parametrize("kwargs, needle", [
    (dict(drafters=["nosuch"]), "drafters: unknown \\['nosuch'\\]"),
    (dict(drafters=["small_lm"]), "none has a tree builder"),
    (dict(builders=["chain"]), "builders: unknown \\['chain'\\].*always decoded"),
    (dict(builders=["beam"]), "builders: unknown \\['beam'\\]"),
    (dict(drafters=["backbone"], builders=["path"]), "no drafter of \\['backbone'\\] builds them"),
    (dict(budgets=[0]), "budgets: a tree budget .* >= 1, got 0"),
    (dict(budgets=[16.5]), "budgets: .* got 16.5"),
    (dict(top_k=0), "top_k must be an integer >= 1"),
])
def test_bad_input_is_refused_by_the_plan(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        ts.study_plan("smoke", **kwargs)


@pytest.mark.parametrize("argv, needle", [
    (["--builders", "beam"], "--builders: unknown ['beam']"),
    (["--budgets", "16,x"], "--budgets: expected integers"),
    (["--budgets", "0"], "--budgets: a tree budget is at least 1"),
    (["--drafters", "nosuch"], "drafters: unknown ['nosuch']"),
    (["--preset", "huge"], "--preset: unknown preset 'huge'"),
])
def test_the_command_refuses_bad_input_in_one_line(argv, needle, capsys):
    with pytest.raises(SystemExit) as done:
        trees_command.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(err) == 1 and err[0].startswith("trees.py: error: ") and needle in err[0]


def test_method_labels_round_trip():
    assert ts.method_of(None) == {"builder": "chain", "budget": 0, "cost": False, "name": "chain"}
    assert ts.method_of("path:32k4") == {"builder": "path", "budget": 32, "cost": False, "name": "path:32"}
    assert ts.method_of("ddtree:64k4+cost")["name"] == "ddtree:cost<=64"


def test_projection_moves_only_the_width_cost():
    row = {"draft_ms_per_round": 2.0, "verify_ms_per_round": 10.0, "other_ms_per_round": 1.0,
           "nodes_per_round": 32.0, "speedup": 1.5}
    flat = VerifyCost((1, 64), (0.004, 0.004))
    assert ts.projected_speedup(row, flat) == pytest.approx(1.5)  # already GPU-shaped: the measured speedup
    steep = VerifyCost((1, 32, 64), (0.002, 0.008, 0.016))  # C_v(32) - C_v(1) = 6 ms of the 10 measured
    assert ts.projected_speedup(row, steep) == pytest.approx(1.5 * 13 / (2 + 4 + 1))
    assert math.isnan(ts.projected_speedup({**row, "nodes_per_round": 65.0}, steep))  # beyond the flat range


def test_rank_fractions_sum_to_one():
    fr = ts.rank_fractions([6, 3, 1, 0, 2])
    assert fr["accepted"] == 12 and fr["rank0"] + fr["rank1"] + fr["rank2+"] == pytest.approx(1.0)
    assert fr["rank2+"] == pytest.approx(3 / 12)
    assert math.isnan(ts.rank_fractions([])["rank0"])


def _drafter(target, kind, seed):
    torch.manual_seed(seed)
    over = {"domino": dict(num_layers=1, head=dict(rank=16, gru_hidden=32)),
            "dspark": dict(num_layers=1, head=dict(rank=16, head_type="rnn"))}.get(kind, dict(num_layers=1))
    drafter = build_drafter(drafter_config(kind, target, block_size=5, **over), target)
    with torch.no_grad():  # a head that matters: the path trees differ from the marginals'
        for name, p in drafter.named_parameters():
            if name.startswith("head.") and any(w in name for w in ("up.", "w1.", "w2.", "joint.")):
                p.normal_(0, 0.5)
    return drafter.eval()


@pytest.fixture(scope="module")
def measured():
    target = lively_target(VOCAB, max_positions=128)
    drafters = {k: _drafter(target, k, i) for i, k in enumerate(("backbone", "domino", "eagle3"))}
    plan = ts.study_plan("smoke", drafters=list(drafters), budgets=[4, 8])
    plan = dataclasses.replace(plan, prompts={"random-a": 2, "random-b": 1}, max_new_tokens=12, cost_cap=8,
                               pool_size=None)
    g = torch.Generator().manual_seed(0)
    prompts = {name: [torch.randint(3, VOCAB - 1, (10,), generator=g).tolist() for _ in range(n)]
               for name, n in plan.prompts.items()}
    rows = ts.measure(target, drafters, prompts, plan, progress=False)
    return plan, rows


def test_the_study_runs_end_to_end_and_writes_everything(measured, tmp_path):
    plan, rows = measured
    out = ts.report(rows, plan, tmp_path, mlflow_enabled=True)
    for suffix in ("md", "json", "png"):
        assert (tmp_path / f"trees-smoke.{suffix}").stat().st_size > 0
    data = json.loads((tmp_path / "trees-smoke.json").read_text())
    cells = data["trees"]["rows"]
    methods = {(c["drafter"], c["method"]) for c in cells}
    assert methods == {("backbone", m) for m in ("chain", "ddtree:4", "ddtree:8", "ddtree:cost<=8")} | {
        ("domino", m) for m in ("chain", "ddtree:4", "ddtree:8", "ddtree:cost<=8", "path:4", "path:8",
                                "path:cost<=8")} | {
        ("eagle3", m) for m in ("chain", "path:4", "path:8", "path:cost<=8", "eagle:4", "eagle:8", "eagle:cost<=8")}
    assert len(cells) == 2 * len(methods)  # per domain
    assert all(c["match_baseline"] == 1.0 for c in cells)
    trees = [c for c in cells if c["builder"] != "chain"]
    assert all(0 < c["nodes_per_round"] <= c["budget"] for c in trees)  # the tree never verifies above its budget
    assert all(c["verify_ms_per_round"] > 0 and c["draft_ms_per_round"] > 0 for c in cells)
    # the projection: a column of every row, labelled so in the JSON and the Markdown
    assert "projection" in data["trees"]["projection"] and all("projected_speedup" in c for c in cells)
    assert any(c["projected_speedup"] is not None for c in cells)
    md = (tmp_path / "trees-smoke.md").read_text()
    assert "projected speedup (GPU-shaped C_v)" in md and "## Verify-cost curve" in md
    # sibling ranks: per builder, fractions that sum to 1 over the accepted nodes
    sib = data["siblings"]["rows"]
    assert {r["builder"] for r in sib if r["drafter"] == "all"} == {"ddtree", "path", "eagle"}
    for r in sib:
        if r["accepted"]:
            assert r["rank0"] + r["rank1"] + r["rank2+"] == pytest.approx(1.0)
    assert [r["nodes"] for r in data["verify_cost"]["rows"]] == [1, 2, 4, 8, 16, 32, 64]
    assert [r["budget"] for r in data["verify_cost"]["in_decode"]] == [0, 4, 8]  # the chain, then each budget
    # MLflow: every cell a metric, the files as artifacts
    from mlflow.tracking import MlflowClient

    from lit_domino.runtime.tracking import default_tracking_uri

    client = MlflowClient(default_tracking_uri())
    run = client.get_run(out["run_id"])
    assert run.data.metrics["domino.path:8.random-a.tau"] == pytest.approx(
        next(c["tau"] for c in cells if c["drafter"] == "domino" and c["method"] == "path:8"
             and c["domain"] == "random-a"))
    assert any(k.startswith("siblings.path.all.rank0") for k in run.data.metrics)
    assert {a.path for a in client.list_artifacts(out["run_id"], "tables")} == {
        f"tables/trees-smoke.{s}" for s in ("md", "json", "png")}


def test_a_row_that_is_not_lossless_stops_the_study(measured, tmp_path):
    plan, rows = measured
    bad = [dict(r) for r in rows]
    victim = next(r for r in bad if r.get("kind") == "drafter" and (r.get("key") or {}).get("tree"))
    victim["match_baseline"] = 0.5
    with pytest.raises(RuntimeError, match="not lossless.*" + victim["method"].replace("+", "\\+")
                                           .replace("(", "\\(").replace(")", "\\)")):
        ts.report(bad, plan, tmp_path, mlflow_enabled=False)
    assert not (tmp_path / "trees-smoke.md").exists()  # no table of a run that was not lossless


def test_a_budget_above_the_context_is_refused_before_decoding():
    target = lively_target(VOCAB, max_positions=40)
    drafters = {"backbone": _drafter(target, "backbone", 0)}
    plan = ts.study_plan("smoke", drafters=["backbone"], budgets=[32])
    plan = dataclasses.replace(plan, prompts={"random": 1}, max_new_tokens=4)
    with pytest.raises(UsageError, match="tree budget 32 is above what the context leaves"):
        ts.measure(target, drafters, {"random": [list(range(3, 13))]}, plan, progress=False)


def test_rows_carry_nodes_per_round_and_the_accepted_ranks_of_every_turn():
    from lit_domino.decoding.engine import GenerationResult
    from lit_domino.decoding.metrics import merge_results, summarize

    turns = [GenerationResult(tokens=[5, 6, 7], accepted_per_round=[1, 0], drafted_per_round=[8, 4],
                              accepted_ranks=[1]).finish(),
             GenerationResult(tokens=[8, 9, 10, 11], accepted_per_round=[2], drafted_per_round=[6],
                              accepted_ranks=[0, 2]).finish()]
    row = summarize([merge_results(turns)])
    assert row["nodes_per_round"] == pytest.approx(6.0) and row["accepted_rank_counts"] == [1, 1, 1]
    assert "accepted_rank_counts" not in summarize([GenerationResult(tokens=[1, 2], accepted_per_round=[0],
                                                                     drafted_per_round=[3]).finish()])
