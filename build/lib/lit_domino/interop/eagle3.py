"""The ``eagle3`` format: the EAGLE-3 layout of vLLM's ``speculators`` library (``Eagle3DraftModel``),
the one vLLM serves with ``{"method": "eagle3"}``.

``config.json``: ``speculators_model_type: eagle3``, ``architectures: [Eagle3DraftModel]``,
``transformer_layer_config`` (a Qwen3 config of the one draft layer), ``draft_vocab_size`` = the
target's vocabulary (no reduced draft vocabulary, hence no ``d2t``/``t2d``),
``eagle_aux_hidden_state_layer_ids`` (the three feature layers, in speculators'/vLLM's numbering: an index
into ``hidden_states``, 0 = the embedding output, so our decoder-layer id j is their j + 1; their default
``[2, L//2, L-3]`` is EAGLE-3's ``[1, L//2-1, L-4]`` here), the norm flags all false, and
``speculators_config`` {``algorithm: eagle3``, a greedy proposal of ``block_size - 1`` tokens,
``verifier`` {``name_or_path``: the target, ``architectures``}}.
``model.safetensors``: ``fc``, ``layers.0.{input_layernorm, hidden_norm, self_attn.*, post_attention_layernorm,
mlp.*}``, ``norm``, plus the target's ``embed_tokens`` and ``lm_head`` (speculators loads the draft's own
LM head from the checkpoint; ours is the target's, so it is stored to keep the layout self-contained).

Why the logits are equal: speculators' first layer splits ``cat(embed(x_t), g)``, norms each half
(``input_layernorm``, ``hidden_norm``), keeps the un-normed g as the residual and runs a Qwen3
attention (q/k norm) on the 2d input and a SwiGLU MLP; logits are ``lm_head(norm(h))``: our
``Eagle3Drafter.step`` + ``compute_logits``. Configs with ``norm_before_residual``, ``norm_before_fc``,
``fc_norm``, ``norm_output``, more than one layer or a reduced draft vocabulary are refused.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lit_domino.interop import FORMAT_KINDS
from lit_domino.interop.common import (ExportError, ForeignConfigError, apply_sidecar_fields, build_config,
                                       config_section, config_value, foreign_fingerprint, load_into, load_weights,
                                       qwen3_config, qwen3_fields, read_config_json, refuse, save_weights,
                                       target_record, write_sidecar)
from lit_domino.models.base import CONFIG_NAME, DrafterMismatchError
from lit_domino.models.eagle import Eagle3Config
from lit_domino.models.io import build_drafter

NAME = "eagle3"
KINDS = FORMAT_KINDS[NAME]
LAYER = "layers.0."
OWN_TOP = ("fc.weight", "norm.weight")
"""Our parameters that keep their name; every other one lives under ``layers.0.``."""
TARGET_TENSORS = ("embed_tokens.weight", "lm_head.weight")
"""The target's tensors the layout carries (checked against the target on binding, never loaded as ours)."""
AUX_OFFSET = 1
"""speculators' aux layer id = our decoder-layer id + 1 (theirs index ``hidden_states``, 0 = embedding output)."""
FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def detect(cfg: dict) -> bool:
    return cfg.get("speculators_model_type") == "eagle3"


def export(drafter, directory: Path, target=None) -> Path:
    import json

    if drafter.kind not in KINDS:
        raise ExportError(f"format {NAME!r} holds an EAGLE-3 drafter, not a {drafter.kind!r} one")
    rec = target_record(drafter, target)
    c = drafter.config
    target = target if target is not None else (drafter.target if drafter.is_bound else None)
    if target is None:
        raise ExportError("the eagle3 layout stores the target's embedding and LM head: bind the drafter to its "
                          "target (or pass target=) before exporting")
    layer = qwen3_config(c, 1)
    layer.architectures = ["Qwen3ForCausalLM"]
    arch = list(getattr(target.model.config, "architectures", None) or [type(target.model).__name__])
    cfg = {"architectures": ["Eagle3DraftModel"], "speculators_model_type": NAME, "draft_vocab_size": c.vocab_size,
           "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": [int(j) + AUX_OFFSET for j in c.feature_layers],
           "embed_requires_grad": False, **{flag: False for flag in FLAGS}, "tie_word_embeddings": False,
           "dtype": str(drafter.dtype).removeprefix("torch."),
           "transformer_layer_config": layer.to_dict(),
           "speculators_config": {
               "algorithm": NAME, "default_proposal_method": "greedy",
               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(c.block_size) - 1,
                                     "accept_tolerance": 0.0, "verifier_accept_k": 1}],
               "verifier": {"name_or_path": rec["name"], "architectures": arch}}}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_NAME).write_text(json.dumps(cfg, indent=2, sort_keys=True))
    tensors = {(k if k in OWN_TOP else LAYER + k): v for k, v in drafter.state_dict().items()}
    tensors["embed_tokens.weight"] = target.embed.weight.to(drafter.dtype)
    tensors["lm_head.weight"] = target.lm_head.weight.to(drafter.dtype)
    save_weights(tensors, directory, NAME)
    write_sidecar(directory, NAME, drafter, rec, {"ttt_steps": int(c.ttt_steps)})
    return directory


