import pytest
import torch

from lit_domino import cache
from lit_domino.data.regenerate import RegenConfig, encode_conversation, regen_dir, regenerate

CFG = RegenConfig(domains=(("math", 6), ("chat", 4)), max_new_tokens=12, batch_size=4, shard_size=4)


def test_regenerated_answers_are_the_targets_greedy_answers(tiny_target):
    ds = regenerate(tiny_target, CFG, progress=False)
    assert len(ds) >= 10  # multi-turn chat examples add one sequence per turn
    row = ds[0]
    prompt = row["input_ids"][: row["prompt_len"]]
    assert row["loss_mask"] == [0] * row["prompt_len"] + [1] * (len(row["input_ids"]) - row["prompt_len"])
    ref = tiny_target.model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                     eos_token_id=tiny_target.eos_token_ids, pad_token_id=0)[0, len(prompt):].tolist()
    eos = tiny_target.eos_token_ids[0]
    ref = ref[: ref.index(eos) + 1] if eos in ref else ref
    assert row["input_ids"][row["prompt_len"]:] == ref


def test_regeneration_is_deterministic_and_cached(tiny_target):
    a = regenerate(tiny_target, CFG, progress=False)
    path = regen_dir(tiny_target, CFG)
    assert cache.is_complete(path)
    cache.clear(path)
    b = regenerate(tiny_target, CFG, progress=False)
    assert a["input_ids"] == b["input_ids"] and a["uid"] == b["uid"]


def test_interrupted_regeneration_resumes(tiny_target, monkeypatch):
    import lit_domino.data.regenerate as regen

    cfg = RegenConfig(domains=(("math", 12),), max_new_tokens=8, batch_size=4, shard_size=4, seed=1)
    full = regenerate(tiny_target, cfg, progress=False)
    path = regen_dir(tiny_target, cfg)
    cache.clear(path)
    calls = {"n": 0}
    real = regen._regenerate_shard

    def counting(fail_at=None):
        def shard(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == fail_at:
                raise KeyboardInterrupt("killed")
            return real(*args, **kwargs)

        return shard

    monkeypatch.setattr(regen, "_regenerate_shard", counting(fail_at=2))
    with pytest.raises(KeyboardInterrupt):
        regenerate(tiny_target, cfg, progress=False)
    assert cache.is_complete(path / "shard_00000") and not cache.is_complete(path)
    calls["n"] = 0
    monkeypatch.setattr(regen, "_regenerate_shard", counting())
    resumed = regenerate(tiny_target, cfg, progress=False)
    assert calls["n"] == 2  # only the two missing shards were generated again
    assert resumed["input_ids"] == full["input_ids"]


def test_all_prompts_too_long_is_an_error(tiny_target):
    with pytest.raises(ValueError, match="no prompts to regenerate"):
        regenerate(tiny_target, RegenConfig(domains=(("math", 3),), max_prompt_tokens=2), progress=False)


def test_bad_regen_config():
    with pytest.raises(ValueError, match="temperature"):
        RegenConfig(temperature=-1)


def test_encode_conversation_masks_assistant_tokens(corpus_tokenizer):
    msgs = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "2 + 2 = 4."}]
    ids, mask = encode_conversation(corpus_tokenizer, msgs)
    masked = corpus_tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert masked == "2 + 2 = 4.<|im_end|>"
