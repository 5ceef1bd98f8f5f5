"""The ``dflash2`` format: vLLM's ``speculators`` DFlash 2 layout (``DFlash2DraftModel``, ``speculators_model_type:
dflash2``), for the ``dflash2`` drafter.

``config.json``: ``transformer_layer_config`` (a Qwen3 config of the draft layers, every layer full attention),
``draft_vocab_size`` = the target's vocabulary (DFlash 2 requires it: the target's LM head, no d2t/t2d),
``block_size``, ``aux_hidden_state_layer_ids`` (the fused layers in speculators' numbering: our decoder-layer
id + 1), ``mask_token_id``, ``sample_from_anchor: false`` (the suite's label convention), ``conv_kernel_size``,
``conv_group_size``, ``selector_rank``, ``selector_top_k``, ``sliding_window_non_causal``, the windowed layers as
``transformer_layer_config.layer_types`` (``sliding_attention`` / ``full_attention``) with its ``sliding_window``
and ``use_sliding_window``, ``speculators_config``
(algorithm dflash2, a greedy proposal of ``block_size - 1`` tokens, the verifier). ``model.safetensors``: the
backbone and the convolutions under our names (``fc``, ``hidden_norm``, ``layers.*`` with
``attention_conv`` / ``mlp_conv``, ``norm``: speculators' names), the selector as ``candidate_selector.*``;
the target's embedding and LM head are not stored (speculators reloads them from the verifier).

The distribution layer (the last of our feature layers, what the KL distils) is the target's last layer, taken
from ``lit_domino_export.json`` or the verifier's local config, as for DSpark. Refused by name:
``sample_from_anchor: true``, a reduced draft vocabulary, ``selector_top_k`` above it, another target width, a
layer type other than full or sliding attention, and what ``qwen3_fields`` refuses.
"""

from __future__ import annotations

import json
from pathlib import Path

from lit_domino.interop import FORMAT_KINDS
from lit_domino.interop.common import (ExportError, build_config, foreign_fingerprint, load_into, load_weights,
                                       qwen3_config, qwen3_fields, refuse, save_weights, target_record,
                                       write_sidecar)
from lit_domino.interop.dspark import AUX_OFFSET, _target_layers, check_block_layout
from lit_domino.models.base import CONFIG_NAME
from lit_domino.models.dflash2 import DFlash2Config, DFlash2HeadConfig
from lit_domino.models.io import build_drafter

NAME = "dflash2"
KINDS = FORMAT_KINDS[NAME]
PREFIX = ("selector.", "candidate_selector.")
"""Our selector's tensors → speculators' names; every other name is the same in both."""
IGNORED = ("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight", "verifier_norm.weight", "d2t", "t2d")
"""Tensors of the layout that are the target's (never ours: the drafter here reads the bound target's)."""
HEAD_KEYS = {"selector_rank": "rank", "selector_top_k": "top_k", "conv_kernel_size": "conv_kernel_size",
             "conv_group_size": "conv_group_size"}
"""speculators' DFlash 2 field → our ``DFlash2HeadConfig`` field."""


def detect(cfg: dict) -> bool:
    return cfg.get("speculators_model_type") == NAME


def _theirs(name: str) -> str:
    ours, theirs = PREFIX
    return theirs + name[len(ours):] if name.startswith(ours) else name


def _ours(name: str) -> str:
    ours, theirs = PREFIX
    return ours + name[len(theirs):] if name.startswith(theirs) else name


