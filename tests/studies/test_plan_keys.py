"""The studies' plans are frozen dataclasses now; the JSON they feed to the row caches and the summary files must be
what the dict plans gave, byte for byte, so a warm cache is reused and the written plans read the same. The literals
below were produced by the dict plans' code (main at 905de83) for the same inputs."""

import json
from types import SimpleNamespace as NS

import pytest

from lit_domino.runtime.jsonio import to_json
from lit_domino.studies import ablation, dloop, objectives, trees

EXPECTED = {
    'ablation/default':
        '{"rows": 2, "drafters": ["d/a", "d/b"], "plan": {"seeds": [0, 1], "prompts": {"embedded-math": 10, "embedded-code": 8, "embedded-chat": 8}, "max_new_tokens": 128, "temperatures": [0.0], "peers": ["prompt_lookup", "assisted"], "threads": 1, "compiled_baseline": true, "pool_size": 64, "variants": ["eagle3", "small_lm", "backbone", "domino", "dspark", "dflash2", "domino_ttt", "domino_nocurriculum"], "inner_backbone": ["domino", "domino_nocurriculum"], "exact_head": ["domino"]}, "target": "target-fp"}',
    'ablation/default/subset':
        '{"rows": 2, "drafters": ["d/a"], "plan": {"seeds": [3], "prompts": {"embedded-math": 10, "embedded-code": 8, "embedded-chat": 8}, "max_new_tokens": 128, "temperatures": [0.0], "peers": ["prompt_lookup", "assisted"], "threads": 1, "compiled_baseline": true, "pool_size": 64, "variants": ["domino", "backbone"], "inner_backbone": ["domino"], "exact_head": ["domino"], "overrides": {"data.train_examples": {"math": 4000}}}, "target": "target-fp"}',
    'ablation/paper':
        '{"rows": 2, "drafters": ["d/a"], "plan": {"seeds": [0], "prompts": {"gsm8k": 128, "math500": 128, "aime24": 30, "aime25": 30, "humaneval": 164, "mbpp": 128, "livecodebench": 128, "mt-bench": 80, "alpaca": 128}, "max_new_tokens": 2048, "temperatures": [0.0], "peers": ["prompt_lookup"], "compiled_baseline": true, "pool_size": null, "variants": ["eagle3", "small_lm", "backbone", "domino", "dspark", "dflash2", "domino_ttt", "domino_nocurriculum"], "inner_backbone": ["domino", "domino_nocurriculum"], "exact_head": []}, "target": "target-fp"}',
    'ablation/rehearsal':
        '{"rows": 2, "drafters": ["d/a"], "plan": {"seeds": [0], "prompts": {"gsm8k": 1, "humaneval": 1, "mt-bench": 1}, "benchmark_files": {"gsm8k": "tests/data/fixtures/gsm8k.jsonl", "humaneval": "tests/data/fixtures/humaneval.jsonl", "mt-bench": "tests/data/fixtures/mt_bench.jsonl"}, "max_new_tokens": 8, "temperatures": [0.0], "peers": ["prompt_lookup"], "pool_size": null, "threads": 1, "variants": ["eagle3", "small_lm", "backbone", "domino", "dspark", "dflash2", "domino_ttt", "domino_nocurriculum"], "inner_backbone": ["domino", "domino_nocurriculum"], "exact_head": []}, "target": "target-fp"}',
    'ablation/smoke':
        '{"rows": 2, "drafters": ["d/a", "d/b"], "plan": {"seeds": [0], "prompts": {"embedded-math": 2, "embedded-code": 2, "embedded-chat": 2}, "max_new_tokens": 32, "temperatures": [0.0], "peers": ["prompt_lookup", "assisted"], "compiled_baseline": false, "threads": 1, "pool_size": 64, "variants": ["eagle3", "small_lm", "backbone", "domino", "dspark", "dflash2", "domino_ttt", "domino_nocurriculum"], "inner_backbone": ["domino", "domino_nocurriculum"], "exact_head": ["domino"]}, "target": "target-fp"}',
    'ablation/smoke/subset':
        '{"rows": 2, "drafters": ["d/a"], "plan": {"seeds": [3], "prompts": {"embedded-math": 2, "embedded-code": 2, "embedded-chat": 2}, "max_new_tokens": 32, "temperatures": [0.0], "peers": ["prompt_lookup", "assisted"], "compiled_baseline": false, "threads": 1, "pool_size": 64, "variants": ["domino", "backbone"], "inner_backbone": ["domino"], "exact_head": ["domino"], "overrides": {"data.train_examples": {"math": 4000}}}, "target": "target-fp"}',
    'dloop/default':
        '{"drafters": {"backbone/plain": "d/backbone", "domino/plain": "d/domino", "dspark/plain": "d/dspark", "dflash2/plain": "d/dflash2", "eagle3/plain": "d/eagle3"}, "plan": {"prompts": {"embedded-math": 10, "embedded-code": 10, "embedded-chat": 10}, "max_new_tokens": 128, "thresholds": [-0.5], "stages": [1, 3], "table_dloop": {"threshold": -0.5, "max_stages": 3}, "gates": [{"threshold": 0.5, "max_stages": 3, "gate": "conf"}, {"threshold": null, "max_stages": 3, "gate": "cost"}, {"threshold": -0.5, "max_stages": 1, "truncate": 0.3}], "pool_size": 64, "repeats": 3, "seed": 0, "threads": 1, "block_sizes": [4], "sweep_gates": [{"threshold": -0.5, "max_stages": 3}, {"threshold": 0.5, "max_stages": 3, "gate": "conf"}], "control": true}, "target": "target-fp", "predictors": {"prompts": 80, "label": "hard", "calibration_label": "hard", "inputs": "hidden", "own_head": true, "head_rows": "reached", "offsets": true, "stage_fit": true, "survival_fit": true, "steps": 300, "lr": 0.05, "stages": 3, "anchors_per_sequence": 24, "anchors": "decode", "max_new_tokens": 128, "temperature": 0.0, "pool_size": null, "seed": 0}}',
    'dloop/default/plan':
        '{"seed": 0, "prompts": {"embedded-math": 10, "embedded-code": 10, "embedded-chat": 10}, "max_new_tokens": 128, "threads": 1, "repeats": 3, "thresholds": [-0.5], "stages": [1, 3], "block_sizes": [4], "sweep_gates": [{"threshold": -0.5, "max_stages": 3}, {"threshold": 0.5, "max_stages": 3, "gate": "conf"}], "base_overrides": {"eagle3": {"data.block_size": 8}}, "loop": {"max_stages": 3, "min_stages": 2, "lr": 0.0006, "warmup_ratio": 0.05}, "loop_trainer": {"max_epochs": 1}, "loop_trainer_by_drafter": {"dspark": {"limit_train_batches": 0.5}, "dflash2": {"limit_train_batches": 0.5}}, "detach_stage_context": [true], "control": true, "preset": "default", "drafters": ["backbone", "domino", "dspark", "dflash2", "eagle3"], "table_dloop": {"threshold": -0.5, "max_stages": 3}, "pool_size": 64, "gates": [{"threshold": 0.5, "max_stages": 3, "gate": "conf"}, {"threshold": null, "max_stages": 3, "gate": "cost"}, {"threshold": -0.5, "max_stages": 1, "truncate": 0.3}], "skipped": [{"drafter": "eagle3", "gate": "conf@0.5:3", "why": "the gate conf@0.5:3 reads an acceptance predictor (calibrated stage survival), which parallel drafters have; eagle3 drafts token by token"}, {"drafter": "eagle3", "gate": "cost:3", "why": "the gate cost:3 reads an acceptance predictor (calibrated stage survival), which parallel drafters have; eagle3 drafts token by token"}, {"drafter": "eagle3", "gate": "trunc@0.3", "why": "the gate trunc@0.3 reads an acceptance predictor (calibrated stage survival), which parallel drafters have; eagle3 drafts token by token"}]}',
    'dloop/smoke':
        '{"drafters": {"backbone/plain": "d/backbone", "domino/plain": "d/domino", "dspark/plain": "d/dspark", "dflash2/plain": "d/dflash2", "eagle3/plain": "d/eagle3"}, "plan": {"prompts": {"embedded-math": 3, "embedded-code": 3, "embedded-chat": 3}, "max_new_tokens": 48, "thresholds": [-0.5, -1.0], "stages": [1, 3], "table_dloop": {"threshold": -0.5, "max_stages": 3}, "gates": [{"threshold": 0.5, "max_stages": 3, "gate": "conf"}, {"threshold": null, "max_stages": 3, "gate": "cost"}, {"threshold": -0.5, "max_stages": 1, "truncate": 0.3}], "pool_size": 64, "repeats": 1, "seed": 0, "threads": 1, "block_sizes": [4], "sweep_gates": [{"threshold": -0.5, "max_stages": 3}, {"threshold": 0.5, "max_stages": 3, "gate": "conf"}], "control": true}, "target": "target-fp", "predictors": {"prompts": 32, "label": "hard", "calibration_label": "hard", "inputs": "hidden", "own_head": true, "head_rows": "reached", "offsets": true, "stage_fit": true, "survival_fit": true, "steps": 300, "lr": 0.05, "stages": 2, "anchors_per_sequence": 24, "anchors": "decode", "max_new_tokens": 64, "temperature": 0.0, "pool_size": null, "seed": 0}}',
    'dloop/smoke/plan':
        '{"seed": 0, "prompts": {"embedded-math": 3, "embedded-code": 3, "embedded-chat": 3}, "max_new_tokens": 48, "threads": 1, "thresholds": [-0.5, -1.0], "stages": [1, 3], "block_sizes": [4], "sweep_gates": [{"threshold": -0.5, "max_stages": 3}, {"threshold": 0.5, "max_stages": 3, "gate": "conf"}], "base_overrides": {"eagle3": {"data.block_size": 4}}, "loop": {"max_stages": 3, "min_stages": 2, "lr": 0.001, "warmup_ratio": 0.1}, "loop_trainer": {"max_epochs": 1}, "loop_trainer_by_drafter": {"dspark": {"limit_train_batches": 4}, "dflash2": {"limit_train_batches": 4}}, "detach_stage_context": [true, false], "control": true, "preset": "smoke", "drafters": ["backbone", "domino", "dspark", "dflash2", "eagle3"], "table_dloop": {"threshold": -0.5, "max_stages": 3}, "pool_size": 64, "repeats": 1, "gates": [{"threshold": 0.5, "max_stages": 3, "gate": "conf"}, {"threshold": null, "max_stages": 3, "gate": "cost"}, {"threshold": -0.5, "max_stages": 1, "truncate": 0.3}], "skipped": [{"drafter": "eagle3", "gate": "conf@0.5:3", "why": "the gate conf@0.5:3 reads an acceptance predictor (calibrated stage survival), which parallel drafters have; eagle3 drafts token by token"}, {"drafter": "eagle3", "gate": "cost:3", "why": "the gate cost:3 reads an acceptance predictor (calibrated stage survival), which parallel drafters have; eagle3 drafts token by token"}, {"drafter": "eagle3", "gate": "trunc@0.3", "why": "the gate trunc@0.3 reads an acceptance predictor (calibrated stage survival), which parallel drafters have; eagle3 drafts token by token"}]}',
    'objectives/default':
        '{"drafters": [["domino/kl", 0, "d/x"], ["backbone/own", 1, "d/y"]], "plan": {"prompts": {"embedded-math": 10, "embedded-code": 8, "embedded-chat": 8}, "max_new_tokens": 128, "threads": 1, "temperatures": [0.0], "pool_size": 64}, "target": "target-fp"}',
    'objectives/smoke':
        '{"drafters": [["domino/kl", 0, "d/x"], ["backbone/own", 1, "d/y"]], "plan": {"prompts": {"embedded-math": 2, "embedded-code": 2, "embedded-chat": 2}, "max_new_tokens": 32, "threads": 1, "temperatures": [0.0], "pool_size": 64}, "target": "target-fp"}',
    'trees/default':
        '{"drafters": {"backbone": "d/backbone", "domino": "d/domino", "dspark": "d/dspark", "dflash2": "d/dflash2", "eagle3": "d/eagle3"}, "plan": {"prompts": {"embedded-math": 10, "embedded-code": 10, "embedded-chat": 10}, "max_new_tokens": 128, "builders": {"backbone": ["ddtree"], "domino": ["ddtree", "path"], "dspark": ["ddtree", "path"], "dflash2": ["ddtree", "path"], "eagle3": ["path", "eagle"]}, "budgets": [16, 32, 64], "cost_aware": true, "cost_cap": 64, "top_k": 4, "repeats": 2, "pool_size": 64, "seed": 0, "threads": 1, "curve_repeats": 10}, "target": "target-fp"}',
    'trees/default/plan':
        '{"seed": 0, "prompts": {"embedded-math": 10, "embedded-code": 10, "embedded-chat": 10}, "max_new_tokens": 128, "repeats": 2, "threads": 1, "preset": "default", "skipped": {}, "drafters": ["backbone", "domino", "dspark", "dflash2", "eagle3"], "builders": {"backbone": ["ddtree"], "domino": ["ddtree", "path"], "dspark": ["ddtree", "path"], "dflash2": ["ddtree", "path"], "eagle3": ["path", "eagle"]}, "budgets": [16, 32, 64], "cost_aware": true, "cost_cap": 64, "top_k": 4, "pool_size": 64, "curve_repeats": 10}',
    'trees/smoke':
        '{"drafters": {"backbone": "d/backbone", "domino": "d/domino", "dspark": "d/dspark", "dflash2": "d/dflash2", "eagle3": "d/eagle3"}, "plan": {"prompts": {"embedded-math": 2, "embedded-code": 2, "embedded-chat": 2}, "max_new_tokens": 32, "builders": {"backbone": ["ddtree"], "domino": ["ddtree", "path"], "dspark": ["ddtree", "path"], "dflash2": ["ddtree", "path"], "eagle3": ["path", "eagle"]}, "budgets": [16, 32, 64], "cost_aware": true, "cost_cap": 64, "top_k": 4, "repeats": 1, "pool_size": 64, "seed": 0, "threads": 1, "curve_repeats": 10}, "target": "target-fp"}',
    'trees/smoke/plan':
        '{"seed": 0, "prompts": {"embedded-math": 2, "embedded-code": 2, "embedded-chat": 2}, "max_new_tokens": 32, "repeats": 1, "threads": 1, "preset": "smoke", "skipped": {}, "drafters": ["backbone", "domino", "dspark", "dflash2", "eagle3"], "builders": {"backbone": ["ddtree"], "domino": ["ddtree", "path"], "dspark": ["ddtree", "path"], "dflash2": ["ddtree", "path"], "eagle3": ["path", "eagle"]}, "budgets": [16, 32, 64], "cost_aware": true, "cost_cap": 64, "top_k": 4, "pool_size": 64, "curve_repeats": 10}',
}


