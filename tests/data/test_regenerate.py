import pytest
import torch

from lit_domino.runtime import cache
from lit_domino.data.regenerate import RegenConfig, answer_ids, encode_conversation, parse_shard, regen_dir, regenerate
from lit_domino.runtime.serving import Completion, ServerClient, normalize_url

pytestmark = pytest.mark.usefixtures("one_thread")  # ~5x faster on 2 busy cores

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


# --------------------------------------------------------------------------- corrupt caches, locks, randomness

SMALL = RegenConfig(domains=(("math", 4),), max_new_tokens=6, batch_size=4, shard_size=2, seed=3)


def _counting_shards(monkeypatch, delay: float = 0.0):
    import time

    import lit_domino.data.regenerate as regen

    real, calls = regen._regenerate_shard, []

    def shard(*args, **kwargs):
        calls.append(args[3])  # the shard index
        time.sleep(delay)
        return real(*args, **kwargs)

    monkeypatch.setattr(regen, "_regenerate_shard", shard)
    return calls


def test_deleted_dataset_file_is_rebuilt_from_intact_shards(tiny_target, monkeypatch, caplog):
    cfg = SMALL
    full = regenerate(tiny_target, cfg, progress=False)
    path = regen_dir(tiny_target, cfg)
    for f in (path / "dataset").glob("*.arrow"):
        f.unlink()
    calls = _counting_shards(monkeypatch)
    with caplog.at_level("WARNING"):
        again = regenerate(tiny_target, cfg, progress=False)
    assert str(path) in caplog.text and "missing" in caplog.text
    assert calls == [] and again["input_ids"] == full["input_ids"] and cache.is_complete(path)


def test_truncated_shard_is_regenerated(tiny_target, monkeypatch, caplog):
    from dataclasses import replace

    cfg = replace(SMALL, seed=4)
    full = regenerate(tiny_target, cfg, progress=False)
    path = regen_dir(tiny_target, cfg)
    arrow = next((path / "shard_00001").glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[:100])
    calls = _counting_shards(monkeypatch)
    with caplog.at_level("WARNING"):
        again = regenerate(tiny_target, cfg, progress=False)
    assert calls == [1]  # only the damaged shard
    assert "shard_00001" in caplog.text
    assert again["input_ids"] == full["input_ids"] and cache.is_complete(path)


def test_old_marker_over_a_deleted_file_is_rebuilt_not_a_raw_error(tiny_target, caplog):
    from dataclasses import replace

    cfg = replace(SMALL, seed=5)
    full = regenerate(tiny_target, cfg, progress=False)
    path = regen_dir(tiny_target, cfg)
    for marker in path.rglob(".complete"):
        marker.write_text("ok\n")  # markers written before they listed files
    for f in (path / "dataset").glob("*.arrow"):
        f.unlink()
    with caplog.at_level("WARNING"):
        again = regenerate(tiny_target, cfg, progress=False)  # not datasets' FileNotFoundError
    assert str(path) in caplog.text
    assert again["input_ids"] == full["input_ids"] and cache.is_complete(path)


def test_concurrent_regenerations_generate_once(tiny_target, monkeypatch):
    import threading
    from dataclasses import replace

    cfg = replace(SMALL, seed=6)
    calls = _counting_shards(monkeypatch, delay=0.3)
    out = []
    threads = [threading.Thread(target=lambda: out.append(regenerate(tiny_target, cfg, progress=False)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(out) == 2 and sorted(calls) == [0, 1]  # each shard once: the second caller waited and reused
    assert out[0]["input_ids"] == out[1]["input_ids"]


def test_sampled_regeneration_leaves_the_global_rng_alone(tiny_target):
    from dataclasses import replace

    cfg = replace(SMALL, seed=7, temperature=0.8)
    torch.manual_seed(11)
    before = torch.get_rng_state()
    a = regenerate(tiny_target, cfg, progress=False)
    assert torch.equal(torch.get_rng_state(), before)  # a cold cache leaves it as a warm one does
    cache.clear(regen_dir(tiny_target, cfg))
    torch.manual_seed(99)  # whatever the caller's state, the sampled answers are the seed's
    assert regenerate(tiny_target, cfg, progress=False)["input_ids"] == a["input_ids"]


# --------------------------------------------------------------------------- server answers, shards (no server)


def test_answer_ids_rebuilds_eos_and_flags_inconsistent_counts(corpus_tokenizer):
    """A server's text answer back to token ids (the real-server equality test is tests/runtime/test_serving.py)."""
    tok, eos = corpus_tokenizer, corpus_tokenizer.eos_token_id
    ids = tok("x = 12 + 3", add_special_tokens=False)["input_ids"]
    text = tok.decode(ids)
    assert answer_ids(tok, Completion(text, "stop", None, len(ids) + 1), [eos], 16) == (ids + [eos], True)
    assert answer_ids(tok, Completion(text, "length", None, len(ids)), [eos], len(ids)) == (ids, True)
    # EOS as the budget's last token: transformers serve says "length"
    assert answer_ids(tok, Completion(text, "length", None, len(ids) + 1), [eos], len(ids) + 1) == (ids + [eos], True)
    # the server generated a non-canonical split of the same text: counts disagree
    assert answer_ids(tok, Completion(text, "length", None, len(ids) + 2), [eos], 32) == (ids, False)
    # token ids from the server (vLLM return_token_ids) win, cut after EOS
    assert answer_ids(tok, Completion("?", "stop", None, 3, token_ids=[7, eos, 9]), [eos], 8) == ([7, eos], True)


def test_shard_specs_and_urls():
    assert parse_shard("1/4") == (1, 4) and parse_shard(None) is None
    for bad in ("4/4", "1", "a/b", "-1/2"):
        with pytest.raises(ValueError, match="shard"):
            parse_shard(bad)
    assert normalize_url("http://h:8000/") == "http://h:8000/v1" == normalize_url("http://h:8000/v1")
    with pytest.raises(ValueError, match="http://"):
        ServerClient("localhost:8000")
