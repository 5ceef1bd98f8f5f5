"""Shipped regenerated sets: installed in place of regeneration for exactly their key, never for another target's
weights, refused with the rebuild command when a file is missing or altered; the embedded default's shipped sets
agree with what its shipped target regenerates."""

from __future__ import annotations

import json
import logging

import pytest

from lit_domino.data import shipped
from lit_domino.data.regenerate import RegenConfig, regen_dir, regen_key, regen_report, regenerate
from lit_domino.runtime import cache

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = RegenConfig(domains=(("math", 5), ("chat", 3)), max_new_tokens=10, batch_size=4, shard_size=4, seed=3)


@pytest.fixture(scope="module")
def shipped_root(tiny_target, tmp_path_factory):
    """The tiny target's set, regenerated in a cache of its own and shipped into a private assets folder."""
    gen_root = tmp_path_factory.mktemp("gen")
    ds = regenerate(tiny_target, CFG, root=gen_root, progress=False, use_shipped=False)
    root = tmp_path_factory.mktemp("assets")
    shipped.ship(ds, regen_key(tiny_target, CFG), regen_dir(tiny_target, CFG).name,
                 regen_report(tiny_target, CFG, gen_root), "unit", root=root)
    return root, ds


def _rows(ds) -> list[dict]:
    return [{c: ds[i][c] for c in shipped.COLUMNS} for i in range(len(ds))]


def test_a_shipped_set_is_installed_instead_of_regenerated(tiny_target, shipped_root, monkeypatch, tmp_path):
    import lit_domino.data.regenerate as regen

    root, original = shipped_root
    monkeypatch.setattr(shipped, "SHIPPED_REGEN_ROOT", root)
    monkeypatch.setattr(regen, "_regenerate_shard", lambda *a, **k: pytest.fail("a shipped set was regenerated"))
    ds = regenerate(tiny_target, CFG, root=tmp_path, progress=False)
    assert _rows(ds) == _rows(original)
    assert cache.is_complete(regen_dir(tiny_target, CFG, tmp_path))
    report = regen_report(tiny_target, CFG, tmp_path)
    assert report["source"].startswith("shipped: ") and report["sequences"] == len(original)


def test_shipping_is_deterministic(tiny_target, shipped_root, tmp_path):
    root, ds = shipped_root
    name = regen_dir(tiny_target, CFG).name
    entry = shipped.read_manifest(root)[name]
    shipped.ship(ds, entry["key"], name, entry["report"], "unit", root=tmp_path)
    assert (tmp_path / entry["file"]).read_bytes() == (root / entry["file"]).read_bytes()
    assert shipped.read_manifest(tmp_path) == shipped.read_manifest(root)


def test_a_set_shipped_for_another_targets_weights_is_never_read(tiny_target, shipped_root, caplog):
    root, _ = shipped_root
    key = regen_key(tiny_target, CFG)
    other = {**key, "target_name": "embedded:unit-000000000000+shipped-aaaaaaaaaaaa"}
    with caplog.at_level(logging.INFO, logger="lit_domino.data.shipped"):
        assert shipped.find(other, "train-ffffffffffff", root) is None
    assert f"(weights {key['target_name']})" in caplog.text and "(weights aaaaaaaaaaaa)" in caplog.text
    assert shipped.find(key, regen_dir(tiny_target, CFG).name, root) is not None


@pytest.mark.parametrize("damage", ["altered", "truncated", "missing"])
def test_a_damaged_shipped_file_is_one_line_naming_it_and_the_rebuild(tiny_target, shipped_root, tmp_path, damage):
    import shutil

    root, _ = shipped_root
    copy = tmp_path / "assets"
    shutil.copytree(root, copy)
    name = regen_dir(tiny_target, CFG).name
    f = copy / shipped.read_manifest(copy)[name]["file"]
    data = bytearray(f.read_bytes())
    if damage == "altered":  # same size, other bytes
        data[-16:] = bytes(b ^ 0xFF for b in data[-16:])
        f.write_bytes(bytes(data))
    elif damage == "truncated":
        f.write_bytes(bytes(data[:-10]))
    else:
        f.unlink()
    why = {"altered": "is corrupt", "truncated": "is truncated or altered", "missing": "is missing"}[damage]
    with pytest.raises(shipped.ShippedDataError) as err:
        shipped.find(regen_key(tiny_target, CFG), name, copy)
    message = str(err.value)
    assert "\n" not in message and str(f) in message and why in message
    assert "python experiments/regenerate.py --preset unit --ship" in message


