"""The shared step of the memory benchmark and the GPU paper-step check (tiny shapes), and the memory model."""

import pytest
import torch

from lit_domino.studies.memory import GB, METHODS, StepShape, memory_model, memory_model_table, run_case

TINY = StepShape.cpu_bench(vocab_size=512, hidden_size=32, head_dim=8, intermediate_size=64, seq_len=48, anchors=6,
                           block_size=4, gru_hidden=16, rank=8, ttt_steps=2, chunk_size=7)


@pytest.mark.parametrize("method", METHODS)
def test_old_and_new_steps_agree(method):
    torch.manual_seed(0)
    old = run_case(method, "old", TINY)
    torch.manual_seed(0)
    new = run_case(method, "new", TINY)
    assert old["drafter_params"] == new["drafter_params"] > 0
    assert new["loss"][0] == pytest.approx(old["loss"][0], rel=1e-5)
    assert new["peak_bytes"] > 0 and new["step_seconds"][0] > 0


def test_bad_case_is_a_clear_error():
    with pytest.raises(ValueError, match="method must be one of"):
        run_case("nope", "new", TINY)
    with pytest.raises(ValueError, match="anchors do not fit"):
        run_case("backbone", "new", StepShape.cpu_bench(vocab_size=64, seq_len=8, anchors=16))


def test_memory_model_of_the_paper_preset():
    model = memory_model()
    total = {k: sum(r[2] for r in model[k]) / GB for k in ("old", "new", "new + activation_checkpointing")}
    assert total["old"] > 80 > total["new"] > total["new + activation_checkpointing"]
    assert 1.0e9 < model["drafter_params"] < 1.3e9  # 5 Qwen3-8B-wide layers + fusion + the Domino head
    assert "does NOT fit" in memory_model_table(model)
