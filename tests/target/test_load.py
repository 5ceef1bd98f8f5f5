import pytest
import torch

from lit_domino.target.load import (TargetError, check_layer_ids, dflash_layer_ids, eagle3_layer_ids, load_target,
    resolve_mask_token)


def test_layer_rules_match_published_values():
    assert dflash_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B, docs/METHOD.md
    assert dflash_layer_ids(36, 1) == [18]
    assert eagle3_layer_ids(36) == [1, 17, 32]
    assert dflash_layer_ids(8, 3) == [1, 3, 5]
    assert eagle3_layer_ids(8) == [1, 3, 4]


def test_eagle3_layers_are_three_distinct_increasing_layers_at_every_depth():
    """Issue 34: the 6-layer smoke target got [1, 2, 2] (a layer twice), 4 layers [1, 1, 0]."""
    assert eagle3_layer_ids(6) == [1, 2, 3] and eagle3_layer_ids(4) == [1, 2, 3] and eagle3_layer_ids(3) == [0, 1, 2]
    for depth in range(3, 81):
        ids = eagle3_layer_ids(depth)
        assert len(ids) == 3 and ids == sorted(set(ids)) and 0 <= ids[0] and ids[-1] < depth, (depth, ids)
        if depth >= 7:  # the official [1, L//2-1, L-4] wherever it is distinct
            assert ids == [1, depth // 2 - 1, depth - 4]
    with pytest.raises(ValueError, match="EAGLE-3 reads 3 distinct .* 2 decoder layers has too few"):
        eagle3_layer_ids(2)


def test_a_target_too_shallow_for_eagle3_is_refused_naming_it():
    from lit_domino.models import drafter_config
    from lit_domino.testing import random_target

    shallow = random_target(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, seed=0)
    with pytest.raises(TargetError, match=r"target 'random-0': EAGLE-3 reads 3 distinct"):
        drafter_config("eagle3", shallow)


def test_layer_ids_out_of_range_error():
    with pytest.raises(ValueError, match="out of range"):
        check_layer_ids([1, 8], 8)
    with pytest.raises(ValueError, match="empty"):
        check_layer_ids([], 8)


def test_features_are_the_named_hidden_states(tiny_target):
    x = torch.randint(5, tiny_target.vocab_size, (2, 9))
    feats = tiny_target.forward_features(x, [0, 2])
    out = tiny_target.model(x, output_hidden_states=True)
    assert feats.shape == (2, 9, 2 * tiny_target.hidden_size)
    d = tiny_target.hidden_size
    assert torch.equal(feats[..., :d], out.hidden_states[1])  # output of decoder layer 0
    assert torch.equal(feats[..., d:], out.hidden_states[3])  # output of decoder layer 2
    with pytest.raises(ValueError, match="out of range"):
        tiny_target.forward_features(x, [4])


def test_save_load_equality(tiny_target, tmp_path):
    tiny_target.model.save_pretrained(tmp_path)
    tiny_target.tokenizer.save_pretrained(tmp_path)
    again = load_target(tmp_path)
    x = torch.randint(5, tiny_target.vocab_size, (1, 12))
    assert torch.equal(again.model(x).logits, tiny_target.model(x).logits)
    assert again.fingerprint() == tiny_target.fingerprint()
    assert not any(p.requires_grad for p in again.model.parameters())


def test_chat_ids_use_the_template(tiny_target):
    ids = tiny_target.chat_ids([{"role": "user", "content": "hello"}])
    assert tiny_target.tokenizer.decode(ids) == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


def test_missing_target_directory(tmp_path):
    with pytest.raises(TargetError, match="does not exist"):
        load_target(tmp_path / "nope")


def test_not_a_model_directory(tmp_path):
    with pytest.raises(TargetError, match="no config.json"):
        load_target(tmp_path)


def test_corrupt_target_directory(tiny_target, tmp_path):
    tiny_target.model.save_pretrained(tmp_path)
    tiny_target.tokenizer.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors at all")
    with pytest.raises(TargetError, match="corrupt|unreadable|could not load"):
        load_target(tmp_path)


def test_offline_hub_id_names_the_embedded_default():
    with pytest.raises(TargetError, match="embedded default"):
        load_target("Qwen/Qwen3-8B-definitely-not-cached")


def test_mask_without_embedding_row_errors(corpus_tokenizer):
    with pytest.raises(TargetError, match="no row"):
        resolve_mask_token(corpus_tokenizer, embedding_rows=corpus_tokenizer.mask_token_id)


def _word_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    )