# --------------------------------------------------------------------------- the embedded default's shipped sets


def test_every_shipped_set_is_whole():
    sets = shipped.read_manifest()
    for name, entry in sets.items():
        assert shipped.verified(shipped.SHIPPED_REGEN_ROOT / entry["file"], entry).is_file()
        assert name.startswith(entry["key"]["regen"]["split"] + "-")
        assert "+shipped-" in entry["key"]["target_name"], "a shipped set belongs to a shipped target"


SAMPLE_PER_DOMAIN = 4
AGREEMENT = 0.75
"""The shipped default's rows are its shipped target's greedy answers, regenerated in left-padded batches of 32 on
the CPU that shipped them. Here a sample is answered again one prompt at a time (no padding, other matmul shapes,
perhaps another CPU's kernels): float32 sums in another order move logits in their last bits, so where the target's
top two tokens nearly tie, the argmax can flip and the answer diverges from there. On the shipping box every sampled
answer was identical (docs/results.md); the bar leaves room for a few such near-ties on other machines (3 of 12)."""


def test_the_shipped_default_sets_are_what_the_shipped_target_answers():
    import torch

    from lit_domino.data.regenerate import RegenConfig
    from lit_domino.target.load import load_target

    target = load_target("embedded:default")
    sets = shipped.read_manifest()
    train = next(e for e in sets.values() if e["key"]["regen"]["split"] == "train")
    assert train["key"]["target_name"] == target.name, "the shipped sets belong to the shipped target"
    cfg = RegenConfig(**{k: tuple(map(tuple, v)) if k == "domains" else v for k, v in train["key"]["regen"].items()})
    rows = shipped.read_rows(shipped.verified(shipped.SHIPPED_REGEN_ROOT / train["file"], train))
    sample = [r for d in ("math", "code", "chat") for r in [r for r in rows if r["domain"] == d][:SAMPLE_PER_DOMAIN]]
    same = 0
    for r in sample:
        prompt = r["input_ids"][: r["prompt_len"]]
        out = target.model.generate(torch.tensor([prompt]), max_new_tokens=cfg.max_new_tokens, do_sample=False,
                                    eos_token_id=target.eos_token_ids, pad_token_id=target.eos_token_ids[0])
        answer, shipped_answer = out[0, len(prompt):].tolist(), r["input_ids"][r["prompt_len"]:]
        eos = [i for i, t in enumerate(answer) if t in target.eos_token_ids]
        answer = answer[: eos[0] + 1] if eos else answer
        same += answer == shipped_answer
    assert same / len(sample) >= AGREEMENT, f"{same} of {len(sample)} sampled answers equal the shipped ones"


def test_shipping_a_presets_split_again_replaces_what_it_shipped(tiny_target, shipped_root, tmp_path):
    """Re-shipping a preset's split (other prompts, or another target) leaves one set per preset and split."""
    from dataclasses import replace

    root, ds = shipped_root
    name = regen_dir(tiny_target, CFG).name
    entry = shipped.read_manifest(root)[name]
    shipped.ship(ds, entry["key"], name, entry["report"], "unit", root=tmp_path)
    other = replace(CFG, domains=(("math", 4),))
    shipped.ship(ds, regen_key(tiny_target, other), regen_dir(tiny_target, other).name, entry["report"], "unit",
                 root=tmp_path)
    shipped.ship(ds, regen_key(tiny_target, other), "train-0123456789ab", entry["report"], "another", root=tmp_path)
    sets = shipped.read_manifest(tmp_path)
    assert sorted(sets) == sorted([regen_dir(tiny_target, other).name, "train-0123456789ab"])
    assert sorted(p.name for p in tmp_path.glob("*.jsonl.gz")) == sorted(e["file"] for e in sets.values())