def export(drafter, directory: Path, target=None) -> Path:
    if drafter.kind not in KINDS:
        raise ExportError(f"format {NAME!r} holds a DFlash 2 drafter, not a {drafter.kind!r} one")
    rec = target_record(drafter, target)
    c, h = drafter.config, drafter.config.head
    layer = qwen3_config(c, c.num_layers)
    layer.architectures = ["Qwen3ForCausalLM"]
    if c.sliding_layers:
        layer.layer_types = ["sliding_attention" if i in c.sliding_layers else "full_attention"
                             for i in range(c.num_layers)]
        layer.use_sliding_window, layer.sliding_window = True, c.sliding_window
    arch = ["Qwen3ForCausalLM"]
    if target is not None or drafter.is_bound:
        model = (target if target is not None else drafter.target).model
        arch = list(getattr(model.config, "architectures", None) or [type(model).__name__])
    cfg = {"architectures": ["DFlash2DraftModel"], "speculators_model_type": NAME, "draft_vocab_size": c.vocab_size,
           "block_size": int(c.block_size), "target_hidden_size": None,
           "aux_hidden_state_layer_ids": [int(j) + AUX_OFFSET for j in c.feature_layers[:-1]],
           "mask_token_id": int(c.mask_token_id), "sliding_window_non_causal": bool(c.sliding_non_causal),
           "sample_from_anchor": False,
           **{theirs: int(getattr(h, ours)) for theirs, ours in HEAD_KEYS.items()},
           "dtype": str(drafter.dtype).removeprefix("torch."), "transformer_layer_config": layer.to_dict(),
           "speculators_config": {
               "algorithm": NAME, "default_proposal_method": "greedy",
               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(c.block_size) - 1,
                                     "accept_tolerance": 0.0, "verifier_accept_k": 1}],
               "verifier": {"name_or_path": rec["name"], "architectures": arch}}}
    (directory / CONFIG_NAME).write_text(json.dumps(cfg, indent=2, sort_keys=True))
    save_weights({_theirs(k): v for k, v in drafter.state_dict().items()}, directory, NAME)
    write_sidecar(directory, NAME, drafter, rec)
    return directory


def _windows(layer: dict) -> tuple[dict, list[int], int | None]:
    """The draft layers' config without its window keys, the windowed layers and W (refusing other layer types)."""
    layer = dict(layer)
    types = layer.pop("layer_types", None) or []
    layer.pop("use_sliding_window", None)
    window = layer.pop("sliding_window", None)
    kinds = ("full_attention", "sliding_attention")
    if any(t not in kinds for t in types):
        refuse("transformer_layer_config.layer_types", types, f"the draft layers here are {' or '.join(kinds)}")
    if types and len(types) != layer.get("num_hidden_layers"):
        refuse("transformer_layer_config.layer_types", types, "one type per draft layer (num_hidden_layers)")
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        refuse("transformer_layer_config.sliding_window", window, "a positive integer or null")
    return layer, sliding, (window if sliding else None)


def import_dflash2(directory: Path, cfg: dict, map_location="cpu"):
    layer, sliding, window = _windows(cfg.get("transformer_layer_config") or {})
    fields = qwen3_fields(layer, "transformer_layer_config.")
    if cfg.get("sample_from_anchor", False):
        refuse("sample_from_anchor", cfg["sample_from_anchor"], "the anchor predicts nothing here (block position "
               "k >= 1 predicts x_{a+k}, B-1 drafted tokens); export with sample_from_anchor false")
    aux = check_block_layout(cfg, fields)
    defaults = DFlash2HeadConfig()
    head = {}
    for theirs, ours in HEAD_KEYS.items():
        value = cfg.get(theirs, getattr(defaults, ours))
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            refuse(theirs, value, "a positive integer")
        head[ours] = value
    if head["top_k"] > fields["vocab_size"]:
        refuse("selector_top_k", head["top_k"], f"at most the vocabulary ({fields['vocab_size']})")
    num_layers = _target_layers(directory, cfg)
    mask = cfg.get("mask_token_id")
    fields.update(block_size=int(cfg.get("block_size", 8)),
                  feature_layers=[int(j) - AUX_OFFSET for j in aux] + [num_layers - 1],
                  mask_token_id=int(mask) if mask is not None else fields["vocab_size"] - 1,
                  head=DFlash2HeadConfig(**head), sliding_layers=sliding, sliding_window=window,
                  sliding_non_causal=bool(cfg.get("sliding_window_non_causal", True)))
    fields["target_fingerprint"] = foreign_fingerprint(directory, fields["hidden_size"], fields["vocab_size"],
                                                       mask, num_layers)
    config = build_config(DFlash2Config, fields)
    tensors = {_ours(k): v for k, v in load_weights(directory).items() if k not in IGNORED}
    drafter = build_drafter(config)
    load_into(drafter, tensors, directory, map_location)
    return drafter


__all__ = ["NAME", "KINDS", "detect", "export", "import_dflash2"]
