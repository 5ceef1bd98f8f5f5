"""A partial or mistyped foreign config is refused naming the field (a ForeignConfigError / DrafterLoadError), never
a raw TypeError from ``int(None)`` deep in the import (issue 34, item 8)."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from lit_domino.interop import ForeignConfigError, SIDECAR_NAME, export_drafter
from lit_domino.interop import load_drafter
from lit_domino.models.base import DrafterLoadError

FORMATS = {"dflash": "backbone", "specforge-domino": "domino", "eagle3": "eagle"}


def key_paths(cfg: dict, prefix: tuple = ()):
    """Every key of a nested config, as a path."""
    for key, value in cfg.items():
        yield prefix + (key,)
        if isinstance(value, dict):
            yield from key_paths(value, prefix + (key,))


def edited(cfg: dict, path: tuple, value=None, delete: bool = False) -> dict:
    out = copy.deepcopy(cfg)
    node = out
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


def try_load(src, tmp_path, cfg: dict, sidecar: bool):
    """Load a copy of ``src`` with ``cfg`` as its config.json: None when it loads, else the error."""
    out = tmp_path / "edited"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src, out)
    (out / "config.json").write_text(json.dumps(cfg))
    if not sidecar:  # a foreign directory, not exported here
        (out / SIDECAR_NAME).unlink()
    try:
        load_drafter(out)
    except Exception as err:  # noqa: BLE001 (the test asserts what it is)
        return err
    return None


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_missing_config_key_loads_or_is_refused_naming_it(tmp_path, request, fmt):
    drafter = request.getfixturevalue(FORMATS[fmt])
    src = export_drafter(drafter, tmp_path / fmt, format=fmt)
    cfg = json.loads((src / "config.json").read_text())
    refused = []
    for path in key_paths(cfg):
        for sidecar in (True, False):
            err = try_load(src, tmp_path, edited(cfg, path, delete=True), sidecar)
            if err is None:
                continue
            assert isinstance(err, DrafterLoadError), (path, sidecar, repr(err))
            # named, or an optional key whose default does not fit the weights (the mismatch names the tensors)
            assert path[-1] in str(err) or "shape mismatches ['" in str(err), (path, str(err))
            refused.append(".".join(path))
    # the fields a Qwen3-style config must state are among them (they used to raise a TypeError naming nothing)
    layer = "transformer_layer_config." if fmt == "eagle3" else ""
    for key in ("hidden_size", "vocab_size", "num_attention_heads", "intermediate_size", "num_hidden_layers",
                "max_position_embeddings"):
        assert layer + key in refused


@pytest.mark.parametrize("fmt,path,value,field", [
    ("dflash", ("hidden_size",), "wide", "hidden_size='wide'"),
    ("dflash", ("num_attention_heads",), 2.5, "num_attention_heads=2.5"),
    ("dflash", ("dflash_config", "target_layer_ids"), 3, "dflash_config.target_layer_ids=3"),
    ("dflash", ("dflash_config", "block_size"), "16", "dflash_config.block_size='16'"),
    ("dflash", ("dflash_config",), [1, 2], "dflash_config=[1, 2]"),
    ("dflash", ("num_hidden_layers",), 0, "num_layers"),  # present and typed but invalid: validate() names it
    ("specforge-domino", ("dflash_config", "emb_dim"), "eight", "dflash_config.emb_dim='eight'"),
    ("eagle3", ("transformer_layer_config", "vocab_size"), None, "transformer_layer_config.vocab_size"),
    ("eagle3", ("transformer_layer_config",), "qwen3", "transformer_layer_config='qwen3'"),
    ("eagle3", ("eagle_aux_hidden_state_layer_ids",), ["2", "3"], "eagle_aux_hidden_state_layer_ids="),
    ("eagle3", ("speculators_config", "proposal_methods"), {"speculative_tokens": 5}, "proposal_methods="),
])
def test_mistyped_config_fields_are_refused_naming_them(tmp_path, request, fmt, path, value, field):
    drafter = request.getfixturevalue(FORMATS[fmt])
    src = export_drafter(drafter, tmp_path / fmt, format=fmt)
    cfg = json.loads((src / "config.json").read_text())
    err = try_load(src, tmp_path, edited(cfg, path, value), sidecar=True)
    assert isinstance(err, ForeignConfigError), repr(err)
    assert field in str(err)


def test_a_sidecar_with_an_unknown_or_partial_record_is_refused_naming_it(tmp_path, eagle):
    src = export_drafter(eagle, tmp_path / "e3", format="eagle3")
    side = json.loads((src / SIDECAR_NAME).read_text())
    side["lit_domino_fields"] = {"ttt_stpes": 3}
    (src / SIDECAR_NAME).write_text(json.dumps(side))
    with pytest.raises(ForeignConfigError, match=rf"{SIDECAR_NAME}: lit_domino_fields: .*ttt_stpes"):
        load_drafter(src)
    side["lit_domino_fields"] = {}
    del side["target"]["fingerprint"]
    (src / SIDECAR_NAME).write_text(json.dumps(side))
    with pytest.raises(ForeignConfigError, match="target.fingerprint"):
        load_drafter(src)
