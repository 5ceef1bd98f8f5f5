"""DrafterConfig validation/serialisation, save/load round trips, fingerprint checks, small LM."""

import json

import pytest
import torch

from lit_domino.models import (
    DrafterConfig,
    DrafterLoadError,
    DrafterMismatchError,
    SmallLMDrafter,
    build_drafter,
    load_drafter,
)
from lit_domino.testing import random_target


@pytest.fixture(scope="module")
def target():
    return random_target(vocab_size=256, hidden_size=64, num_layers=4, seed=0)


# ---------------------------------------------------------------- config


@pytest.mark.parametrize("field,value,match", [
    ("rank", 0, "rank"),
    ("block_size", 1, "block_size"),
    ("num_layers", 0, "num_layers"),
    ("gru_hidden", 0, "gru_hidden"),
    ("ttt_steps", 0, "ttt_steps"),
    ("feature_layers", [], "feature_layers"),
    ("kind", "medusa", "unknown drafter kind"),
    ("num_kv_heads", 3, "num_kv_heads"),
    ("mask_token_id", 999, "mask_token_id"),
])
def test_config_validation(field, value, match):
    with pytest.raises(ValueError, match=match):
        DrafterConfig(**{field: value}).validate()


def test_config_from_target_and_json_round_trip(target):
    cfg = DrafterConfig.from_target(target, "domino", rank=8)
    hf = target.config
    assert (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (64, 4, 2, 16)
    assert cfg.intermediate_size == hf.intermediate_size and cfg.rope_theta == 10000.0
    assert cfg.vocab_size == 256 and cfg.mask_token_id == 255 and cfg.rank == 8
    assert cfg.target_fingerprint == target.fingerprint() and cfg.feature_layers == [2]
    assert DrafterConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert DrafterConfig.from_target(target, "eagle3").feature_layers == [1, 1, 0]
    with pytest.raises(ValueError, match="unknown DrafterConfig fields"):
        DrafterConfig.from_dict({**cfg.to_dict(), "bogus": 1})
    with pytest.raises(ValueError, match="exactly 3"):
        DrafterConfig.from_target(target, "eagle3", feature_layers=[0, 1])
    # every field is documented
    import inspect

    src = inspect.getsource(inspect.getmodule(DrafterConfig))
    for f in cfg.to_dict():
        assert f'{f}:' in src and src.split(f"    {f}:")[1].split("\n")[1].strip().startswith('"""'), f


# ---------------------------------------------------------------- save / load


def _make(kind, target):
    torch.manual_seed(0)
    if kind == "small_lm":
        return SmallLMDrafter.from_target(target, num_layers=1).eval()
    cfg = DrafterConfig.from_target(target, kind, block_size=4, rank=8, gru_hidden=16, ttt_steps=2)
    d = build_drafter(cfg, target).eval()
    if kind == "domino":
        torch.nn.init.normal_(d.head.up.weight)
    return d


def _logits(d, ids, feats):
    s = d.new_session()
    s.extend(ids[:10], None if d.kind == "small_lm" else feats[:10, : d.config.num_features * 64])
    return s.draft(ids[10], 3).logits


@pytest.mark.parametrize("kind", ["backbone", "domino", "eagle3", "small_lm"])
def test_save_load_round_trip(kind, target, tmp_path):
    d = _make(kind, target)
    ids, feats = torch.randint(0, 250, (12,)), torch.randn(12, 3 * 64)
    d.save_pretrained(tmp_path / "drafter")
    assert (tmp_path / "drafter" / "config.json").is_file()
    assert (tmp_path / "drafter" / "model.safetensors").is_file()
    if kind == "small_lm":
        assert (tmp_path / "drafter" / "lm" / "config.json").is_file()
    else:
        assert not any(k.startswith(("embed", "lm_head", "_bound")) for k in d.state_dict())
    loaded = load_drafter(tmp_path / "drafter", target=target)
    assert type(loaded) is type(d) and loaded.config == d.config
    assert torch.equal(_logits(loaded, ids, feats), _logits(d, ids, feats))
    unbound = load_drafter(tmp_path / "drafter")
    if kind != "small_lm":
        with pytest.raises(RuntimeError, match="bind_target"):
            _logits(unbound, ids, feats)


def test_fingerprint_mismatch_names_fields(target, tmp_path):
    _make("backbone", target).save_pretrained(tmp_path / "d")
    other = random_target(vocab_size=128, hidden_size=64, num_layers=4, seed=1)
    with pytest.raises(DrafterMismatchError) as err:
        load_drafter(tmp_path / "d", target=other)
    msg = str(err.value)
    assert "vocab_size" in msg and "256" in msg and "128" in msg and "mask_token_id" in msg
    assert "hidden_size" not in msg
    assert isinstance(err.value, ValueError)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    cfg["target_fingerprint"]["tokenizer_hash"] = "abc"
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DrafterMismatchError, match="tokenizer_hash: drafter was built for 'abc'"):
        load_drafter(tmp_path / "d", target=target)


def test_load_errors_name_the_path(target, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        load_drafter(tmp_path / "nope")
    d = tmp_path / "d"
    _make("backbone", target).save_pretrained(d)
    (d / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(DrafterLoadError, match="model.safetensors"):
        load_drafter(d)
    (d / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_drafter(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(FileNotFoundError):
        load_drafter(d)  # weights missing is reported first
    _make("backbone", target).save_pretrained(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(DrafterLoadError, match="config.json"):
        load_drafter(d)


def test_lazy_package_export():
    import lit_domino.models as m

    assert m.load_drafter is load_drafter


# ---------------------------------------------------------------- small LM


def test_small_lm_session_matches_full_forward(target):
    d = _make("small_lm", target)
    assert d.lm.get_input_embeddings().weight.shape[0] == target.vocab_size
    assert d.lm.get_input_embeddings() is not target.embed
    ids = torch.randint(0, 250, (20,))
    s = d.new_session()
    s.extend(ids[:8])
    s.extend(ids[8:12])
    first = s.draft(ids[12], 2)
    second = s.draft(first.tokens[-1], 2)
    chain = torch.cat([ids[:13], first.tokens, second.tokens[:1]])
    with torch.no_grad():
        full = d(chain[None])[0]  # [len, V]
    torch.testing.assert_close(torch.cat([first.logits, second.logits]), full[12:16], atol=1e-5, rtol=1e-5)
    s.crop(10)
    s.extend(ids[10:13])
    torch.testing.assert_close(s.draft(ids[13], 1).logits[0], d(ids[None, :14])[0, 13].detach(), atol=1e-5, rtol=1e-5)
    out = d.forward_train(ids[None], torch.ones(1, 20, dtype=torch.long))
    assert out.labels[0, :-1].tolist() == ids[1:].tolist() and out.labels[0, -1] == -100


def test_deepcopy_shares_target_and_pickle_drops_it(target):
    import copy
    import pickle

    d = _make("domino", target)
    c = copy.deepcopy(d)
    assert c.embed is target.embed and c.fc.weight is not d.fc.weight and torch.equal(c.fc.weight, d.fc.weight)
    p = pickle.loads(pickle.dumps(d))
    assert not p.is_bound and torch.equal(p.head.up.weight, d.head.up.weight)
