"""The shipped embedded target: written with a checksum per file, verified on load, refused when altered,
ignored when the preset's recipe changed, and the default's copy competent and identical to its fp32 build."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
import torch

from lit_domino.target import embedded as et
from lit_domino.target import recipe as tt

CFG = tt.TinyTargetConfig(
    name="unit", vocab_size=300, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16,
    intermediate_size=64, max_positions=128, examples_per_domain=(("math", 4), ("code", 2), ("chat", 2)),
    seq_len=96, batch_size=4, max_steps=6, eval_examples=2,
)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory, one_thread):
    """A 6-step build of a tiny recipe, shipped into a private assets folder."""
    root = tmp_path_factory.mktemp("cache")
    built = tt.build_tiny_target(CFG, root=root, progress=False)
    dest_root = tmp_path_factory.mktemp("assets")
    return tt.ship_target(CFG, built, dest_root, per_domain=1, max_new_tokens=6), built


def test_ship_writes_weights_tokenizer_reference_and_a_card_with_every_files_hash(shipped):
    folder, built = shipped
    card = json.loads((folder / et.CARD_NAME).read_text())
    assert card["recipe"] == json.loads(json.dumps(tt.cache.to_jsonable(CFG)))
    assert card["report"] == json.loads((built / "report.json").read_text())
    assert {"model.safetensors", "config.json", "tokenizer.json", tt.GREEDY_REFERENCE} <= set(card["files"])
    assert card["stored_dtype"] in ("float16", "bfloat16", "float32")
    assert "python experiments/build_target.py --preset unit --ship" in (folder / "TARGET_CARD.md").read_text()
    assert et.shipped_target(CFG, root=folder.parent) == folder


def test_the_shipped_copy_loaded_in_fp32_gives_the_fp32_builds_greedy_answers(shipped):
    from lit_domino.target.load import load_target

    folder, _ = shipped
    ref = json.loads((folder / tt.GREEDY_REFERENCE).read_text())
    target = load_target(folder)
    assert next(target.model.parameters()).dtype == torch.float32
    answers = tt.greedy_answers(target.model, target.tokenizer, ref["prompts"], ref["max_new_tokens"])
    assert answers == ref["answers"]


def test_an_altered_or_missing_file_is_refused_naming_it_and_the_rebuild(shipped, tmp_path):
    import shutil

    folder, _ = shipped
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = bytes(64)  # same size, other bytes
    weights.write_bytes(bytes(data))
    with pytest.raises(et.ShippedTargetError, match=r"model\.safetensors is corrupt.*build_target\.py --preset unit"):
        et.shipped_target(CFG, root=tmp_path)
    shutil.copy(folder / "model.safetensors", weights)
    assert et.shipped_target(CFG, root=tmp_path) == copy
    (copy / "tokenizer.json").unlink()
    with pytest.raises(et.ShippedTargetError, match=r"tokenizer\.json is missing"):
        et.shipped_target(CFG, root=tmp_path)


def test_a_changed_recipe_does_not_take_the_stale_shipped_copy(shipped):
    folder, _ = shipped
    assert et.shipped_target(replace(CFG, max_steps=7), root=folder.parent) is None


def test_the_smoke_recipe_still_makes_the_shipped_smoke_targets_tokenizer_and_prompts(tmp_path, one_thread):
    """CI trains no smoke target (it ships built; the recipe's training stage is tested at unit size in
    test_recipe.py). What the recipe makes before training, the corpora and the BPE tokenizer trained on them, is
    rebuilt here and must be the shipped copy's: the same vocabulary, and the same held-out prompts as token ids
    (corpus, chat template and tokenizer together). A change to the recipe's code that would make another smoke
    target fails here instead of leaving the shipped one stale."""
    from transformers import AutoTokenizer

    cfg = et.preset_config("smoke")
    rebuilt = tt.build_tokenizer(cfg, root=tmp_path)
    shipped = AutoTokenizer.from_pretrained(et.SHIPPED_ROOT / "smoke")
    rebuild = "rebuild it: python experiments/build_target.py --preset smoke --ship"
    assert rebuilt.get_vocab() == shipped.get_vocab(), f"the recipe now trains another tokenizer; {rebuild}"
    ref = json.loads((et.SHIPPED_ROOT / "smoke" / tt.GREEDY_REFERENCE).read_text())
    assert tt.held_out_prompts(cfg, rebuilt, ref["per_domain"]) == ref["prompts"], f"other prompts; {rebuild}"


def test_specs_name_the_shipped_copy_or_the_recipe():
    cfg, from_recipe = et.parse_spec("large@recipe")
    assert cfg is et.preset_config("large") and from_recipe
    assert et.identity("smoke@recipe") == et.recipe_tag(et.preset_config("smoke"))  # never the shipped copy
    assert et.identity("smoke").startswith(et.recipe_tag(et.preset_config("smoke")) + "+shipped-")
    with pytest.raises(et.UsageError, match="unknown embedded target preset 'nosuch'"):
        et.parse_spec("nosuch")


# --------------------------------------------------------------------------- the shipped copy of `large`


@pytest.mark.parametrize("name, accuracy", [("large", 0.75), ("default", 0.10), ("smoke", 0.03)])
def test_the_shipped_targets_load_without_training_and_answer_as_their_fp32_build(monkeypatch, name, accuracy):
    """``embedded:large`` (77 % greedy math accuracy), ``embedded:default`` (the default preset's target, 12.5 %:
    chosen for its drafters' acceptance, its card says why) and ``embedded:smoke`` (CI's, 3 %) load in seconds,
    never from their recipe."""
    from lit_domino.target import load as target_mod

    monkeypatch.setattr(tt, "build_tiny_target", lambda *a, **k: pytest.fail("the shipped target was rebuilt"))
    target_mod.load_target.cache_clear() if hasattr(target_mod.load_target, "cache_clear") else None
    t0 = time.perf_counter()
    target = target_mod.load_target(f"embedded:{name}")
    assert time.perf_counter() - t0 < 10
    card = json.loads((et.SHIPPED_ROOT / name / et.CARD_NAME).read_text())
    assert card["recipe"] == json.loads(json.dumps(tt.cache.to_jsonable(et.preset_config(name))))
    assert card["report"]["math_accuracy"] >= accuracy
    assert "+shipped-" in target.name
    ref = json.loads((et.SHIPPED_ROOT / name / tt.GREEDY_REFERENCE).read_text())
    per, n = ref["per_domain"], 3  # the first 3 held-out prompts of each domain (all of them: the slow test)
    picks = [i for d in range(len(ref["prompts"]) // per) for i in range(d * per, d * per + n)]
    answers = tt.greedy_answers(target.model, target.tokenizer, [ref["prompts"][i] for i in picks],
                                ref["max_new_tokens"])
    assert answers == [ref["answers"][i] for i in picks]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["large", "default"])
def test_every_held_out_greedy_answer_of_a_shipped_target_equals_its_fp32_build(name):
    from lit_domino.target.load import load_target

    target = load_target(f"embedded:{name}")
    ref = json.loads((et.SHIPPED_ROOT / name / tt.GREEDY_REFERENCE).read_text())
    assert tt.greedy_answers(target.model, target.tokenizer, ref["prompts"], ref["max_new_tokens"]) == ref["answers"]
