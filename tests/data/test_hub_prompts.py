"""The papers' hub prompt sets, read offline from small local files in each set's hub schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_domino.data.corpora import build_corpus
from lit_domino.training.datamodule import DrafterDataModule
from lit_domino.data.hub_prompts import SOURCES, HubPromptsUnavailable, build_prompts, conversation

FIXTURES = Path(__file__).parent / "fixtures" / "hub_prompts"
FILES = {"sharegpt": "sharegpt.json", "ultrachat": "ultrachat_200k.jsonl", "nemotron": "nemotron_v2.jsonl",
         "codealpaca": "codealpaca_20k.json"}


def _spec(name):
    return f"{name}@{FIXTURES / FILES[name]}"


def _raw_rows(name):
    text = (FIXTURES / FILES[name]).read_text()
    return json.loads(text) if FILES[name].endswith(".json") else [json.loads(l) for l in text.splitlines()]


@pytest.mark.parametrize("name", list(FILES))
def test_each_loader_reads_its_hub_schema(name):
    train = build_corpus(_spec(name), "train")  # the corpus entry point regeneration uses
    eval_ = build_corpus(_spec(name), "eval")
    assert train and eval_
    for ex in train + eval_:
        roles = [m["role"] for m in ex.messages]
        assert roles == ["user", "assistant"] * (len(roles) // 2) and roles  # alternating, ends answered
        assert ex.prompt.strip() and ex.domain == name and ex.uid.startswith(f"{name}/")
    assert not {e.uid for e in train} & {e.uid for e in eval_}  # a conversation is in one split only
    assert not {e.prompt for e in train} & {e.prompt for e in eval_}
    # seeded and reproducible; n takes a prefix of the shuffled list
    assert [e.uid for e in build_corpus(_spec(name), "train", seed=0)] == [e.uid for e in train]
    assert [e.uid for e in build_corpus(_spec(name), "train", n=3)] == [e.uid for e in train[:3]]
    assert {e.uid for e in build_corpus(_spec(name), "train", seed=1)} == {e.uid for e in train}
    with pytest.raises(ValueError, match="asked for n="):
        build_corpus(_spec(name), "train", n=len(train) + 1)


def test_sharegpt_rows_become_clean_conversations():
    by_id = {e.uid: e for s in ("train", "eval") for e in build_prompts(_spec("sharegpt"), s)}
    assert "sharegpt/empty_human" not in by_id and "sharegpt/unanswered" not in by_id
    assert "sharegpt/dup" not in by_id  # its opening prompt repeats sg000_0's
    assert by_id["sharegpt/gpt_first"].prompt == "Explain gravity."  # a leading assistant turn is skipped
    assert by_id["sharegpt/trailing"].user_turns == ("Name a colour.",)  # cut after the last answer
    assert by_id["sharegpt/sg001_0"].messages[0]["content"] == "Explain the French revolution."  # system dropped
    assert len(by_id["sharegpt/sg003_0"].messages) == 4  # multi-turn kept
    rows = _raw_rows("sharegpt")
    assert len(by_id) == len(rows) - 3


def test_codealpaca_prompt_is_instruction_then_input_and_nemotron_drops_system():
    examples = build_prompts(_spec("codealpaca"), "train") + build_prompts(_spec("codealpaca"), "eval")
    prompts = {e.prompt for e in examples}
    assert "Write a function about binary search.\n\ndef f(x): # 0" in prompts
    assert "Write a function about the French revolution." in prompts  # no input: the instruction alone
    assert len(examples) == len(_raw_rows("codealpaca")) - 1  # the row without an instruction is dropped
    nemo = build_prompts(_spec("nemotron"), "train")
    assert all(e.messages[0]["role"] == "user" and e.prompt.startswith("Solve a problem") for e in nemo)


def test_conversation_rules():
    assert conversation([("system", "s"), ("human", "q"), ("gpt", "a"), ("human", "q2")]) == (
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"})
    assert conversation([("human", "q"), ("human", "q again"), ("gpt", "a")]) == ()  # broken alternation
    assert conversation([("human", None), ("gpt", "a")]) == ()


def test_offline_hub_set_names_the_embedded_alternative():
    # tests run with HF_HUB_OFFLINE / HF_DATASETS_OFFLINE: the default hub id cannot be reached
    with pytest.raises(HubPromptsUnavailable, match=r"(?s)'ultrachat'.*HuggingFaceH4/ultrachat_200k.*"
                                                    r"prompt_sources\.ultrachat.*embedded corpora"):
        build_corpus("ultrachat", "train", 10)


def test_no_usable_prompts_is_an_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"id": "a", "conversations": [{"from": "gpt", "value": "hi"}]},
                               {"id": "b", "conversations": [{"from": "human", "value": ""}]}]))
    with pytest.raises(ValueError, match=r"no usable train prompts after filtering \(2 rows; dropped no user turn"):
        build_prompts(f"sharegpt@{bad}", "train")
    with pytest.raises(ValueError, match="unknown prompt source 'poetry'.*sharegpt"):
        build_prompts("poetry", "train")


def test_datamodule_prompt_sources():
    dm = DrafterDataModule(target="embedded:smoke", train_examples={"sharegpt": None, "math": 4},
                           prompt_sources={"sharegpt": str(FIXTURES / FILES["sharegpt"])})
    domains = dict(dm.regen_config("train").domains)
    assert domains == {"math": 4, _spec("sharegpt"): None}  # the location is in the regenerated data's key
    assert dict(DrafterDataModule(train_examples={"ultrachat": 5}).regen_config("train").domains) == {"ultrachat": 5}
    with pytest.raises(ValueError, match="unknown prompt source 'sharegtp'"):
        DrafterDataModule(train_examples={"sharegtp": 5})
    assert DrafterDataModule(train_examples={"math": 0, "codealpaca": 3}).train_examples == {"codealpaca": 3}
    with pytest.raises(ValueError, match="at least one prompt source"):
        DrafterDataModule(train_examples={"math": 0})
    with pytest.raises(ValueError, match="prompt_sources names 'math'"):
        DrafterDataModule(prompt_sources={"math": "/x"})


def test_regeneration_answers_the_hub_prompts(tiny_target, tmp_path, one_thread):
    """The real path: regeneration reads a hub set through build_corpus and answers every user turn."""
    from lit_domino.data.regenerate import RegenConfig, regenerate

    cfg = RegenConfig(domains=((_spec("ultrachat"), 4),), max_new_tokens=4, batch_size=4)
    ds = regenerate(tiny_target, cfg, root=tmp_path, progress=False)
    wanted = build_corpus(_spec("ultrachat"), "train", 4)
    assert len(ds) == sum(len(e.user_turns) for e in wanted)  # two user turns each
    text = tiny_target.tokenizer.decode(ds[0]["input_ids"][: ds[0]["prompt_len"]])
    assert any(e.prompt in text for e in wanted)
    assert set(SOURCES) == set(FILES)