def import_eagle3(directory: Path, cfg: dict, map_location="cpu"):
    for flag in FLAGS:
        if cfg.get(flag):
            refuse(flag, cfg[flag], "the EAGLE-3 layer here norms the embedding and the feature only")
    if cfg.get("transformer_layer_config") is None:
        raise ForeignConfigError("cannot import: transformer_layer_config is missing from the config (the Qwen3 "
                                 "config of the draft layer)")
    layer = config_section(cfg, "transformer_layer_config")
    fields = qwen3_fields(layer, "transformer_layer_config.")
    if fields["num_layers"] != 1:
        refuse("transformer_layer_config.num_hidden_layers", fields["num_layers"], "the EAGLE-3 drafter here has "
               "exactly one decoder layer")
    if config_value(cfg, "draft_vocab_size", int, default=fields["vocab_size"]) != fields["vocab_size"]:
        refuse("draft_vocab_size", cfg["draft_vocab_size"], "drafts here use the target's full vocabulary and LM "
               "head (no d2t/t2d mapping)")
    if cfg.get("target_hidden_size") not in (None, fields["hidden_size"]):
        refuse("target_hidden_size", cfg["target_hidden_size"], "the draft width equals the target's here")
    layers = config_value(cfg, "eagle_aux_hidden_state_layer_ids", list,
                          why="the three feature layers must be stated")
    if min(layers) < AUX_OFFSET:
        refuse("eagle_aux_hidden_state_layer_ids", layers, "id 0 is the embedding output; features here are "
               "decoder-layer outputs (speculators' id j = our layer j - 1)")
    spec = config_section(cfg, "speculators_config")
    methods = spec.get("proposal_methods") or [{}]
    if not isinstance(methods, list) or not isinstance(methods[0], dict):
        raise ForeignConfigError(f"cannot import: speculators_config.proposal_methods={methods!r} must be a list of "
                                 "JSON objects")
    k = config_value(methods[0], "speculative_tokens", int, "speculators_config.proposal_methods[0].", 7)
    fields["target_fingerprint"] = foreign_fingerprint(directory, fields["hidden_size"], fields["vocab_size"],
                                                       None, None)
    mask = fields["target_fingerprint"].get("mask_token_id")  # the sidecar's, when exported here
    fields.update(block_size=k + 1, feature_layers=[j - AUX_OFFSET for j in layers], ttt_steps=k,
                  mask_token_id=int(mask) if mask is not None else fields["vocab_size"] - 1)
    config = apply_sidecar_fields(build_config(Eagle3Config, fields), directory)
    tensors = load_weights(directory)
    carried = {k: tensors.pop(k) for k in TARGET_TENSORS if k in tensors}
    ours = {}
    for key, value in tensors.items():
        if key in ("d2t", "t2d", "verifier_lm_head.weight", "verifier_norm.weight"):
            continue
        ours[key if key in OWN_TOP else key.removeprefix(LAYER)] = value
    drafter = build_drafter(config)
    load_into(drafter, ours, directory, map_location)
    drafter._carried_target_tensors = carried  # checked when bound (see check_carried)
    return drafter


def check_carried(drafter, target) -> None:
    """The layout's own embedding / LM head must be the target's: ours drafts with the target's."""
    carried = getattr(drafter, "_carried_target_tensors", None) or {}
    own = {"embed_tokens.weight": target.embed.weight, "lm_head.weight": target.lm_head.weight}
    for key, value in carried.items():
        ref = own[key]
        if value.shape != ref.shape or not torch.allclose(value.to(ref.device, ref.dtype), ref, rtol=1e-3, atol=1e-5):
            raise DrafterMismatchError(f"the EAGLE-3 checkpoint's {key} differs from target "
                                       f"{getattr(target, 'name', '?')!r}'s: the drafter here drafts with the "
                                       "target's embedding and LM head, so it cannot reproduce this checkpoint")


__all__ = ["export", "import_eagle3", "detect", "check_carried", "read_config_json"]
