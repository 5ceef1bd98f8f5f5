"""Foreign configs this suite cannot run exactly are refused naming the field; hub ids offline name the local
alternative; the export CLI writes a loadable directory."""

from __future__ import annotations

import json

import pytest

from lit_domino.interop import ForeignConfigError, detect_format, export_drafter
from lit_domino.interop import load_drafter


@pytest.mark.parametrize("key,value,field", [
    ("layer_types", ["sliding_attention"], "layer_types"),
    ("use_sliding_window", True, "use_sliding_window"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}, "rope_parameters.rope_type"),
    ("attention_bias", True, "attention_bias"),
    ("final_logit_softcapping", 30.0, "final_logit_softcapping"),
    ("model_type", "llama", "model_type"),
    ("architectures", ["DFlash2DraftModel"], "architectures"),
])
def test_foreign_qwen3_fields_are_refused_naming_the_field(tmp_path, backbone, key, value, field):
    out = export_drafter(backbone, tmp_path / "bb", format="dflash")
    cfg = json.loads((out / "config.json").read_text())
    cfg[key] = value
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ForeignConfigError, match=f"{field}="):
        load_drafter(out)


def test_unknown_config_is_neither_ours_nor_a_field_format(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ForeignConfigError, match="neither a lit_domino drafter config"):
        detect_format(tmp_path)


def test_hub_id_offline_names_the_local_alternative(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"z-lab/Qwen3-8B-DFlash-b16.*HF_HUB_OFFLINE is set.*--local-dir DIR"):
        load_drafter("z-lab/Qwen3-8B-DFlash-b16")


def test_export_cli(tmp_path, domino):
    from lit_domino.interop.export import main

    domino.save_pretrained(tmp_path / "run" / "drafter")
    out = main([str(tmp_path / "run"), str(tmp_path / "out"), "--format", "specforge-domino"])
    assert detect_format(out) == "specforge-domino"
    assert load_drafter(out).config.head == domino.config.head