def test_mask_added_when_missing_and_row_exists():
    tok = _word_tokenizer()
    mask_id = resolve_mask_token(tok, embedding_rows=8)  # padded embedding, like Qwen3's
    assert mask_id == 3 and tok.convert_ids_to_tokens(mask_id) == "<|MASK|>"


def test_mask_added_beyond_embedding_errors():
    with pytest.raises(TargetError, match="no row"):
        resolve_mask_token(_word_tokenizer(), embedding_rows=3)


def test_a_target_without_a_chat_template_names_itself():
    """A base model's tokenizer (no chat template) cannot render the suite's prompts: one clear error."""
    from lit_domino.testing import random_target

    target = random_target(vocab_size=8, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                           intermediate_size=32)
    target.tokenizer, target.name = _word_tokenizer(), "my-base-model"
    with pytest.raises(TargetError, match="target 'my-base-model' has no chat template"):
        target.chat_ids([{"role": "user", "content": "a b"}])


# --------------------------------------------------------------------------- offline hub ids, local errors


def test_offline_hub_id_fails_fast_with_the_embedded_hint(monkeypatch):
    import time

    import lit_domino.target.load as target_mod

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # no offline flag: the connectivity check decides
    monkeypatch.setattr(target_mod, "hub_reachable", lambda *a, **k: False)
    seen = {}
    from transformers import AutoTokenizer

    real = AutoTokenizer.from_pretrained

    def spy(source, *args, **kwargs):
        seen.update(kwargs)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", spy)
    t0 = time.time()
    with pytest.raises(TargetError) as info:
        load_target("Qwen/Qwen3-8B-definitely-not-cached")
    assert time.time() - t0 < 10
    assert seen.get("local_files_only") is True  # no download attempt, hence no retries
    msg = str(info.value)
    assert 'load_target("embedded:default")' in msg and "unreachable" in msg


def test_hub_id_with_offline_flag_names_the_embedded_target(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TargetError, match=r'HF_HUB_OFFLINE is set.*load_target\("embedded:default"\)'):
        load_target("Qwen/Qwen3-8B-definitely-not-cached")


def test_hub_reachable_is_bounded(monkeypatch):
    import time

    from lit_domino.target.load import hub_reachable

    for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)
    t0 = time.time()
    assert hub_reachable("http://127.0.0.1:9", timeout=1.0) is False  # refused at once
    assert hub_reachable("https://10.255.255.1:81", timeout=0.5) is False  # no TLS answer: the timeout decides
    assert hub_reachable("https://nonexistent.invalid", timeout=0.5) is False  # no such name
    assert time.time() - t0 < 5


def test_local_directory_without_weights_gets_no_offline_hint(tiny_target, tmp_path):
    tiny_target.model.config.save_pretrained(tmp_path)  # config.json, no weights
    tiny_target.tokenizer.save_pretrained(tmp_path)
    with pytest.raises(TargetError) as info:
        load_target(tmp_path)
    msg = str(info.value)
    assert str(tmp_path) in msg
    assert "Offline" not in msg and "embedded" not in msg and "hub" not in msg


def test_embedded_target_identity_does_not_depend_on_where_the_cache_lives(tmp_path, monkeypatch):
    """Regenerated data and features are keyed by the target's name: a moved cache must reuse them."""
    from lit_domino.target.load import target_identity

    monkeypatch.setenv("LIT_DOMINO_CACHE", str(tmp_path / "a"))
    here = target_identity("embedded:smoke")
    monkeypatch.setenv("LIT_DOMINO_CACHE", str(tmp_path / "elsewhere" / "b"))
    assert target_identity("embedded:smoke") == here
    assert here.startswith("embedded:") and str(tmp_path) not in here


def test_a_loaded_targets_name_is_its_identity(tiny_target_dir, monkeypatch):
    """The embedded target's name (in the data and feature cache keys) is its recipe, not its directory."""
    from lit_domino.target import recipe as tiny_target
    from lit_domino.target.load import load_target, target_identity

    assert load_target(tiny_target_dir).name == target_identity(tiny_target_dir)
    monkeypatch.setattr(tiny_target, "build_tiny_target", lambda preset: tiny_target_dir)  # no 1-minute build
    embedded = load_target("embedded:smoke@recipe")
    assert embedded.name == target_identity("embedded:smoke@recipe") and str(tiny_target_dir) not in embedded.name