class Target:
    def fingerprint(self):
        return "target-fp"


@pytest.mark.parametrize("preset", ["smoke", "default", "paper", "rehearsal"])
def test_ablation_rows_key(preset):
    dirs = ["d/a", "d/b"] if preset in ("smoke", "default") else ["d/a"]  # as the literals were made
    assert json.dumps(ablation.eval_key(ablation.study_plan(preset), dirs, Target())) == EXPECTED[f"ablation/{preset}"]


@pytest.mark.parametrize("preset", ["smoke", "default"])
def test_ablation_subset_with_overrides_key(preset):
    plan = ablation.study_plan(preset, variants=["domino", "backbone"], seeds=[3],
                               overrides={"data.train_examples": {"math": 4000}})
    assert json.dumps(ablation.eval_key(plan, ["d/a"], Target())) == EXPECTED[f"ablation/{preset}/subset"]


@pytest.mark.parametrize("preset", ["smoke", "default"])
def test_objectives_rows_key(preset):
    trained = [NS(variant="domino/kl", seed=0, drafter_dir="d/x"),
               NS(variant="backbone/own", seed=1, drafter_dir="d/y")]
    key = objectives.eval_key(objectives.study_plan(preset), trained, Target())
    assert json.dumps(key) == EXPECTED[f"objectives/{preset}"]


@pytest.mark.parametrize("preset", ["smoke", "default"])
def test_trees_rows_key_and_written_plan(preset):
    plan = trees.study_plan(preset)
    trained = {k: NS(drafter_dir=f"d/{k}") for k in plan.drafters}
    assert json.dumps(trees.eval_key(plan, trained, Target())) == EXPECTED[f"trees/{preset}"]
    assert json.dumps(to_json(plan.as_dict())) == EXPECTED[f"trees/{preset}/plan"]


@pytest.mark.parametrize("preset", ["smoke", "default"])
def test_dloop_rows_key_and_written_plan(preset):
    plan = dloop.study_plan(preset)
    trained = {f"{k}/plain": NS(drafter_dir=f"d/{k}") for k in plan.drafters}
    assert json.dumps(dloop.eval_key(plan, trained, Target())) == EXPECTED[f"dloop/{preset}"]
    assert json.dumps(to_json(plan.as_dict())) == EXPECTED[f"dloop/{preset}/plan"]
