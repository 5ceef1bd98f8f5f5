"""The method registry, config validation/serialisation, save/load round trips, fingerprint checks, small LM."""

import json

import pytest
import torch

from lit_domino.models import (
    DominoConfig,
    DominoDrafter,
    DominoHeadConfig,
    DrafterConfig,
    DrafterLoadError,
    DrafterMismatchError,
    build_drafter,
    drafter_class,
    drafter_config,
    kinds,
    registry,
)
from lit_domino.interop import load_drafter
from lit_domino.testing import random_target


@pytest.fixture(scope="module")
def target():
    return random_target(vocab_size=256, hidden_size=64, num_layers=4, seed=0)


# ---------------------------------------------------------------- config


@pytest.mark.parametrize("kind,overrides,match", [
    ("domino", {"head": {"rank": 0}}, "rank"),
    ("backbone", {"block_size": 1}, "block_size"),
    ("backbone", {"num_layers": 0}, "num_layers"),
    ("domino", {"head": {"gru_hidden": 0}}, "gru_hidden"),
    ("eagle3", {"ttt_steps": 0}, "ttt_steps"),
    ("backbone", {"feature_layers": []}, "feature_layers"),
    ("backbone", {"num_kv_heads": 3}, "num_kv_heads"),
    ("backbone", {"mask_token_id": 999}, "mask_token_id"),
    ("backbone", {"rank": 8}, "unknown BackboneConfig fields"),  # a method's keys belong to that method only
    ("eagle3", {"head": {"rank": 8}}, "unknown Eagle3Config fields"),
])
def test_config_validation(target, kind, overrides, match):
    with pytest.raises(ValueError, match=match):
        drafter_config(kind, target, **overrides)


def test_registry_names_every_method_once():
    assert kinds() == ("backbone", "domino", "dspark", "dflash2", "eagle3", "small_lm")
    assert [drafter_class(k).kind for k in kinds()] == list(kinds())
    assert drafter_class("domino") is DominoDrafter and drafter_class("domino").config_class is DominoConfig
    with pytest.raises(ValueError, match="unknown drafter kind 'medusa'; choose one of backbone, domino"):
        drafter_class("medusa")
    with pytest.raises(ValueError, match="unknown drafter kind"):
        DrafterConfig.from_dict({"kind": "medusa"})
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("domino")(type("Other", (), {}))


def test_a_drafter_takes_exactly_its_own_config(target):
    """A DominoConfig (a BackboneConfig subclass) must not build a bare backbone: it would save as 'domino'."""
    from lit_domino.models import ParallelDrafter

    with pytest.raises(ValueError, match="ParallelDrafter needs a BackboneConfig, got DominoConfig"):
        ParallelDrafter(drafter_config("domino", target))


def test_config_from_target_and_json_round_trip(target):
    cfg = drafter_config("domino", target, head={"rank": 8})
    hf = target.config
    assert (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (64, 4, 2, 16)
    assert cfg.intermediate_size == hf.intermediate_size and cfg.rope_theta == 10000.0
    assert cfg.vocab_size == 256 and cfg.mask_token_id == 255
    assert (cfg.head.rank, cfg.head.gru_hidden) == (8, 1024)  # a nested section merges over its defaults
    assert cfg.target_fingerprint == target.fingerprint() and cfg.feature_layers == [2]
    as_dict = json.loads(json.dumps(cfg.to_dict()))
    assert as_dict["kind"] == "domino" and as_dict["head"] == {"rank": 8, "gru_hidden": 1024}
    assert "ttt_steps" not in as_dict and "rank" not in as_dict  # no other method's keys
    assert DrafterConfig.from_dict(as_dict) == cfg
    assert drafter_config("eagle3", target).feature_layers == [1, 2, 3]  # distinct on 4 layers (eagle3_layer_ids)
    assert drafter_config("small_lm", target).feature_layers == [] and not drafter_config("small_lm", target).reads_features
    with pytest.raises(ValueError, match="unknown DominoConfig fields"):
        DrafterConfig.from_dict({**cfg.to_dict(), "bogus": 1})
    with pytest.raises(ValueError, match="exactly 3"):
        drafter_config("eagle3", target, feature_layers=[0, 1])


def test_flat_configs_of_older_versions_still_load(target):
    """lit_domino <= 0.1 wrote one flat config with every kind's keys: they go to their method or are dropped."""
    flat = {k: v for k, v in drafter_config("backbone", target).to_dict().items()}
    old = {**flat, "rank": 16, "gru_hidden": 32, "ttt_steps": 7}
    dom = DrafterConfig.from_dict({**old, "kind": "domino"})
    assert isinstance(dom, DominoConfig) and (dom.head.rank, dom.head.gru_hidden) == (16, 32)
    assert DrafterConfig.from_dict({**old, "kind": "backbone"}) == drafter_config("backbone", target)
    eagle = DrafterConfig.from_dict({**old, "kind": "eagle3", "feature_layers": [1, 1, 0]})
    assert eagle.ttt_steps == 7


@pytest.mark.parametrize("kind", kinds())
def test_every_config_field_is_documented(kind):
    import dataclasses
    import inspect

    for cls in inspect.getmro(drafter_class(kind).config_class):
        if not dataclasses.is_dataclass(cls):
            continue
        src = inspect.getsource(cls)
        for f in dataclasses.fields(cls):
            if f.name in cls.__dict__.get("__annotations__", {}):
                assert src.split(f"    {f.name}:")[1].split("\n")[1].strip().startswith('"""'), (cls, f.name)
    head = inspect.getsource(DominoHeadConfig)
    for f in dataclasses.fields(DominoHeadConfig):
        assert head.split(f"    {f.name}:")[1].split("\n")[1].strip().startswith('"""'), f.name


# ---------------------------------------------------------------- save / load


def _make(kind, target):
    torch.manual_seed(0)
    extra = {"domino": dict(head=dict(rank=8, gru_hidden=16)), "eagle3": dict(ttt_steps=2),
             "small_lm": dict(num_layers=1)}.get(kind, {})
    cfg = drafter_config(kind, target, block_size=4, **extra)
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
    import lit_domino

    assert lit_domino.load_drafter is load_drafter


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
    mask = torch.zeros(1, 20, dtype=torch.long)
    mask[0, 5:] = 1  # labels only where the next token is a response token
    out = d.forward_train(ids[None], mask)
    manual = torch.stack([torch.nn.functional.cross_entropy(out.logits[0, p - 1], ids[p]) for p in range(5, 20)])
    torch.testing.assert_close(d.train_loss(out), manual.mean())


def test_deepcopy_shares_target_and_pickle_drops_it(target):
    import copy
    import pickle

    d = _make("domino", target)
    c = copy.deepcopy(d)
    assert c.embed is target.embed and c.fc.weight is not d.fc.weight and torch.equal(c.fc.weight, d.fc.weight)
    p = pickle.loads(pickle.dumps(d))
    assert not p.is_bound and torch.equal(p.head.up.weight, d.head.up.weight)
